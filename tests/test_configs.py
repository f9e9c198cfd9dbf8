"""Configs build, hold the real Qwen3-30B-A3B dims, and the parameter counts from the abstract tree are right."""

import json

import pytest

from configs import qwen3_30b_a3b, tiny
from research.models import ModelConfig, tiny_dense, tiny_moe
from research.models.params import abstract_params, count_model_params, count_params
from research.models.tokenizer import PACKAGED_QWEN3
from research.train.state import model_config

HF_30B = PACKAGED_QWEN3.parent / "qwen3_30b_a3b_config.json"  # the real Qwen/Qwen3-30B-A3B config.json

DIMS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
        "rms_norm_eps", "rope_theta", "tie_word_embeddings", "num_experts", "num_experts_per_tok",
        "moe_intermediate_size", "norm_topk_prob", "mlp_only_layers", "decoder_sparse_step")


@pytest.fixture(scope="module")
def cfg_30b() -> ModelConfig:
    return model_config(qwen3_30b_a3b.get_config("gpu"))


def test_30b_dims_match_the_real_hf_config(cfg_30b):
    hf = ModelConfig.from_hf_config(json.loads(HF_30B.read_text()))
    for field in DIMS:
        assert getattr(cfg_30b, field) == getattr(hf, field), field
    assert cfg_30b.dtype == "bfloat16" and cfg_30b.param_dtype == "float32" and cfg_30b.expert_parallel


def test_30b_param_counts(cfg_30b):
    pc = count_model_params(cfg_30b)
    # Exact integers (hand-derivable: 48 x 623,120,640 per layer + 2 x 151,936 x 2048 + 2048).
    assert pc.total == 30_532_122_624
    assert pc.active == 3_353_032_704
    assert pc.non_embedding == 29_909_792_768
    # The model card's rounded figures: 30.5B total, 29.9B non-embedding (+-1%). Its "3.3B activated" is
    # 3.353B truncated: we hold active to +-2% of 3.3B (1.6% above) and exactly to the integer above.
    assert abs(pc.total / 30.5e9 - 1) < 0.01
    assert abs(pc.non_embedding / 29.9e9 - 1) < 0.01
    assert abs(pc.active / 3.3e9 - 1) < 0.02 and round(pc.active / 1e9, 2) == 3.35
    # The tree count agrees with the closed-form count in ModelConfig.
    assert (pc.total, pc.active) == cfg_30b.param_counts()


@pytest.mark.parametrize("kind", ["moe", "dense"])
def test_counts_equal_transformers(kind, tmp_path):
    """Total parameters of our tree == the transformers model built from the same config (meta device)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = tiny_moe() if kind == "moe" else tiny_dense()
    hf = cfg.to_hf_config()
    cls_cfg = transformers.Qwen3MoeConfig if kind == "moe" else transformers.Qwen3Config
    cls = transformers.Qwen3MoeForCausalLM if kind == "moe" else transformers.Qwen3ForCausalLM
    with torch.device("meta"):
        model = cls(cls_cfg(**{k: v for k, v in hf.items() if k != "architectures"}))
    ours = count_model_params(cfg)
    assert ours.total == sum(p.numel() for p in model.parameters())
    if kind == "dense":
        assert ours.active == ours.total and ours.experts == 0
    else:
        expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.num_layers
        assert ours.experts == expert * cfg.num_experts
        assert ours.total - ours.active == expert * (cfg.num_experts - cfg.num_experts_per_tok)


def test_count_params_rejects_inconsistent_experts():
    with pytest.raises(ValueError, match="per-expert leaf"):
        count_params(abstract_params(tiny_moe()), num_experts=0, experts_per_token=0)


def test_configs_build_and_reject_bad_args():
    t = tiny.get_config()
    assert model_config(t) == tiny_moe() and t.optim.schedule == "cosine"
    assert model_config(tiny.get_config("dense")) == tiny_dense()
    for mod, bad in ((tiny, "huge"), (qwen3_30b_a3b, "cpu")):
        with pytest.raises(ValueError, match=f"arg '{bad}'"):
            mod.get_config(bad)
    tpu = qwen3_30b_a3b.get_config("tpu")
    assert dict(tpu.mesh) == dict(data=1, fsdp=2, expert=8, tensor=1)
    # The config's model section is exactly ModelConfig's fields (overridable from the command line).
    t.model.num_layers = 3
    assert model_config(t).num_layers == 3
    t.model.bogus = 1
    with pytest.raises(ValueError, match="config.model"):
        model_config(t)


def test_30b_config_json_roundtrip(cfg_30b, tmp_path):
    """to_hf_config of our 30B config -> from_hf_config gives the same dims (export path agrees)."""
    (tmp_path / "config.json").write_text(json.dumps(cfg_30b.to_hf_config()))
    back = ModelConfig.from_hf_config(tmp_path)
    assert all(getattr(back, f) == getattr(cfg_30b, f) for f in DIMS)
