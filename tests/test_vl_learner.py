"""The RL learner over a Qwen3-VL policy (research/rl/trainer.py with `config.vision`): its state {"visual",
"language_model"} sharded by the logical rules, batches whose images come from the shim's store (research/rl/
batches.StepImages), images replicated and never split into microbatches or minibatches.

The learning check: two screenshots (red, blue) under the same text, each with its own right answer. The answer can
only be told from the pixels, so SFT gets below chance only if the gradient reaches the vision tower through the
placeholders; the control, one picture under both answers, stays at chance."""

from __future__ import annotations

import io

import jax
import numpy as np
import pytest
from PIL import Image

from research.capture import CallRecord, RolloutResult
from research.data.pipeline import to_tree
from research.data.shards import GroupRecord
from research.models.config import tiny_dense
from research.models.image_processor import ImageProcessorConfig
from research.models.vision import VisionConfig
from research.rl import batches as B
from research.rl import config as C
from research.rl.objective import make_rl_loss_fn
from research.rl.trainer import Learner
from research.shim.images import ImageStore
from research.train.state import tree_norm
from research.train.step import SHARED_FIELDS

VS, VE, PAD = 151652, 151653, C.IMAGE_PAD_ID  # <|vision_start|>, <|vision_end|>, <|image_pad|>
ANSWER = {"red": 100, "blue": 200}
VISION = VisionConfig(depth=2, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, out_hidden_size=32,
                      num_position_embeddings=16, deepstack_indexes=(0,))
PROC = ImageProcessorConfig(patch_size=4, temporal_patch_size=2, merge_size=2, min_pixels=256, max_pixels=256)


def _config(mesh: dict | None = None, **train):
    c = C.defaults()
    text = tiny_dense(vocab_size=151680, hidden_size=32, intermediate_size=48, head_dim=16, mrope_section=(2, 3, 3),
                      deepstack_layers=1, embedding_init_std=0.2, rope_theta=1e4)
    c.model = text.__dict__ | {"logical_rules": [list(r) for r in text.logical_rules]}
    c.vision = VISION.__dict__ | {"deepstack_indexes": list(VISION.deepstack_indexes)}
    c.image_processor = PROC.__dict__ | {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    c.mesh = mesh or dict(data=-1, fsdp=1, expert=1, tensor=1)
    c.optim.update(learning_rate=1e-2, warmup_steps=0)
    c.rl.update(kl_coef=0.0)
    c.train.update(batch_rows=8, row_len=64, loss_slots=16, diagnostics=False, **train)
    c.engine.update(max_len=64)
    return c


def _png(colour: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), {"red": (220, 30, 30), "blue": (30, 30, 220)}[colour]).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = ImageStore(tmp_path_factory.mktemp("images"))
    return s, {c: s.put(_png(c), "png") for c in ANSWER}


def _items(shas: dict, run: C.RunConfig, *, n: int = 4, reward=lambda colour, answer: float(answer == ANSWER[colour])):
    """Groups of one call each: "look [image] answer:" -> one token; 2 rollouts per group, one per colour; odd
    groups answer "red" to both (the reward: right or not)."""
    items = []
    for g in range(n):
        calls, results = [], []
        for colour, sha in shas.items():
            rid = f"g{g}-{colour}"
            answer = ANSWER["red"] if g % 2 else ANSWER[colour]
            calls.append(CallRecord(rollout_id=rid, session_id=rid, group_id=f"g{g}", harness="h", call_index=0,
                                    prompt_ids=[1, 2, VS] + [PAD] * 4 + [VE, 3], completion_ids=[answer],
                                    logprobs=[-3.0], weight_version=0, finish_reason="stop", call_id=rid,
                                    meta={"images": [f"{sha}:1x4x4"]}))
            results.append(RolloutResult(rollout_id=rid, group_id=f"g{g}", harness="h", status="ok",
                                         reward=reward(colour, answer)))
        items.append(to_tree(GroupRecord(group_id=f"g{g}", harness="h", calls=calls, results=results), run.pipeline()))
    return items


def _batch(run, store, items) -> B.StepBatch:
    s, _ = store
    images = B.StepImages(load=s.get, processor=run.processor(), side=VISION.side)
    return B.build_batch(items, run.batching(), current_version=0, max_off_policy=1 << 30,
                         loss_slots_k=run.train.loss_slots, images=images)


def _answer_logp(learner: Learner, run, store) -> dict[str, float]:
    """log p(the colour's right answer | its image) under the learner's params."""
    _, shas = store
    out = {}
    for colour, sha in shas.items():
        items = _items({colour: sha}, run, n=1)
        batch = _batch(run, store, items)
        logp = learner.slot_eval(learner.state.params, batch.device)["logp"]
        out[colour] = float(logp[batch.device["count"] > 0].sum())
    return out


def test_vl_state_is_both_towers_sharded_and_the_batch_carries_the_images_once(store):
    run = C.RunConfig.of(_config(), num_devices=jax.device_count())
    learner = Learner(run)
    assert set(learner.state.params) == {"visual", "language_model"}
    batch = _batch(run, store, _items(store[1], run))
    dev = batch.device
    # 4 groups x 2 calls show 2 distinct images: 2 x 16 patch rows, padded to the 64-row minimum
    assert dev["pixels"].shape == (64, VISION.patch_dim) and int((dev["patch_frame"] < 2).sum()) == 32
    assert (dev["visual_index"] >= 0).sum() == 8 * 4 and set(np.unique(dev["visual_index"])) == {-1, *range(8)}
    assert dev["mrope_positions"].shape == dev["tokens"].shape + (3,)
    m = learner.train(batch)
    for k in ("loss", "grad_norm", "param_norm", "update_norm", "behav_logp_maxdiff"):
        assert np.isfinite(m[k]), k
    visual = jax.tree.leaves(learner.state.params["visual"])
    assert all(x.sharding.mesh.size == jax.device_count() for x in visual)


def test_text_trees_of_a_vision_policy_and_images_without_a_source():
    run = C.RunConfig.of(_config())
    rec = GroupRecord(group_id="t", harness="h", calls=[
        CallRecord(rollout_id=r, session_id=r, group_id="t", harness="h", call_index=0, prompt_ids=[1, 2, 3],
                   completion_ids=[4 + i], logprobs=[-1.0], weight_version=0, finish_reason="stop", call_id=r)
        for i, r in enumerate("ab")], results=[RolloutResult(rollout_id=r, group_id="t", harness="h", status="ok",
                                                             reward=float(i)) for i, r in enumerate("ab")])
    batch = B.build_batch([to_tree(rec, run.pipeline())], run.batching(), current_version=0, max_off_policy=1,
                          loss_slots_k=16)
    assert "pixels" not in batch.device  # a text-only step: 1-D positions, no tower
    assert np.isfinite(Learner(run).train(batch)["loss"])
    with pytest.raises(ValueError, match="hold images but the learner reads none"):
        B.build_batch(_items({"red": "0" * 64}, run, n=1), run.batching(), current_version=0, max_off_policy=1,
                      loss_slots_k=16)


def test_microbatches_and_minibatches_keep_the_images_whole(store):
    """2 microbatches on a 4-device mesh: the step's loss and gradient norm are the mean over the two row halves,
    each seeing the step's images whole (computed here from the loss function on each half, on one device); with 2
    minibatches each optimizer step's rows still index the step's images."""
    run = C.RunConfig.of(_config(dict(data=4, fsdp=1, expert=1, tensor=1), num_microbatches=2),
                         num_devices=jax.device_count())
    batch = _batch(run, store, _items(store[1], run))
    dev = batch.device
    assert SHARED_FIELDS <= set(dev)
    learner = Learner(run)
    params = jax.device_get(learner.state.params)
    loss_fn = make_rl_loss_fn(run.model, run.objective())
    halves = [{k: v if k in SHARED_FIELDS else v[i * 4:(i + 1) * 4] for k, v in dev.items()} for i in range(2)]
    mean = lambda p: sum(loss_fn(p, h, None)[0] for h in halves) / 2  # noqa: E731
    want_loss, grads = jax.value_and_grad(mean)(params)
    got = learner.train(batch)
    np.testing.assert_allclose(got["loss"], float(want_loss), rtol=1e-5)
    np.testing.assert_allclose(got["grad_norm"], float(tree_norm(grads)), rtol=1e-4)
    mini = Learner(C.RunConfig.of(_config(dict(data=4, fsdp=1, expert=1, tensor=1), minibatches=2),
                                  num_devices=jax.device_count()))
    assert mini.train(batch)["optimizer_steps"] == 2.0


def test_sft_learns_an_answer_only_the_pixels_tell(store):
    """After SFT on both colours' answers, each image's right answer is likely (>= 0.9): the text is the same, so
    the model tells them apart by the pixels, and the tower's own params moved. The control shows the red image
    under both answers: nothing tells them apart, and neither gets past ~0.5."""
    run = C.RunConfig.of(_config(), num_devices=jax.device_count())
    _, shas = store
    learner, control = Learner(run), Learner(run)
    tower0 = jax.tree.map(np.asarray, learner.state.params["visual"])
    batch = _batch(run, store, _items(shas, run, n=1))  # red -> 100, blue -> 200
    blind = _batch(run, store, _items({"red": shas["red"], "blue": shas["red"]}, run, n=1))
    for _ in range(30):
        learner.train(batch, sft=True)
        control.train(blind, sft=True)
    after = _answer_logp(learner, run, store)
    assert min(after.values()) > np.log(0.9), after
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()), learner.state.params["visual"], tower0)
    assert min(jax.tree.leaves(moved)) > 0, moved
    seen = control.slot_eval(control.state.params, blind.device)["logp"][blind.device["count"] > 0]
    assert seen.max() < np.log(0.6), seen  # two answers to one picture: ~log 0.5 each
