"""Forking rollouts by replay: which rollouts of a step get children, at which call, and the children's round.

Why: a group whose rollouts share only the prompt gives every token of a 30-turn rollout the same advantage. A
child of a rollout re-runs the same task through the same harness from scratch, with the shim answering its first k
calls from the parent's records (research/shim/fork.py: verified token for token, no engine time), and samples
fresh from call k on. It joins the parent's group, so the group's prefix tree shares the parent's first k turns and
branches at call k: the shared turns are trained once, and a tree estimator (research/trees/credit.py) can credit
call k's alternatives against each other.

`config.rollout.branch` says which rollouts get children ("" = off): `failed` (not a success), `tool_error` (a shell
tool call that failed), `all` (any rollout that will be trained on). `branch_at` says where: `first_tool_error`
forks at the call that issued the first failed tool call (that decision is re-sampled), `after_tool_error` at the
call that reads its failure (the failed call is replayed and the reaction to the error re-sampled: the samples land
where the rollout went wrong); a parent without a failed call forks uniformly under both; `uniform` at a call
drawn uniformly from 1..n-1 (n: the parent's replayable calls). Each fork gets `branch_children` children, at
most `branch_max_per_step` per step (0: no cap). Only the step's own rollouts are parents (no grandchildren). The
plan is a pure function of (seed, step, the parents' results and records), so a resumed step replans the same
children and the runner skips the finished ones.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import pathlib
import random
import re
import statistics
from collections.abc import Callable, Iterable, Sequence

from harness_env.rl.rollouts import StepSpec
from research.capture import CallRecord, CaptureError, PromptResolver, RolloutResult, read_log
from research.rl.config import BRANCH_AT, BRANCH_WHICH
from research.shim.fork import ReplayPlan
from research.shim.render import tool_results

# A failed shell call as each CLI reports it on one of the first lines of its tool result (the next call's prompt
# holds it): the reference agent "exit code 2", Claude Code "Exit code 1", Codex's exec_command "Process exited with
# code 1". Other tools' failures (a file that does not exist for Claude Code's Read) are not seen.
TOOL_FAILED = re.compile(r"^(?:exit code|Exit code:?|Process exited with code) [1-9]\d*\s*$", re.M)
HEAD_LINES = 4
_CALL_LINE = b'{"kind":"call","rollout_id":"'  # how research/capture.to_json_bytes starts a call's line


@dataclasses.dataclass(frozen=True)
class ForkSpec(StepSpec):
    """A child of `parent_id` forked at call `fork_at` (its `replay` plan answers calls 0..fork_at-1). It keeps the
    parent's task, harness, step, tag and round, so it lands in the parent's group."""

    parent_id: str = ""
    fork_at: int = 0
    child: int = 0

    @property
    def rollout_id(self) -> str:
        return f"{self.parent_id}.f{self.fork_at}c{self.child}"


def failed_tool_calls(records: Sequence[CallRecord], decode: Callable[[list[int]], str]) -> list[int]:
    """call_index of each call whose tool call failed, read from the tool result in the prompt of the call that
    continues it (the tokens after the call's own prompt); calls nothing continues are not judged."""
    recs = sorted(records, key=lambda c: c.call_index)
    nxt: dict[str, CallRecord] = {}
    for c in recs:
        if c.parent_call_id is not None:
            nxt.setdefault(c.parent_call_id, c)
    out = []
    for c in recs:
        n = nxt.get(c.call_id)
        if n is None or (n.prefix_match_len or 0) < len(c.prompt_ids):
            continue
        text = decode(list(n.prompt_ids[n.prefix_match_len:]))
        heads = ("\n".join(r.split("\n")[:HEAD_LINES]) for r in tool_results(text))
        if any(TOOL_FAILED.search(h) for h in heads):
            out.append(c.call_index)
    return out


def replayable(records: Sequence[CallRecord]) -> int:
    """How many leading calls can be replayed: ok calls of the first session numbered 0, 1, ... without a gap."""
    recs = sorted(records, key=lambda c: c.call_index)
    n = 0
    while n < len(recs) and recs[n].call_index == n and recs[n].status == "ok" and \
            recs[n].session_id == recs[0].session_id:
        n += 1
    return n


def fork_point(records: Sequence[CallRecord], failed: Sequence[int], *, at: str, rng: random.Random) -> int | None:
    """The call a child re-samples (see the module doc); None when the parent has no call to fork at."""
    n = replayable(records)
    if at in ("first_tool_error", "after_tool_error"):
        # calls 0..i must replay (i < n); after_tool_error re-samples call i + 1, whose prompt shows the failure
        k = next((i + (at == "after_tool_error") for i in failed if i < n), None)
        if k is not None:
            return k
    elif at != "uniform":
        raise ValueError(f"branch_at={at!r}; known: {BRANCH_AT}")
    return rng.randrange(1, n) if n >= 2 else None


def plan_children(parents: Sequence[StepSpec], results: dict[str, RolloutResult],
                  calls: dict[str, list[CallRecord]], *, which: str, at: str, children: int, cap: int, seed: int,
                  trainable: Callable[[RolloutResult], bool], decode: Callable[[list[int]], str]) -> list[ForkSpec]:
    """The children of a step's `parents` (their results and call records given); deterministic in its inputs."""
    if which not in BRANCH_WHICH[1:]:
        raise ValueError(f"branch={which!r}; known: {BRANCH_WHICH[1:]}")
    forks = []
    for spec in parents:
        res, recs = results.get(spec.rollout_id), calls.get(spec.rollout_id)
        if res is None or not recs or not trainable(res):
            continue
        failed = failed_tool_calls(recs, decode)
        if (which == "failed" and res.success()) or (which == "tool_error" and not failed):
            continue
        k = fork_point(recs, failed, at=at, rng=random.Random(f"{seed}/{spec.rollout_id}"))
        if k is not None:
            forks.append((spec, k, ReplayPlan.of(recs, k)))
    if cap:  # which parents get the capped children: a seeded draw, the step's (parents' ids carry the step)
        random.Random(f"{seed}/{parents[0].rollout_id}/cap").shuffle(forks)
    out = [ForkSpec(s.task_dir, s.harness, s.sample, replay=plan, step=s.step, tag=s.tag, round=s.round,
                    parent_id=s.rollout_id, fork_at=k, child=j) for s, k, plan in forks for j in range(children)]
    return out[:cap] if cap else out


def call_rollout(line: bytes) -> str | None:
    """The rollout id of a capture-log call line without decoding it (None: not a call line)."""
    if not line.startswith(_CALL_LINE):
        return None
    end = line.find(b'"', len(_CALL_LINE))
    return line[len(_CALL_LINE):end].decode() if end > 0 else None


def records_of(path: pathlib.Path, rollout_ids: Iterable[str]) -> dict[str, list[CallRecord]]:
    """The call records of these rollouts in a capture log; other rollouts' lines are skipped undecoded (a line's
    prompt reference points into its own session, so skipping them resolves nothing wrong). A torn last line
    (a writer that died mid-record) is skipped, as `read_log` does."""
    want, out = set(rollout_ids), collections.defaultdict(list)
    resolver = PromptResolver()
    with open(path, "rb") as f:
        for line in f:
            if call_rollout(line) not in want:
                continue
            try:
                rec = resolver.decode(line)
            except (ValueError, TypeError, CaptureError):
                if line.endswith(b"\n"):
                    raise
                continue
            out[rec.rollout_id].append(rec)
    return dict(out)


async def run_children(service, run, step_parents: Sequence[StepSpec]) -> list[ForkSpec]:  # noqa: ANN001
    """Plans the children of a step's rollouts and runs them through `service` (a rollouts.RolloutService);
    returns their specs. `run`: the RunConfig (its `rollout.branch*` fields, `rl` scoring, seed)."""
    ro = run.rollout
    if not ro.branch or not step_parents:
        return []
    ids = {s.rollout_id for s in step_parents}
    path = service.runner.results_path
    results = {r.rollout_id: r for r in read_log(path) if isinstance(r, RolloutResult) and r.rollout_id in ids}
    calls = await asyncio.to_thread(records_of, service.capture_path, results)
    rl = run.rl

    def trainable(r: RolloutResult) -> bool:
        return r.status == "ok" or r.status in rl.scored_failures or (r.meta or {}).get("cause") in rl.scored_causes

    kids = plan_children(step_parents, results, calls, which=ro.branch, at=ro.branch_at, children=ro.branch_children,
                         cap=ro.branch_max_per_step, seed=run.seed, trainable=trainable, decode=service.shim.tok.decode)
    if kids:
        await service.run(kids)
    return kids


def is_child(r: RolloutResult) -> bool:
    return "replay" in (r.meta or {})


def branch_metrics(results: Sequence[RolloutResult], prefix: str = "branch") -> dict[str, float]:
    """Per harness and overall, of a step's forked children: how many ran, replays that matched / mismatched,
    calls and completion tokens answered from records (no engine time), forks whose prompt differed from the
    parent's, and the children's mean reward."""
    kids = [r for r in results if is_child(r)]
    by_h: dict[str, list[RolloutResult]] = collections.defaultdict(list)
    for r in kids:
        by_h[r.harness].append(r)
    out: dict[str, float] = {}
    for name, rs in [("all", kids), *sorted(by_h.items())]:
        if not rs:
            continue
        reps = [r.meta["replay"] or {} for r in rs]
        miss = sum(rep.get("mismatch") is not None for rep in reps)
        out.update({f"{prefix}/{name}/children": float(len(rs)), f"{prefix}/{name}/replay_mismatch": float(miss),
                    f"{prefix}/{name}/replay_match": float(len(rs) - miss),
                    f"{prefix}/{name}/replay_match_rate": (len(rs) - miss) / len(rs),
                    f"{prefix}/{name}/replayed_calls": float(sum(rep.get("replayed", 0) for rep in reps)),
                    f"{prefix}/{name}/replayed_tokens": float(sum(rep.get("replayed_tokens", 0) for rep in reps)),
                    f"{prefix}/{name}/fork_prompt_diff": float(sum(
                        bool(rep.get("fork")) and not rep["fork"]["prompt_match"] for rep in reps))})
        ok = [r.reward for r in rs if r.status == "ok" and r.reward is not None]
        if ok:
            out[f"{prefix}/{name}/reward"] = statistics.fmean(ok)
    return out
