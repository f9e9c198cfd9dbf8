"""HF interop: parity with transformers, both expert layouts, sharded export round trip, precise errors."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import save_file as torch_save_file
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from research.models import ConfigError, ModelConfig, Qwen3, logits
from research.models.hf_io import CheckpointError, load_hf, save_hf

TOKENS = np.array([[3, 17, 99, 5, 64, 2, 8, 120, 33, 7, 1, 0], [45, 6, 6, 6, 90, 11, 23, 58, 77, 101, 4, 9]])
_ROPE = {"rope_type": "default", "rope_theta": 1e6}


def _hf_dense():
    c = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_parameters=_ROPE)
    return Qwen3ForCausalLM(c)


def _hf_moe():
    c = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
                       rope_parameters=_ROPE)
    return Qwen3MoeForCausalLM(c)


@pytest.fixture(scope="module", params=["dense", "moe"])
def hf_dir(request, tmp_path_factory):
    torch.manual_seed(0)
    model = (_hf_dense if request.param == "dense" else _hf_moe)().float().eval()
    with torch.no_grad():  # HF inits norms to 1 and the router to 0: randomise so parity is meaningful
        for name, prm in model.named_parameters():
            if "norm" in name:
                prm.add_(0.1 * torch.randn_like(prm))
            if name.endswith("mlp.gate.weight"):
                prm.normal_(0, 0.5)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    with torch.no_grad():
        ref = model(torch.tensor(TOKENS)).logits.numpy()
    return path, model, ref


def _our_logits(params, cfg):
    B, T = TOKENS.shape
    fwd = jax.jit(lambda p, t: logits(p, cfg, Qwen3(cfg).apply(
        {"params": p}, t, jnp.broadcast_to(jnp.arange(T), (B, T)), jnp.ones((B, T), jnp.int32),
        jnp.full((B, T), T - 1))))
    return np.asarray(fwd(params, jnp.asarray(TOKENS)))


def test_parity_with_transformers(hf_dir):
    path, _, ref = hf_dir
    params, cfg = load_hf(path, ModelConfig.from_hf_config(path, dtype="float32", moe_impl="blocked"))
    diff = np.abs(_our_logits(params, cfg) - ref).max()
    assert diff <= 1e-4, diff
    print(f"max |logit diff| vs transformers: {diff:.2e}")


@pytest.mark.parametrize("hf_dir", ["moe"], indirect=True)  # (the dense model has no experts)
def test_fused_expert_layout_loads_the_same(hf_dir, tmp_path):
    path, model, ref = hf_dir
    assert isinstance(model, Qwen3MoeForCausalLM)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd), "installed transformers no longer fuses experts"
    torch_save_file(sd, str(tmp_path / "model.safetensors"))
    shutil.copy(path / "config.json", tmp_path / "config.json")
    params, cfg = load_hf(tmp_path, ModelConfig.from_hf_config(tmp_path, dtype="float32"))
    np.testing.assert_allclose(_our_logits(params, cfg), ref, atol=1e-4)


def test_export_sharded_then_transformers_loads_same_logits(hf_dir, tmp_path):
    path, _, ref = hf_dir
    params, cfg = load_hf(path, ModelConfig.from_hf_config(path, dtype="float32"))
    out = save_hf(params, cfg, tmp_path / "export", max_shard_bytes=64 << 10)
    assert (out / "model.safetensors.index.json").exists() and len(list(out.glob("model-*.safetensors"))) > 1
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        np.testing.assert_allclose(theirs(torch.tensor(TOKENS)).logits.numpy(), ref, atol=1e-5)
    again, _ = load_hf(out)  # our own sharded-index load path, config from the exported config.json
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_load_straight_into_shards(hf_dir):
    from research.models.sharding import make_mesh, param_shardings

    path, _, _ = hf_dir
    cfg = ModelConfig.from_hf_config(path, dtype="float32")
    mesh = make_mesh(data=1, fsdp=2, expert=2, tensor=2)
    sharded, _ = load_hf(path, cfg, shardings=param_shardings(cfg, mesh))
    plain, _ = load_hf(path, cfg)
    q = sharded["layers_0"]["attn"]["q_proj"]
    assert q.sharding.mesh.shape == mesh.shape and len(q.addressable_shards) == 8
    assert q.addressable_shards[0].data.shape == (q.shape[0], q.shape[1] // 2, q.shape[2] // 2, q.shape[3])
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bf16_checkpoint_loads_into_fp32(hf_dir, tmp_path):
    path, _, _ = hf_dir
    params, cfg = load_hf(path, ModelConfig.from_hf_config(path, dtype="float32"))
    save_hf(params, cfg, tmp_path, dtype="bfloat16")
    p16, _ = load_hf(tmp_path, cfg)
    leaf = jax.tree.leaves(p16)[0]
    assert leaf.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(leaf), np.asarray(jax.tree.leaves(params)[0]), rtol=1e-2, atol=1e-3)


def _tamper(src, dst, fn):
    shutil.copytree(src, dst)
    from safetensors.numpy import load_file

    tensors = load_file(str(dst / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_bad_checkpoints_name_file_and_key(hf_dir, tmp_path):
    path, _, _ = hf_dir
    key = "model.layers.1.self_attn.k_proj.weight"
    bad = _tamper(path, tmp_path / "missing", lambda t: t.pop(key))
    with pytest.raises(CheckpointError, match=rf"model.safetensors: missing tensor '{key}'"):
        load_hf(bad)
    bad = _tamper(path, tmp_path / "extra", lambda t: t.update({"model.layers.9.foo.weight": np.zeros(3, np.float32)}))
    with pytest.raises(CheckpointError, match=r"extra/model.safetensors: unexpected tensor .model.layers.9.foo"):
        load_hf(bad)
    bad = _tamper(path, tmp_path / "shape", lambda t: t.update({key: t[key][:-1]}))
    with pytest.raises(CheckpointError, match=rf"shape/model.safetensors: tensor '{key}' has shape \[31, 64\]"):
        load_hf(bad)


def test_bad_configs_name_file_and_key(tmp_path):
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 8}))
    with pytest.raises(ConfigError, match=r"llama.json: key 'model_type' is 'llama'"):
        ModelConfig.from_hf_config(llama)
    cfg = _hf_moe().config.to_dict()
    cfg.pop("moe_intermediate_size")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"config.json: missing required key 'moe_intermediate_size'"):
        ModelConfig.from_hf_config(tmp_path)


def test_real_qwen3_30b_a3b_config():
    from research.models.tokenizer import PACKAGED_QWEN3

    cfg = ModelConfig.from_hf_config(json.loads((PACKAGED_QWEN3.parent / "qwen3_30b_a3b_config.json").read_text()))
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.rope_theta, cfg.norm_topk_prob) == (128, 8, 1e6, True)
    total, active = cfg.param_counts()
    assert abs(total / 30.53e9 - 1) < 0.01 and abs(active / 3.35e9 - 1) < 0.01, (total, active)
    assert cfg.layer_runs() == ((True, 0, 48),)
