"""Bench `screenshot_tree`: what the image-aware prefix tree saves on real screenshot rollouts (issue 26, item 8).

    python -m launch.bench --suite=screenshot_tree [--opt group=8] [--opt backend=bwrap]

One group of `group` rollouts of browser-use with vision (`browser_use_vision`, unmodified) on one visual task
(harness_env/tasks/visual_family.py, pick_colour) in a real headless Chromium, through the real shim with
Qwen3-VL's image processor (each screenshot: image tokens in the record, the PNG stored once by content), and a
scripted policy that diverges per rollout: it opens the page (every rollout sees the same first screenshot), then
chooses a swatch at random, so the later screenshots differ as a sampled policy's would. The peer in the same run:
the same group through `browser_use` with vision off (text only).

Keys: `vision_flat_tokens` (sum over calls of prompt + completion), `vision_tree_tokens` (nodes of the image-aware
tree), `vision_tree_vs_flat`; `vision_images_flat` (vision tower runs of a flat trainer: every image of every
call) vs `vision_images_tree` (distinct images of the tree: the tower runs once for each);
`vision_image_tokens_per_call`, `vision_first_prompt`, `vision_reward_mean`; the same `text_*` keys for the
peer, and `vision_vs_text` (the ratio of the two tree_vs_flat).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import random
import tempfile

from harness_env.benchmarks import ready_backend
from harness_env.runner import RolloutSpec, RunnerConfig, run_through_shim
from harness_env.sandbox import Limits
from harness_env.tasks import visual_family
from harness_env.web.policy import bu_reply


def diverging_web_policy(task: pathlib.Path, decode, seed: int = 0):  # noqa: ANN001, ANN201
    """browser-use replies that open the task's page, then choose a swatch drawn per call (a rollout's later calls
    are past its plan: they answer done), so rollouts share the first screen and part after it."""
    rng = random.Random(seed)
    plan = json.loads((task / "solution" / "plan.json").read_text())
    n = len(json.loads((task / "env" / "site.json").read_text())["config"]["swatches"])

    def reply(req) -> str:  # noqa: ANN001 - research.serving.api.GenerateRequest
        pick = {"op": "click", "role": "button", "name": f"Choose swatch {rng.randrange(n) + 1}"}
        return bu_reply(decode(list(req.prompt_ids)), [plan[0], pick], "Done.")

    return reply


async def _group(tok, harness: str, task: pathlib.Path, backend, root: pathlib.Path, group: int) -> dict:
    from research.models import image_processor as ip
    from research.serving.replay import ReplayEngine
    from research.shim.session import ShimOptions
    from research.trees.builder import build_tree

    cfg = RunnerConfig(out_dir=root / "run", backend=backend.name, timeout_s=300, progress=False, infra_retries=0,
                       concurrency=2, max_turns=8, limits=Limits(cpus=2.0, memory_mb=4096, pids=1024, wall_s=330))
    engine = ReplayEngine(diverging_web_policy(task, tok.decode), tok)
    results, calls = await run_through_shim(root, engine, tok, [RolloutSpec(task, harness, k) for k in range(group)],
                                            cfg, backend=None if backend.name == "bwrap" else backend,
                                            shim_options=ShimOptions(vision=ip.ImageProcessorConfig()))
    bad = [r for r in results if r.status != "ok"]
    if bad:
        raise RuntimeError(f"{harness}: {bad[0].rollout_id} ended {bad[0].status}: {bad[0].message}")
    pad = tok.token_to_id("<|image_pad|>")
    tree = build_tree(calls, results, image_pad_id=pad)
    flat = sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    return {"flat_tokens": flat, "tree_tokens": tree.num_nodes, "tree_vs_flat": round(flat / tree.num_nodes, 2),
            "images_flat": sum(len(c.meta.get("images", [])) for c in calls), "images_tree": len(tree.images),
            "image_tokens_per_call": round(sum(c.prompt_ids.count(pad) for c in calls) / len(calls), 1),
            "calls": round(len(calls) / group, 2), "first_prompt": max(len(c.prompt_ids) for c in calls
                                                                         if c.call_index == 0),
            "reward_mean": round(sum(r.reward for r in results) / group, 3)}


def run(group: int = 8, backend: str = "bwrap", tokenizer_dir: str = "") -> dict:
    from harness_env.web import browser
    from research.models.tokenizer import load_tokenizer

    ok, why = browser.chromium_available()
    if not ok:
        raise RuntimeError(f"screenshot_tree needs Chromium: {why}")
    b = ready_backend(backend)
    tok = load_tokenizer(tokenizer_dir)
    out: dict = {"backend": backend, "group": group, "task": "visual-pick_colour-000"}
    with tempfile.TemporaryDirectory(prefix="bench-screenshot-tree-") as tmp:
        task = visual_family.write_task(pathlib.Path(tmp) / "tasks", "pick_colour", 0)
        for key, harness in (("vision", "browser_use_vision"), ("text", "browser_use")):
            r = asyncio.run(_group(tok, harness, task, b, pathlib.Path(tmp) / key, group))
            out.update({f"{key}_{k}": v for k, v in r.items()})
    out["vision_vs_text"] = round(out["vision_tree_vs_flat"] / out["text_tree_vs_flat"], 2)
    return out
