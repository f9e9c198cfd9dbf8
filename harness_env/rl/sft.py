"""The SFT warm start: expert demonstrations captured through the harness, then NLL steps on them.

Why captured through the harness (not rendered by hand): the policy must learn the exact token sequences
the shim will show it at rollout time (the harness's system prompt and tool schemas rendered by the chat
template, tool results, the empty think block). A scripted expert engine (harness_env/rl/experts.py) answers
the harness inside the same sandboxes, through the same shim and runner; its capture log is sealed into
`WORKDIR/demos/shards`, and a grain iterator (research/data/pipeline.demo_stream: shuffled per epoch,
seeded, its state checkpointed with the TrainState) feeds `config.sft.groups_per_step` groups per step.
"""

from __future__ import annotations

import asyncio
import logging
import time

from harness_env.rl import rollouts as R
from harness_env.rl.experts import expert_engine
from research.data.pipeline import demo_stream, merge_items
from research.data.shards import GroupRecord, seal_log, shard_paths
from research.rl import batches as B
from research.rl.console import Progress

log = logging.getLogger(__name__)


async def capture_demonstrations(loop) -> list[str]:  # noqa: ANN001
    """Runs the expert over the train tasks once per run (the runner skips finished ones on resume) and
    seals the demonstrations; returns the shard paths."""
    run, out_dir = loop.run, loop.workdir / "demos"
    tasks = loop.train_tasks[: run.sft.num_demos] if run.sft.num_demos > 0 else loop.train_tasks
    specs = [R.StepSpec(t, h, 0, step=0, tag="demo") for t in tasks for h, _ in R.harness_weights(run)]
    expert = expert_engine(run.sft.expert, loop.tok, max_context=run.engine.max_len)
    svc = R.RolloutService(run, out_dir, expert, loop.tok, name="rollouts",
                           sampling={}, max_new_tokens=1024)  # the expert is never truncated
    try:
        await svc.run(specs)
    finally:
        await svc.close()
    seal_log(svc.capture_path, out_dir / "shards", key="demos")
    return shard_paths(out_dir / "shards")


def keep_demo(min_reward: float):
    def keep(rec: GroupRecord) -> bool:
        return bool(rec.results) and all(r.success(min_reward) for r in rec.results)

    return keep


async def sft_phase(loop) -> None:  # noqa: ANN001
    """`config.sft.steps` SFT steps (resumable), held-out evals every `eval.sft_every`, then weights out."""
    run, st = loop.run, loop.state
    paths = await capture_demonstrations(loop)
    stream, kept, total = demo_stream(paths, loop.pcfg, groups_per_step=run.sft.groups_per_step,
                                      keep=keep_demo(run.sft.min_reward))
    log.info("SFT: %d/%d demonstrations kept (reward >= %s)", kept, total, run.sft.min_reward)
    if kept == 0:
        raise RuntimeError(f"SFT: none of the {total} demonstrations reached config.sft.min_reward="
                           f"{run.sft.min_reward}")
    if "sft" in st.data_state:
        stream.set_state(st.data_state["sft"])
    progress = Progress("sft", run.sft.steps, done=st.sft_step, lines=20)
    while st.sft_step < run.sft.steps:
        items = next(stream)
        if run.sft.merge_demos:
            items = merge_items(items, loop.pcfg)
        batch = B.build_batch(items, loop.bcfg, current_version=0, max_off_policy=1 << 30,
                              loss_slots_k=run.sft_loss_slots, filter_groups=False, images=loop.images)
        t = time.monotonic()
        m = await asyncio.to_thread(loop.learner.train, batch, sft=True)
        m["train_s"] = time.monotonic() - t
        m["trained_tokens_per_s"] = batch.tree_tokens / max(m["train_s"], 1e-9)
        st.meta["sft_step"] += 1
        loop.metrics.write(st.version, m, kind="sft")
        st.commit("sft", loop.learner.state, data_state={**st.data_state, "sft": stream.get_state()})
        loop.maybe_plot()
        k = st.sft_step
        if line := progress.line(k, {"nll": m["nll"], "tokens": int(batch.tree_tokens)}):
            log.info(line)
        every = run.eval.sft_every
        if every > 0 and k % every == 0 and k < run.sft.steps:
            await loop.push_weights()
            await loop.evaluate()
    await loop.push_weights()
    if run.eval.after_sft:
        await loop.evaluate()
