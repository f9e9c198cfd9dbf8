"""Qwen3-VL's vision tower and multimodal positions against `transformers`' qwen3_vl on tiny random configs.

The tower (research/models/qwen3_vl.py) loads an HF Qwen3VLVisionModel's state and must give the same merged image
tokens and DeepStack features (<= 1e-5) and the same gradient of a loss through them; the host-side grids and the
text model's 3-D RoPE (research/models/mrope.py) must equal HF's get_rope_index and rotary embedding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models import mrope
from research.models.vision import VisionConfig, VisionTower, hf_leaves, params_from_state

torch = pytest.importorskip("torch")
qvl = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
from transformers.models.qwen3_vl.configuration_qwen3_vl import (  # noqa: E402
    Qwen3VLConfig,
    Qwen3VLTextConfig,
    Qwen3VLVisionConfig,
)

HF_VISION = dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, spatial_merge_size=2,
                 temporal_patch_size=2, out_hidden_size=32, num_position_embeddings=36, deepstack_visual_indexes=[0, 2])
# two images and a two-frame clip; grids not square and not the learned table's 6 x 6, so the resampling matters
GRIDS = [(1, 4, 6), (1, 8, 4), (2, 2, 2)]


def _hf_tower(seed=0):
    torch.manual_seed(seed)
    m = qvl.Qwen3VLVisionModel(Qwen3VLVisionConfig(**HF_VISION)).float().eval()
    with torch.no_grad():  # HF inits biases and norms to constants: randomise every tensor so each one is tested
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return m


def _ours(m):
    cfg = VisionConfig.from_hf(HF_VISION)
    state = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    return cfg, params_from_state(cfg, state.__getitem__, prefix="")


def _pixels(cfg, seed=1):
    n = sum(t * h * w for t, h, w in GRIDS)
    return np.random.default_rng(seed).normal(size=(n, cfg.patch_dim)).astype(np.float32)


def test_vision_config_runs_and_leaves_cover_the_hf_state():
    cfg = VisionConfig.from_hf(HF_VISION)
    assert cfg.block_runs() == [(0, 1), (1, 2), (3, 1)]  # runs end after blocks 0 and 2 (the DeepStack taps)
    m = _hf_tower()
    keys = {leaf.key(*([0] * len(leaf.stack))) for leaf in hf_leaves(cfg, prefix="") if not leaf.stack}
    keys |= {leaf.key(j) for leaf in hf_leaves(cfg, prefix="") if leaf.stack for j in range(leaf.stack[0])}
    assert keys == set(m.state_dict())
    with pytest.raises(ValueError, match="not a square"):
        VisionConfig(num_position_embeddings=30)
    with pytest.raises(ValueError, match="multiples of merge"):
        mrope.vision_grid([(1, 3, 4)], merge=2, side=6)


def test_vision_tower_matches_transformers_outputs_and_gradient():
    m = _hf_tower()
    cfg, params = _ours(m)
    px = _pixels(cfg)
    grid = mrope.vision_grid(GRIDS, merge=cfg.spatial_merge_size, side=cfg.side)
    assert grid.merged_per_image == (6, 8, 2)
    tower = VisionTower(cfg)
    merged, deep = jax.jit(tower.apply)({"params": params}, px, grid)
    out = m(torch.from_numpy(px), grid_thw=torch.tensor(GRIDS))
    np.testing.assert_allclose(np.asarray(merged), out.pooler_output.detach().numpy(), atol=1e-5, rtol=1e-5)
    assert len(deep) == len(out.deepstack_features) == 2
    for ours, theirs in zip(deep, out.deepstack_features, strict=True):
        np.testing.assert_allclose(np.asarray(ours), theirs.detach().numpy(), atol=1e-5, rtol=1e-5)

    # the gradient of one loss through the merged tokens and the DeepStack features, w.r.t. two weights
    rng = np.random.default_rng(2)
    r = [rng.normal(size=merged.shape).astype(np.float32) for _ in range(3)]

    def loss(p):
        mg, dp = tower.apply({"params": p}, px, grid)
        return (mg * r[0]).sum() + (dp[0] * r[1]).sum() + (dp[1] * r[2]).sum()

    g = jax.grad(loss)(params)
    hf = m(torch.from_numpy(px), grid_thw=torch.tensor(GRIDS))
    t_loss = sum((x * torch.from_numpy(y)).sum() for x, y in
                 zip([hf.pooler_output, *hf.deepstack_features], r, strict=True))
    t_loss.backward()
    np.testing.assert_allclose(np.asarray(g["blocks_1"]["qkv_kernel"][1]), m.blocks[2].attn.qkv.weight.grad.T.numpy(),
                               atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(g["pos_embed"]), m.pos_embed.weight.grad.numpy(), atol=1e-4, rtol=1e-4)


def test_vision_tower_attends_within_a_frame_only():
    """Changing one image's pixels leaves every other image's tokens as they were."""
    m = _hf_tower()
    cfg, params = _ours(m)
    px = _pixels(cfg)
    grid = mrope.vision_grid(GRIDS, merge=cfg.spatial_merge_size, side=cfg.side)
    a, _ = VisionTower(cfg).apply({"params": params}, px, grid)
    px2 = px.copy()
    px2[:24] += 1.0  # the first image's 24 patches
    b, _ = VisionTower(cfg).apply({"params": params}, px2, grid)
    assert not np.allclose(a[:6], b[:6]) and np.array_equal(np.asarray(a[6:]), np.asarray(b[6:]))


def _hf_vl_model():
    text = Qwen3VLTextConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": [2, 3, 3],
                                              "mrope_interleaved": True})
    cfg = Qwen3VLConfig(text_config=text.to_dict(), vision_config=HF_VISION, image_token_id=60,
                        vision_start_token_id=61, vision_end_token_id=62)
    return qvl.Qwen3VLModel(cfg).eval(), cfg


def test_rope_index_matches_transformers():
    model, cfg = _hf_vl_model()
    # text, image 0 (4x6 patches -> 6 tokens), text, image 1 (8x4 -> 8 tokens), text
    types = [0] * 5 + [1] * 6 + [0] * 3 + [1] * 8 + [0] * 4
    ids = torch.tensor([[60 if t else 7 for t in types]])
    theirs, delta = model.get_rope_index(ids, torch.tensor([types]), image_grid_thw=torch.tensor(GRIDS[:2]))
    ours, our_delta = mrope.rope_index(types, GRIDS[:2], merge=2)
    np.testing.assert_array_equal(ours, theirs[:, 0].numpy())
    assert our_delta == int(delta[0, 0])
    with pytest.raises(ValueError, match="beyond"):
        mrope.rope_index(types, GRIDS[:1], merge=2)


def test_mrope_matches_transformers_rotary():
    model, cfg = _hf_vl_model()
    types = [0] * 5 + [1] * 6 + [0] * 3 + [1] * 8 + [0] * 4
    pos, _ = mrope.rope_index(types, GRIDS[:2], merge=2)
    rot = model.language_model.rotary_emb
    x = torch.randn(1, len(types), 16)
    cos, sin = rot(x, torch.from_numpy(pos[:, None].astype(np.int64)))
    q = torch.randn(1, 4, len(types), 16)
    k = torch.randn(1, 2, len(types), 16)
    q_hf, k_hf = qvl.apply_rotary_pos_emb(q, k, cos, sin)
    ang = mrope.mrope_angles(jnp.asarray(pos[:, None]), 16, 5e5, (2, 3, 3))
    q_ours = mrope.rotate(jnp.asarray(q.numpy().transpose(0, 2, 1, 3)), ang)
    k_ours = mrope.rotate(jnp.asarray(k.numpy().transpose(0, 2, 1, 3)), ang)
    np.testing.assert_allclose(np.asarray(q_ours), q_hf.numpy().transpose(0, 2, 1, 3), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(k_ours), k_hf.numpy().transpose(0, 2, 1, 3), atol=1e-5, rtol=1e-5)
    # text-only positions reduce to the text model's 1-D RoPE
    from research.models.qwen3 import rope

    t = jnp.arange(10)[None]
    x1 = jnp.asarray(np.random.default_rng(0).normal(size=(1, 10, 2, 16)).astype(np.float32))
    np.testing.assert_allclose(mrope.rotate(x1, mrope.mrope_angles(jnp.stack([t] * 3), 16, 5e5, (2, 3, 3))),
                               rope(x1, t, 5e5), atol=1e-6)


def _hf_full(seed=0, moe=False):
    if moe:
        from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe as qmoe
        from transformers.models.qwen3_vl_moe.configuration_qwen3_vl_moe import (
            Qwen3VLMoeConfig,
            Qwen3VLMoeTextConfig,
        )

        text = Qwen3VLMoeTextConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                                    num_experts_per_tok=2, moe_intermediate_size=24, mlp_only_layers=[1],
                                    rope_parameters={"rope_type": "default", "rope_theta": 5e5,
                                                     "mrope_section": [2, 3, 3], "mrope_interleaved": True})
        cfg = Qwen3VLMoeConfig(text_config=text.to_dict(), vision_config=HF_VISION, image_token_id=60,
                               vision_start_token_id=61, vision_end_token_id=62)
        cls = qmoe.Qwen3VLMoeForConditionalGeneration
    else:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLForConditionalGeneration as cls

        _, cfg = _hf_vl_model()
    torch.manual_seed(seed)
    m = cls(cfg).float().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return m, cfg


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_qwen3_vl_matches_transformers_logits_and_loss_gradient(moe):
    """The whole model (Qwen3-VL, and Qwen3-VL-MoE with a dense layer among sparse ones), two images in one
    sequence: logits <= 1e-5 and the gradient of the next-token loss w.r.t. a vision weight, a DeepStack merger's,
    and a text weight after the DeepStack layers <= 1e-4."""
    from research.models.attention_ops import segment_subtree_end
    from research.models.qwen3 import logits as lm_logits
    from research.models.qwen3_vl import Qwen3VL, configs_from_hf, hf_leaves, params_from_state

    m, cfg = _hf_full(moe=moe)
    text, vision, image_id = configs_from_hf(cfg.to_dict(), dtype="float32")
    assert text.mrope_section == (2, 3, 3) and text.deepstack_layers == 2
    # the DeepStack layers stay in their run's scan: runs split only where the layer kind changes
    assert [(f, n) for _, f, n in text.layer_runs()] == ([(0, 1), (1, 1), (2, 1)] if moe else [(0, 2)])
    assert text.is_moe == moe and (not moe or (text.norm_topk_prob and not text.layer_is_moe(1)))
    state = {k: v.detach().numpy() for k, v in m.state_dict().items()}
    assert {leaf.key(*idx) for leaf in hf_leaves(text, vision)
            for idx in np.ndindex(*leaf.stack)} == set(state)
    params = params_from_state(text, vision, state.__getitem__)
    types = [0] * 5 + [1] * 6 + [0] * 3 + [1] * 8 + [0] * 4
    rng = np.random.default_rng(3)
    ids = np.where(np.array(types) == 1, image_id, rng.integers(0, 59, len(types)))[None].astype(np.int32)
    px = _pixels(vision)[: sum(t * h * w for t, h, w in GRIDS[:2])]
    grid = mrope.vision_grid(GRIDS[:2], merge=vision.spatial_merge_size, side=vision.side)
    pos, _ = mrope.rope_index(types, GRIDS[:2], merge=2)
    seg = jnp.ones_like(ids)
    model = Qwen3VL(text, vision, image_id)

    def forward(p):
        hidden = model.apply({"params": p}, jnp.asarray(ids), jnp.asarray(pos[:, None]), seg,
                             segment_subtree_end(seg), pixels_NxP=px, grid=grid)
        return lm_logits(p["language_model"], text, hidden)

    ours = jax.jit(forward)(params)
    hf_kw = dict(input_ids=torch.from_numpy(ids.astype(np.int64)), pixel_values=torch.from_numpy(px),
                 image_grid_thw=torch.tensor(GRIDS[:2]), mm_token_type_ids=torch.tensor([types]))
    theirs = m(**hf_kw).logits
    np.testing.assert_allclose(np.asarray(ours), theirs.detach().numpy(), atol=1e-5, rtol=1e-5)

    def loss(p):
        lg = forward(p)[0, :-1]
        return -jnp.take_along_axis(jax.nn.log_softmax(lg), jnp.asarray(ids[0, 1:, None]), -1).sum()

    g = jax.grad(loss)(params)
    t_logits = m(**hf_kw).logits[0, :-1]
    torch.nn.functional.cross_entropy(t_logits, torch.from_numpy(ids[0, 1:].astype(np.int64)),
                                      reduction="sum").backward()
    vis, lm = m.model.visual, m.model.language_model
    pairs = [(g["visual"]["patch_embed_kernel"], vis.patch_embed.proj.weight.grad.reshape(32, -1).T),
             (g["visual"]["deepstack_merger_1"]["fc2_kernel"], vis.deepstack_merger_list[1].linear_fc2.weight.grad.T),
             (g["language_model"]["layers_1"]["mlp"]["up_proj"][0] if moe else
              g["language_model"]["layers_0"]["mlp"]["up_proj"][1], lm.layers[1].mlp.up_proj.weight.grad.T)]
    if moe:
        pairs.append((g["language_model"]["layers_2"]["moe"]["wo"][0],
                      lm.layers[2].mlp.experts.down_proj.grad.transpose(1, 2)))
    for ours_g, theirs_g in pairs:
        np.testing.assert_allclose(np.asarray(ours_g), theirs_g.numpy(), atol=1e-4, rtol=1e-4)


def test_text_only_sequences_run_through_qwen3_vl_as_through_qwen3():
    """No pixels: the VL model is its text model with 3-D positions that are all equal (= 1-D RoPE)."""
    from research.models.attention_ops import segment_subtree_end
    from research.models.qwen3 import Qwen3
    from research.models.qwen3_vl import Qwen3VL, configs_from_hf, params_from_state

    m, cfg = _hf_full()
    text, vision, image_id = configs_from_hf(cfg.to_dict(), dtype="float32")
    params = params_from_state(text, vision, {k: v.detach().numpy() for k, v in m.state_dict().items()}.__getitem__)
    ids = jnp.asarray(np.random.default_rng(4).integers(0, 59, (2, 12)), jnp.int32)
    seg = jnp.ones_like(ids)
    pos = jnp.broadcast_to(jnp.arange(12), (2, 12))
    vl = Qwen3VL(text, vision, image_id).apply({"params": params}, ids, jnp.stack([pos] * 3), seg,
                                               segment_subtree_end(seg))
    plain = Qwen3(text.replace(mrope_section=(), deepstack_layers=0)).apply(
        {"params": params["language_model"]}, ids, pos, seg, segment_subtree_end(seg))
    np.testing.assert_allclose(np.asarray(vl), np.asarray(plain), atol=1e-5, rtol=1e-5)


def test_sharded_qwen3_vl_equals_single_device():
    """Both towers' params shard by the logical rules on 8 fake CPU devices (data 2 x fsdp 2 x tensor 2); the loss
    and its gradients equal the single-device ones."""
    from jax.sharding import PartitionSpec as P

    from research.models.attention_ops import segment_subtree_end
    from research.models.qwen3 import logits as lm_logits
    from research.models.qwen3_vl import Qwen3VL, configs_from_hf, init_sharded
    from research.models.sharding import make_mesh, use_mesh

    _, cfg = _hf_vl_model()
    text, vision, image_id = configs_from_hf(cfg.to_dict(), dtype="float32")
    model = Qwen3VL(text, vision, image_id)
    mesh = make_mesh(data=2, fsdp=2, expert=1, tensor=2)
    pN = init_sharded(model, mesh, jax.random.key(0))
    assert pN["visual"]["blocks_0"]["qkv_kernel"].sharding.spec == P(None, "fsdp", "tensor")
    assert pN["visual"]["merger"]["fc2_kernel"].sharding.spec == P("tensor", "fsdp")
    assert pN["language_model"]["layers_0"]["attn"]["q_proj"].sharding.spec == P(None, "fsdp", "tensor", None)
    p1 = jax.tree.map(lambda a: jnp.asarray(np.asarray(a)), pN)
    types = [0] * 3 + [1] * 6 + [0] * 2 + [1] * 8 + [0] * 3
    ids = jnp.asarray(np.where(np.array(types) == 1, image_id, 5)[None], jnp.int32)
    px = _pixels(vision)[: sum(t * h * w for t, h, w in GRIDS[:2])]
    grid = mrope.vision_grid(GRIDS[:2], merge=2, side=vision.side)
    pos = jnp.asarray(mrope.rope_index(types, GRIDS[:2], merge=2)[0][:, None])
    seg = jnp.ones_like(ids)

    @jax.jit
    def step(p):
        def loss(p):
            h = model.apply({"params": p}, ids, pos, seg, segment_subtree_end(seg), pixels_NxP=px, grid=grid)
            return jax.nn.logsumexp(lm_logits(p["language_model"], text, h), -1).sum()
        return jax.value_and_grad(loss)(p)

    l1, g1 = step(p1)
    with use_mesh(mesh):
        lN, gN = step(pN)
    np.testing.assert_allclose(float(lN), float(l1), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4), gN, g1)


def test_checkpoint_round_trip_through_transformers(tmp_path):
    """Our params -> save_hf -> transformers from_pretrained gives our logits; its save_pretrained -> load_hf gives
    the same params back."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLForConditionalGeneration

    from research.models.qwen3_vl import configs_from_hf, load_hf, params_from_state, save_hf

    m, cfg = _hf_full(seed=5)
    text, vision, image_id = configs_from_hf(cfg.to_dict(), dtype="float32")
    params = params_from_state(text, vision, {k: v.detach().numpy() for k, v in m.state_dict().items()}.__getitem__)
    save_hf(params, text, vision, image_id, tmp_path / "ours")
    back = Qwen3VLForConditionalGeneration.from_pretrained(tmp_path / "ours").float().eval()
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[k].numpy(), v.numpy(), err_msg=k)
    m.save_pretrained(tmp_path / "theirs")
    loaded, text2, vision2, image_id2 = load_hf(tmp_path / "theirs", dtype="float32")
    assert (text2, vision2, image_id2) == (text, vision, image_id)
    jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_chunked_frame_attention_equals_dense_and_its_gradient():
    """The tower's attention in query chunks (research/models/vision.frame_attention above `attention_chunk`) is
    the dense one, value and gradient, with frames of unequal size and a padding frame."""
    from research.models.vision import frame_attention

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(64, 2, 8)).astype(np.float32)) for _ in range(3))
    frame = jnp.asarray(np.repeat([0, 1, 2], [24, 32, 8]))
    loss = lambda chunk: lambda q, k, v: jnp.sum(jnp.sin(frame_attention(q, k, v, frame, chunk)))  # noqa: E731
    dense, chunked = jax.value_and_grad(loss(64), (0, 1, 2)), jax.value_and_grad(loss(16), (0, 1, 2))
    (a, ga), (b, gb) = dense(q, k, v), chunked(q, k, v)
    np.testing.assert_allclose(float(a), float(b), rtol=1e-6)
    for x, y in zip(ga, gb, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5)
    assert float(jnp.abs(ga[0]).sum()) > 0
