"""Bench suite `vlm`: Qwen3-VL in this codebase, against transformers and against its own text path, in one run.

    python -m launch.bench --suite=vlm [--opt d=128 --opt depth=4 --opt width=1280 --opt height=720 --opt turns=6]

* `hf_parity_max`: the largest |logit difference| between our Qwen3VL and transformers'
  Qwen3VLForConditionalGeneration on the same tiny random weights and a sequence with two images (fp32);
* `image_tokens_per_s`: merged image tokens per second of the vision tower (jitted, fp32, CPU) on a screenshot of
  `width` x `height` resized as Qwen3-VL's processor does; `text_tokens_per_s`: the text model's forward at the
  same width over as many tokens, the peer in the same run; `image_vs_text` their ratio;
* `tree_vs_flat_tokens`: a group of screenshot-driven rollouts (`group` rollouts x `turns` calls, a screenshot
  per turn, the first one shared by the group): tokens of the flat calls over tokens of the image-aware tree;
  `tower_images_tree` vs `tower_images_flat`: vision tower runs (distinct images of the tree vs every image of
  every call).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from research.capture import CallRecord, RolloutResult
from research.models import image_processor as ip
from research.models import mrope
from research.models.attention_ops import segment_subtree_end
from research.models.config import ModelConfig
from research.models.qwen3 import Qwen3
from research.models.qwen3 import logits as lm_logits
from research.models.qwen3_vl import Qwen3VL, configs_from_hf, params_from_state
from research.models.vision import VisionConfig, VisionTower
from research.trees.builder import build_tree


def _hf_parity() -> float:
    import torch
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLForConditionalGeneration

    vision = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=32, num_position_embeddings=36, deepstack_visual_indexes=[0])
    text = dict(model_type="qwen3_vl_text", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                rope_parameters={"rope_type": "default", "rope_theta": 5e5, "mrope_section": [2, 3, 3]})
    cfg = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=60, vision_start_token_id=61,
                        vision_end_token_id=62)
    torch.manual_seed(0)
    m = Qwen3VLForConditionalGeneration(cfg).float().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    tcfg, vcfg, image_id = configs_from_hf(cfg.to_dict(), dtype="float32")
    params = params_from_state(tcfg, vcfg, {k: v.detach().numpy() for k, v in m.state_dict().items()}.__getitem__)
    grids = [(1, 4, 6), (1, 8, 4)]
    types = [0] * 4 + [1] * 6 + [0] * 3 + [1] * 8 + [0] * 3
    ids = np.where(np.asarray(types) == 1, image_id, np.arange(len(types)) % 50)[None].astype(np.int32)
    px = np.random.default_rng(1).normal(size=(sum(t * h * w for t, h, w in grids), vcfg.patch_dim)).astype(np.float32)
    pos, _ = mrope.rope_index(types, grids, merge=2)
    seg = jnp.ones_like(ids)
    hidden = Qwen3VL(tcfg, vcfg, image_id).apply({"params": params}, jnp.asarray(ids), jnp.asarray(pos[:, None]), seg,
                                                 segment_subtree_end(seg), pixels_NxP=px,
                                                 grid=mrope.vision_grid(grids, merge=2, side=vcfg.side))
    ours = np.asarray(lm_logits(params["language_model"], tcfg, hidden))
    with torch.no_grad():
        theirs = m(input_ids=torch.from_numpy(ids.astype(np.int64)), pixel_values=torch.from_numpy(px),
                   image_grid_thw=torch.tensor(grids), mm_token_type_ids=torch.tensor([types])).logits.numpy()
    return float(np.abs(ours - theirs).max())


def _timed(fn, iters: int) -> float:
    jax.block_until_ready(fn())  # compile
    t0 = time.perf_counter()
    for _ in range(iters):
        jax.block_until_ready(fn())
    return (time.perf_counter() - t0) / iters


def _throughput(d: int, depth: int, width: int, height: int, iters: int) -> dict:
    vision = VisionConfig(depth=depth, hidden_size=d, intermediate_size=4 * d, num_heads=max(1, d // 64),
                          patch_size=16, out_hidden_size=d, num_position_embeddings=2304, deepstack_indexes=())
    h, w = ip.target_size(height, width, ip.ImageProcessorConfig())
    grid = [(1, h // 16, w // 16)]
    g = mrope.vision_grid(grid, merge=2, side=vision.side)
    tower = VisionTower(vision)
    px = np.zeros((g.num_patches, vision.patch_dim), np.float32)
    vp = tower.init(jax.random.key(0), px, g)
    tower_fn = jax.jit(tower.apply)
    s_img = _timed(lambda: tower_fn(vp, px, g), iters)
    merged = g.num_patches // 4
    text = ModelConfig(vocab_size=1024, hidden_size=d, intermediate_size=4 * d, num_layers=depth,
                       num_heads=max(1, d // 64), num_kv_heads=max(1, d // 64), head_dim=64, dtype="float32")
    toks = jnp.zeros((1, merged), jnp.int32)
    pos = jnp.arange(merged)[None]
    seg = jnp.ones_like(toks)
    model = Qwen3(text)
    tp = model.init(jax.random.key(0), toks, pos, seg, segment_subtree_end(seg))
    text_fn = jax.jit(model.apply)
    s_txt = _timed(lambda: text_fn(tp, toks, pos, seg, segment_subtree_end(seg)), iters)
    return {"image_px": [w, h], "image_patches": g.num_patches, "image_tokens": merged,
            "image_tokens_per_s": round(merged / s_img, 1), "text_tokens_per_s": round(merged / s_txt, 1),
            "image_vs_text": round(s_txt / s_img, 3)}


def _screenshot_group(group: int, turns: int, image_tokens: int, text: int) -> tuple[int, int, int, int]:
    """(flat tokens, tree tokens, distinct images, image occurrences) of synthetic screenshot rollouts."""
    pad, rng = 60, np.random.default_rng(0)
    side = int(np.sqrt(image_tokens))
    grid = f"1x{2 * side}x{2 * side}"
    calls, results = [], []
    for r in range(group):
        prompt, names = list(rng.integers(0, 50, text)), []
        for k in range(turns):
            name = "0" * 64 if k == 0 else f"{r:02d}{k:02d}".ljust(64, "f")  # the task's first screen is shared
            prompt += [61] + [pad] * (side * side) + [62]
            names.append(f"{name}:{grid}")
            comp = list(rng.integers(0, 50, text))
            calls.append(CallRecord(rollout_id=f"r{r}", session_id=f"r{r}", group_id="g", harness="h", call_index=k,
                                    prompt_ids=list(prompt), completion_ids=comp, logprobs=[-1.0] * len(comp),
                                    weight_version=0, finish_reason="stop", call_id=f"r{r}c{k}",
                                    meta={"images": list(names)}))
            prompt += comp + list(rng.integers(0, 50, 4))
        results.append(RolloutResult(rollout_id=f"r{r}", group_id="g", harness="h", status="ok", reward=1.0))
    tree = build_tree(calls, results, image_pad_id=pad)
    flat = sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    return flat, tree.num_nodes, len(tree.images), sum(len(c.meta["images"]) for c in calls)


def run(d: int = 128, depth: int = 4, width: int = 1280, height: int = 720, iters: int = 3, group: int = 8,
        turns: int = 6, text_tokens: int = 40) -> dict:
    out = {"hf_parity_max": _hf_parity(), **_throughput(d, depth, width, height, iters)}
    side = int(np.sqrt(out["image_tokens"]))
    flat, tree, distinct, occurrences = _screenshot_group(group, turns, side * side, text_tokens)
    out.update(tree_vs_flat_tokens=round(flat / tree, 2), flat_tokens=flat, tree_tokens=tree,
               tower_images_tree=distinct, tower_images_flat=occurrences)
    return out
