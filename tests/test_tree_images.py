"""Trees of a vision policy's calls (research/trees/builder.py with image_pad_id): calls merge through an image only
if it is the same image; the tree runs the vision tower once per distinct image (here 2 for 3 image occurrences);
tree == flat (the completion tokens' log-probs and the gradient of their sum) with images before and after the
branch point."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.capture import CallRecord, RolloutResult
from research.models import mrope
from research.models.attention_ops import segment_subtree_end
from research.models.config import ModelConfig
from research.models.qwen3 import logits as lm_logits
from research.models.qwen3_vl import Qwen3VL, dummy_inputs
from research.models.vision import VisionConfig
from research.trees.builder import build_tree

PAD, VS, VE = 60, 61, 62
VISION = VisionConfig(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, out_hidden_size=32,
                      num_position_embeddings=16, deepstack_indexes=(0,))
TEXT = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4, num_kv_heads=2,
                   head_dim=16, mrope_section=(2, 3, 3), deepstack_layers=1, dtype="float32", rope_theta=1e4)
GRID = (1, 4, 4)  # 4 placeholder tokens per image


def _image_tokens():
    return [VS] + [PAD] * 4 + [VE]


def _call(rid, k, prompt, completion, names, lp0):
    lps = [lp0 - 0.01 * i for i in range(len(completion))]
    return CallRecord(rollout_id=rid, session_id=rid, group_id="g", harness="h", call_index=k, prompt_ids=prompt,
                      completion_ids=completion, logprobs=lps, weight_version=0, finish_reason="stop",
                      call_id=f"{rid}-{k}", meta={"images": [f"{n}:1x4x4" for n in names]})


@pytest.fixture(scope="module")
def setup():
    rng = np.random.default_rng(0)
    shas = {n: n * 64 for n in "ab"}  # stand-in names (the tree only compares them)
    pixels = {n: rng.normal(size=(16, VISION.patch_dim)).astype(np.float32) for n in "ab"}
    shared = [1, 2, 3] + _image_tokens() + [4, 5]  # both rollouts see image a first
    calls = []
    # the same first answer (same tokens and log-probs: one branch), then a different image of the same size
    for rid, other, lp in (("r1", "b", -1.5), ("r2", "a", -1.7)):  # r2 sees image a a second time
        calls.append(_call(rid, 0, shared, [6, 7], ["a"], -0.5))
        second = shared + [6, 7] + [10] + _image_tokens() + [11]
        calls.append(_call(rid, 1, second, [12, 13, 14], ["a", other], lp))
    for c in calls:
        c.meta["images"] = [f"{shas[n.split(':')[0]]}:1x4x4" for n in c.meta["images"]]
    results = [RolloutResult(rollout_id=r, group_id="g", harness="h", status="ok", reward=v)
               for r, v in (("r1", 1.0), ("r2", 0.0))]
    model = Qwen3VL(TEXT, VISION, PAD)
    args, kw = dummy_inputs(VISION, PAD)
    params = model.init(jax.random.key(1), *args, **kw)["params"]
    return calls, results, model, params, {shas[n]: pixels[n] for n in "ab"}


def test_calls_merge_through_the_same_image_only(setup):
    calls, results, *_ = setup
    tree = build_tree(calls, results, image_pad_id=PAD)
    blind = build_tree(calls, results)  # a text policy's tree: the second images' placeholders look alike
    assert [x.split(":")[0][0] for x in tree.images] == ["a", "b"]  # each distinct image once
    pads = tree.tokens == PAD
    assert pads.sum() == 12 and blind.num_nodes < tree.num_nodes
    # a's rows twice (shared prefix, then r2's second image), b's once
    assert sorted(zip(tree.node_image[pads].tolist(), tree.node_image_row[pads].tolist())) == sorted(
        [(0, r) for r in range(4)] * 2 + [(1, r) for r in range(4)])
    # 3-D positions: the shared image's rows and columns; text after an image resumes at start + max(h, w) / 2
    a = np.flatnonzero(pads & (tree.node_image == 0))[:4]  # the shared prefix's (DFS order: first)
    np.testing.assert_array_equal(tree.mrope_positions[:, a], [[4, 4, 4, 4], [4, 4, 5, 5], [4, 5, 4, 5]])
    assert tree.mrope_positions[0, int(np.flatnonzero(tree.tokens == 4)[0])] == 7
    with pytest.raises(ValueError, match="placeholder tokens"):
        bad = [_call("r1", 0, [1] + _image_tokens(), [2], ["x" * 64, "y" * 64], -0.1)]
        build_tree(bad, results, image_pad_id=PAD)


def _flat_logps(model, params, call, pixels):
    seq = np.asarray(call.prompt_ids + call.completion_ids, np.int32)[None]
    names = [n.split(":")[0] for n in call.meta["images"]]
    px = np.concatenate([pixels[n] for n in names])
    grid = mrope.vision_grid([GRID] * len(names), merge=2, side=VISION.side)
    types = (seq[0] == PAD).astype(np.int32)
    pos, _ = mrope.rope_index(types, [GRID] * len(names), merge=2)
    seg = jnp.ones_like(seq)
    h = model.apply({"params": params}, jnp.asarray(seq), jnp.asarray(pos[:, None]), seg, segment_subtree_end(seg),
                    pixels_NxP=px, grid=grid)
    logp = jax.nn.log_softmax(lm_logits(params["language_model"], TEXT, h)[0], -1)
    p = len(call.prompt_ids)
    return logp[jnp.arange(p - 1, seq.shape[1] - 1), seq[0, p:]]


def _tree_logps(model, params, tree, pixels):
    px = np.concatenate([pixels[n.split(":")[0]] for n in tree.images])
    grid = mrope.vision_grid([GRID] * len(tree.images), merge=2, side=VISION.side)
    pads = np.flatnonzero(tree.tokens == PAD)
    index = tree.node_image[pads] * 4 + tree.node_image_row[pads]  # 4 merged tokens per image
    toks = jnp.asarray(tree.tokens[None])
    h = model.apply({"params": params}, toks, jnp.asarray(tree.mrope_positions[:, None]), jnp.ones_like(toks),
                    jnp.asarray(tree.subtree_end[None]), pixels_NxP=px, grid=grid, visual_index_M=jnp.asarray(index))
    logp = jax.nn.log_softmax(lm_logits(params["language_model"], TEXT, h)[0], -1)
    occ = jnp.asarray(tree.occ_node)
    return logp[jnp.asarray(tree.parent)[occ], toks[0, occ]]


def test_tree_equals_flat_with_images(setup):
    calls, results, model, params, pixels = setup
    tree = build_tree(calls, results, image_pad_id=PAD)
    order = sorted(calls, key=lambda c: (c.rollout_id, c.session_id, c.call_index))
    flat = jax.jit(lambda p: jnp.concatenate([_flat_logps(model, p, c, pixels) for c in order]))(params)
    tree_lp = jax.jit(lambda p: _tree_logps(model, p, tree, pixels))(params)
    offsets = np.cumsum([0] + [len(c.completion_ids) for c in order])
    np.testing.assert_allclose(np.asarray(tree_lp), np.asarray(flat[offsets[tree.occ_call] + tree.occ_pos]),
                               atol=1e-5, rtol=1e-5)
    g_flat = jax.jit(jax.grad(lambda p: sum(_flat_logps(model, p, c, pixels).sum() for c in order)))(params)
    g_tree = jax.jit(jax.grad(lambda p: _tree_logps(model, p, tree, pixels).sum()))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4),
                 g_tree, g_flat)
    # the blind tree (placeholders merged by token id alone) would feed r2 image b: not flat
    blind = build_tree(calls, results)
    assert blind.num_nodes < tree.num_nodes


@pytest.mark.parametrize("row_len", [64, 24])  # one row, and rows short enough that pieces copy image context
def test_the_trainer_objective_on_packed_rows_with_images_equals_flat(setup, row_len):
    """The trainer's forward (research/rl/objective.compact_forward) over packed rows of the tree: the step's
    images enter the tower once each (2 images, not their 6 occurrences), each slot's log-prob is the flat
    forward's, and the gradient of the count-weighted sum equals the flat sum's (the vision tower's too)."""
    from research.rl.objective import Objective, compact_forward, loss_slots
    from research.trees import batch as fields
    from research.trees.packing import image_fields, pack_images, pack_trees
    from research.trees.targets import node_stats, normalizer

    calls, results, model, params, pixels = setup
    tree = build_tree(calls, results, image_pad_id=PAD)
    stats = node_stats(tree, occ_adv=np.ones(len(tree.occ_call)), agg_name="token_mean")
    packed = pack_trees([tree], [stats], [normalizer(tree, "token_mean")], row_len=row_len)
    visual, images = pack_images([tree], packed)
    assert images == tree.images and sum(len(c.meta["images"]) for c in calls) == 6
    batch = {k: v for k, v in packed.items() if k not in fields.HOST_ONLY} | visual
    batch |= image_fields([pixels[n.split(":")[0]] for n in images], [GRID] * 2, merge=2, side=VISION.side)
    batch["loss_idx"], batch["loss_valid"] = loss_slots(packed["count"], 8)
    fields.check(batch)
    assert (batch["patch_frame"] < 2).sum() == 2 * 16  # each distinct image's 16 patches once (+ padding)
    if row_len == 24:
        assert ((packed["own"] == 0) & (batch["visual_index"] >= 0)).any()  # an image inside a context copy

    obj = Objective(vision=VISION)
    lp_tree = jax.jit(lambda p: compact_forward(p, batch, TEXT, obj)[1])(params)
    order = sorted(calls, key=lambda c: (c.rollout_id, c.session_id, c.call_index))
    flat = np.asarray(jax.jit(lambda p: jnp.concatenate([_flat_logps(model, p, c, pixels) for c in order]))(params))
    offsets = np.cumsum([0] + [len(c.completion_ids) for c in order])
    by_node = dict(zip(tree.occ_node.tolist(), flat[offsets[tree.occ_call] + tree.occ_pos].tolist()))
    b, k = np.nonzero(batch["loss_valid"])
    slots = batch["loss_idx"][b, k]
    want = [by_node[n] for n in packed["node_id"][b, slots]]
    np.testing.assert_allclose(np.asarray(lp_tree)[b, k], want, atol=1e-5, rtol=1e-5)

    count = jnp.asarray(np.take_along_axis(packed["count"], batch["loss_idx"], 1) * batch["loss_valid"])
    g_tree = jax.jit(jax.grad(lambda p: (count * compact_forward(p, batch, TEXT, obj)[1]).sum()))(params)
    g_flat = jax.jit(jax.grad(lambda p: sum(_flat_logps(model, p, c, pixels).sum() for c in order)))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4),
                 g_tree, g_flat)
