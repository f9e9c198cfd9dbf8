"""Bench `viewer`: does `launch.inspect` stay fast on a large run? Index time, page latency, incremental refresh.

    python -m launch.bench --suite=viewer [--opt rollouts=10000] [--opt requests=20]

A synthetic workdir in the layout harness_env/rl/loop.py writes (rollouts/results.jsonl, capture.jsonl with
two-call rollouts whose second prompt is a `prompt_ref` continuation, eval/ + eval_capture.jsonl held-out
evals at several versions, metrics.jsonl, ledger.jsonl) holding `rollouts` train rollouts. Reported:
`index_s` (a first, full index), `page_ms_p50` (warm page requests of every kind through the server: run,
rollout lists with filters and pages, steps, rollouts, group trees of groups not seen before, held-out,
metrics) against `static_ms_p50`, a bare static response of the same server (`page_vs_static`); `reindex_s`,
the refresh after one more step of rollouts was appended, against `full_index_s`, a fresh index of the same
files (`reindex_vs_full`: what re-reading only appended bytes saves); `tree_first_ms`: the first group page
(the first tree; the tokenizer loads before the server answers: `start_s`); `page_ms_max`: the slowest page
request of the bench, the first group page and the warm-up requests included (the goal: none over 1 s).
"""

from __future__ import annotations

import http.client
import json
import pathlib
import random
import statistics
import tempfile
import time
from urllib.parse import urlencode, urlparse

from research.capture import CallRecord, RolloutResult, to_json_bytes

GROUPS_PER_STEP = 4
VOCAB = 150000


class SyntheticRun:
    """Writes a synthetic run's logs; `step(k)` appends one RL step of groups (and a metrics/ledger line)."""

    def __init__(self, root: pathlib.Path, group_size: int, prompt: int, completion: int, seed: int):
        self.root, self.group_size, self.prompt, self.completion = root, group_size, prompt, completion
        self.rng = random.Random(seed)
        (root / "rollouts").mkdir(parents=True, exist_ok=True)
        (root / "eval").mkdir(exist_ok=True)
        (root / "config.json").write_text(json.dumps({"name": "bench_viewer", "algo": "grpo", "tokenizer_dir": "",
                                                      "rl": {"estimator": "grpo", "aggregation": "token_mean"}}))

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]

    def _rollout(self, tag: str, step: int, task: str, k: int, prefix: list[int], calls: int) -> tuple[bytes, bytes]:
        gid, rid = f"{tag}{step:05d}/{task}/reference", f"{tag}{step:05d}.{task}.reference.{k}"
        lines, prev = [], None
        for i in range(calls):
            comp = self._tokens(self.completion)
            prompt = prefix + self._tokens(8) if prev is None else prev.prompt_ids + prev.completion_ids + \
                self._tokens(20)
            rec = CallRecord(rollout_id=rid, session_id=rid, group_id=gid, harness="reference", call_index=i,
                             prompt_ids=prompt, completion_ids=comp,
                             logprobs=[-self.rng.random() * 3 for _ in comp], weight_version=step, finish_reason="stop",
                             call_id=f"{rid}/{i}", t_start=0.0, t_end=0.05)
            ref = None if prev is None else (prev.call_id, len(prev.prompt_ids) + len(prev.completion_ids))
            lines.append(to_json_bytes(rec, prompt_ref=ref) + b"\n")
            prev = rec
        timeout = self.rng.random() < 0.05
        reward = None if timeout else float(self.rng.random() < 0.4)
        transcript = [{"role": "user", "content": f"Solve {task}."},
                      {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function", "function": {
                          "name": "bash", "arguments": json.dumps({"command": f"echo {k} > out.txt"})}}]},
                      {"role": "tool", "tool_call_id": "c0", "content": "exit 0"},
                      {"role": "assistant", "content": f"Done: wrote {k}."}]
        meta = {"task_id": task, "category": "bench", "calls": calls, "exit_code": 0, "inputs_changed": [],
                "final_message": f"Done: wrote {k}.",
                "harness_meta": {"transcript": transcript, "tool_calls": ["bash"]},
                **({"cause": "policy", "cause_why": "timeout"} if timeout else {})}
        res = RolloutResult(rollout_id=rid, group_id=gid, harness="reference", status="timeout" if timeout else "ok",
                            reward=reward, sub_scores={} if timeout else {"file": reward}, timings={"total_s": 1.0},
                            meta=meta)
        return b"".join(lines), to_json_bytes(res) + b"\n"

    def step(self, step: int, calls: int = 2) -> None:
        cap, res, rids = [], [], []
        for g in range(GROUPS_PER_STEP):
            task = f"task{(step * GROUPS_PER_STEP + g) % 500:03d}"
            prefix = self._tokens(self.prompt)
            for k in range(self.group_size):
                c, r = self._rollout("train", step, task, k, prefix, calls)
                cap.append(c)
                res.append(r)
                rids.append(f"train{step:05d}.{task}.reference.{k}")
        self._append("capture.jsonl", cap)
        self._append("rollouts/results.jsonl", res)
        self._append("metrics.jsonl", [json.dumps({"kind": "train", "step": step + 1, "rollout/all/reward": 0.4,
                                                   "rollout/all/pass_rate": 0.4, "kl_ref": 0.01, "clip_frac": 0.02,
                                                   "entropy": 1.5, "signal_groups": 3.0}).encode() + b"\n"])
        self._append("ledger.jsonl", [json.dumps({"step": step + 1, "phase": "rl", "trained": rids,
                                                  "dropped": []}).encode() + b"\n"])

    def evals(self, tasks: int, versions: list[int]) -> None:
        cap, res = [], []
        for v in versions:
            for t in range(tasks):
                c, r = self._rollout("eval", v, f"held{t:03d}", 0, self._tokens(self.prompt), 1)
                cap.append(c)
                res.append(r)
        self._append("eval_capture.jsonl", cap)
        self._append("eval/results.jsonl", res)

    def _append(self, rel: str, lines: list[bytes]) -> None:
        with open(self.root / rel, "ab") as f:
            f.write(b"".join(lines))


def _get(conn: http.client.HTTPConnection, path: str) -> float:
    t = time.perf_counter()
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"GET {path}: {resp.status}: {body[-500:]!r}")
    return (time.perf_counter() - t) * 1e3


def _pages(steps: int, group_size: int, rng: random.Random, n: int) -> list[str]:
    """`n` page requests of every kind (distinct steps, groups, rollouts, list pages)."""
    out = []
    for _ in range(n):
        s, g = rng.randrange(steps), rng.randrange(GROUPS_PER_STEP)
        task = f"task{(s * GROUPS_PER_STEP + g) % 500:03d}"
        q = lambda **kw: urlencode(kw)
        out += ["/run", f"/rollouts?{q(page=rng.randrange(steps * GROUPS_PER_STEP * group_size // 50))}",
                f"/rollouts?{q(status='ok', rmin=0.5, task=task)}", f"/step?{q(source='rollouts', step=s)}",
                f"/rollout?{q(source='rollouts', id=f'train{s:05d}.{task}.reference.{rng.randrange(group_size)}')}",
                f"/group?{q(source='rollouts', group=f'train{s:05d}/{task}/reference')}", "/heldout", "/metrics"]
    return out


def run(rollouts: int = 10000, group_size: int = 8, prompt: int = 300, completion: int = 40, requests: int = 20,
        seed: int = 0) -> dict:
    from harness_env.inspect.index import WorkdirIndex
    from harness_env.inspect.server import Background

    steps = max(1, rollouts // (GROUPS_PER_STEP * group_size))
    rng = random.Random(seed + 1)
    with tempfile.TemporaryDirectory(prefix="bench_viewer_") as tmp:
        root = pathlib.Path(tmp)
        w = SyntheticRun(root, group_size, prompt, completion, seed)
        for s in range(steps):
            w.step(s)
        w.evals(tasks=20, versions=[0, steps // 2, steps])
        t = time.perf_counter()
        index = WorkdirIndex(root)
        index.refresh_sync()
        index_s = time.perf_counter() - t
        n_rows = sum(len(s.rows) for r in index.runs.values() for s in r.sources.values())
        w.step(steps)  # one more step appended: the incremental refresh reads only it
        t = time.perf_counter()
        index.refresh_sync()
        reindex_s = time.perf_counter() - t
        t = time.perf_counter()
        WorkdirIndex(root).refresh_sync()
        full_s = time.perf_counter() - t
        t = time.perf_counter()
        with Background(root) as base:
            start_s = time.perf_counter() - t
            u = urlparse(base)
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
            first = urlencode({"source": "rollouts", "group": "train00000/task000/reference"})
            tree_first = _get(conn, f"/group?{first}")
            warm = [_get(conn, p) for p in ("/run", "/heldout", "/metrics")]  # first renders, derived tables
            timed = [(urlparse(p).path.strip("/"), _get(conn, p)) for p in _pages(steps, group_size, rng, requests)]
            page_ms = [ms for _, ms in timed]
            static_ms = [_get(conn, "/static/viewer.css") for _ in range(len(page_ms))]
            conn.close()
    p50, s50 = statistics.median(page_ms), statistics.median(static_ms)
    return {"rollouts": rollouts, "indexed_rollouts": n_rows, "index_s": round(index_s, 3),
            "full_index_s": round(full_s, 3), "reindex_s": round(reindex_s, 4),
            "reindex_vs_full": round(reindex_s / full_s, 4), "page_ms_p50": round(p50, 2),
            "page_ms_p90": round(sorted(page_ms)[int(0.9 * (len(page_ms) - 1))], 2), "static_ms_p50": round(s50, 3),
            "page_vs_static": round(p50 / s50, 2), "tree_first_ms": round(tree_first, 1), "page_requests": len(page_ms),
            "page_ms_max": round(max([tree_first, *warm, *page_ms]), 1), "start_s": round(start_s, 2),
            **{f"{kind}_ms_p50": round(statistics.median(ms for k, ms in timed if k == kind), 2)
               for kind in sorted({k for k, _ in timed})}}
