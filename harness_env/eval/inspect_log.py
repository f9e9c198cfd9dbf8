"""Export a launch.eval run (or a launch.train run's held-out evals) as an Inspect AI eval log.

Why: `inspect view` (PyPI `inspect_ai`) is the log viewer much of the field reads agent evals in, so an
exported run sits next to other groups' evals: one sample per rollout with the harness's transcript, the
verifier's score, and accuracy / mean reward / pass@k per harness. The numbers come from the project's own
definitions (`RolloutResult.success`, harness_env/eval/metrics.py); the log is a view, never a second source.

    python -m harness_env.eval.inspect_log --results=/tmp/harness_rl_eval --out=/tmp/logs/run.eval
    python -m harness_env.eval.inspect_log --results=WORKDIR --out=/tmp/logs    # a launch.train run's evals
    inspect view --log-dir /tmp/logs

Where the records are: a launch.eval --out dir holds results.jsonl + capture.jsonl (harness_env/eval/run.py);
a launch.train workdir keeps its eval rollouts' results in WORKDIR/eval/results.jsonl and their model calls in
WORKDIR/eval_capture.jsonl (harness_env/rl/loop.py). Needs `pip install 'harness-rl[inspect]'`.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import pathlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

try:
    from inspect_ai.log import (
        EvalConfig,
        EvalDataset,
        EvalLog,
        EvalMetric,
        EvalPlan,
        EvalPlanStep,
        EvalResults,
        EvalSample,
        EvalScore,
        EvalSpec,
        EvalStats,
        HeadlineMetric,
        write_eval_log,
    )
    from inspect_ai.model import (
        ChatMessage,
        ChatMessageAssistant,
        ChatMessageSystem,
        ChatMessageTool,
        ChatMessageUser,
        ModelOutput,
        ModelUsage,
    )
    from inspect_ai.scorer import Score
    from inspect_ai.tool import ToolCall
except ImportError as e:  # an optional extra: the error says how to get it
    raise ImportError(f"the Inspect AI export needs inspect_ai ({e}): pip install 'harness-rl[inspect]'") from e

from harness_env.eval import metrics
from research.capture import CallRecord, RolloutResult, read_log

SCORER = "verifier"  # the task's own reward checker (harness_env/tasks): the one scorer of every sample
_STOP = {"stop": "stop", "length": "max_tokens", "tool_calls": "tool_calls", "abort": "unknown"}
_BIG_META = ("harness_meta", "final_message")  # in messages / output already; kept out of sample metadata


def locate(path: str | pathlib.Path) -> tuple[pathlib.Path, pathlib.Path | None]:
    """(results.jsonl, its capture log or None) of a launch.eval --out dir, a train workdir or its eval/ dir.
    The capture log is optional: without it samples carry the transcript but no token usage or weight version."""
    d = pathlib.Path(path)
    if not (d / "results.jsonl").is_file() and (d / "eval" / "results.jsonl").is_file():
        d = d / "eval"  # a launch.train workdir: its held-out evals
    if not (d / "results.jsonl").is_file():
        raise FileNotFoundError(f"{d}: no results.jsonl (expected a launch.eval --out dir or a launch.train workdir)")
    for cand in (d / "capture.jsonl", d.parent / f"{d.name}_capture.jsonl"):
        if cand.is_file():
            return d / "results.jsonl", cand
    return d / "results.jsonl", None


def load(results_path: pathlib.Path, capture_path: pathlib.Path | None
         ) -> tuple[list[RolloutResult], dict[str, list[CallRecord]]]:
    """The finished rollouts (the last record of a retried rollout id wins, as on resume) and their calls."""
    results = {r.rollout_id: r for r in read_log(results_path) if isinstance(r, RolloutResult)}
    calls: dict[str, list[CallRecord]] = collections.defaultdict(list)
    if capture_path is not None:
        for c in read_log(capture_path):
            if isinstance(c, CallRecord) and c.rollout_id in results:
                calls[c.rollout_id].append(c)
    for cs in calls.values():
        cs.sort(key=lambda c: (c.t_start, c.call_index))
    return list(results.values()), calls


def export(results_dir: str | pathlib.Path, out_path: str | pathlib.Path, *, task_name: str | None = None,
           model: str | None = None, tok: Any = None, threshold: float = 1.0) -> pathlib.Path:
    """Writes the run under `results_dir` as one Inspect eval log; returns its path. `out_path`: a .eval or
    .json file, else a directory that gets an Inspect-style name (`inspect view --log-dir` lists it).
    `tok`: the policy tokenizer (default: the packaged Qwen3), only used to decode rollouts without a
    harness transcript. `threshold`: the reward counted as solved, as in the report."""
    results_path, capture_path = locate(results_dir)
    results, calls = load(results_path, capture_path)
    if not results:
        raise ValueError(f"{results_path}: no rollout results to export")
    log = build_log(results, calls, task_name=task_name, model=model, tok=tok, threshold=threshold,
                    created=results_path.stat().st_mtime, source=str(results_path.parent))
    out = pathlib.Path(out_path)
    if out.suffix not in (".eval", ".json"):
        out = out / _file_name(log)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_eval_log(log, str(out))
    return out


def build_log(results: Sequence[RolloutResult], calls: dict[str, list[CallRecord]], *, task_name: str | None,
              model: str | None, tok: Any, threshold: float, created: float, source: str) -> EvalLog:
    """The EvalLog of a run: spec, plan (one step per harness), results, stats and one sample per rollout."""
    versions = sorted({c.weight_version for cs in calls.values() for c in cs})
    model = model or _model_name(versions)
    decode = _decoder(tok)
    samples = [_sample(r, calls.get(r.rollout_id, []), model=model, decode=decode, threshold=threshold)
               for r in results]
    groups = collections.Counter((r.harness, _task_of(r)) for r in results)
    harnesses = sorted({r.harness for r in results})
    times = [t for cs in calls.values() for c in cs for t in (c.t_start, c.t_end) if t]
    start, end = (min(times), max(times)) if times else (created, created)
    run_id = hashlib.sha1(f"{source}:{len(results)}:{created}".encode()).hexdigest()[:22]
    spec = EvalSpec(
        created=_iso(start), task=task_name or _task_name(results), task_id=run_id, run_id=run_id, eval_id=run_id,
        solver="+".join(harnesses), dataset=EvalDataset(name=_task_name(results), location=source,
                                                      samples=len(groups)),
        model=model, config=EvalConfig(epochs=max(groups.values())),
        metadata={"source": source, "harnesses": harnesses, "weight_versions": versions, "threshold": threshold},
        packages={"harness-rl": _version()})
    usage = sum((_usage(cs) for cs in calls.values()), ModelUsage())
    return EvalLog(eval=spec, status="success", plan=EvalPlan(steps=[EvalPlanStep(solver=h) for h in harnesses]),
                   results=_results(results, threshold, max(groups.values())),
                   stats=EvalStats(started_at=_iso(start), completed_at=_iso(end), model_usage={model: usage}),
                   samples=samples)


def _results(results: Sequence[RolloutResult], threshold: float, k: int) -> EvalResults:
    """accuracy (RolloutResult.success) and mean reward over all rollouts, then per harness: accuracy, mean
    and pass@k / pass^k (k > 1) as metric groups (Inspect's layout for a grouped metric)."""
    ms = {"accuracy": EvalMetric(name="accuracy", value=_accuracy(results, threshold)),
          "mean": EvalMetric(name="mean", value=_mean([_value(r) for r in results]))}
    ks = [x for x in (1, 2, 4, 8, 16, 32) if x <= k] or [1]
    for row in metrics.table(results, ks, threshold):
        if row.group != "all":
            continue
        mine = [r for r in results if r.harness == row.harness]
        per = {"accuracy": _accuracy(mine, threshold), "mean": row.mean_reward,
               **{m: v for m, v in row.metrics.items() if m not in ("pass@1", "pass^1")}}
        for group, value in per.items():
            ms[f"{group}_{row.harness}"] = EvalMetric(name=row.harness, group=group, value=value)
    score = EvalScore(name=SCORER, scorer=SCORER, scored_samples=len(results), unscored_samples=0, metrics=ms,
                      params={"threshold": threshold})
    return EvalResults(total_samples=len(results), completed_samples=len(results), scores=[score],
                       headline=HeadlineMetric(scorer=SCORER, score=SCORER, metric="accuracy"))


def _sample(r: RolloutResult, calls: Sequence[CallRecord], *, model: str, decode: Callable[[list[int]], str],
            threshold: float) -> EvalSample:
    """One rollout: the harness transcript (else the decoded model calls), the final answer, the verifier's score."""
    query = _input(r)
    transcript = (r.meta.get("harness_meta") or {}).get("transcript")
    if isinstance(transcript, list) and transcript:
        messages, source = [_message(m) for m in transcript if isinstance(m, dict)], "harness"
    else:
        messages, source = _from_calls(query, calls, decode), "capture"
    final = str(r.meta.get("final_message", ""))
    stop = _STOP.get(calls[-1].finish_reason, "unknown") if calls else "unknown"
    why = " ".join(str(x) for x in (r.status, r.meta.get("cause"), r.meta.get("cause_why"), r.message) if x)
    score = Score(value=_value(r), answer=final, explanation=why, metadata=dict(r.sub_scores) or None)
    meta = {k: v for k, v in r.meta.items() if k not in _BIG_META}
    meta.update(harness=r.harness, status=r.status, group_id=r.group_id, message=r.message, timings=r.timings,
                success=r.success(threshold), weight_versions=sorted({c.weight_version for c in calls}),
                messages_from=source)
    times = [t for c in calls for t in (c.t_start, c.t_end) if t]
    return EvalSample(
        id=r.rollout_id, epoch=int(r.meta.get("sample", 0)) + 1, input=query, target=_task_of(r),
        messages=messages, output=ModelOutput.from_content(model, final, stop_reason=stop),
        scores={SCORER: score}, metadata=meta, model_usage={model: _usage(calls)} if calls else {},
        started_at=_iso(min(times)) if times else None, completed_at=_iso(max(times)) if times else None,
        total_time=r.timings.get("total_s"), working_time=r.timings.get("harness_s"),
        turn_count=r.meta.get("num_turns") or len(calls) or None)


def _input(r: RolloutResult) -> str:
    """The task's user query (its data_entry.json), else the transcript's first user message, else the task id."""
    task_dir = r.meta.get("task_dir")
    if task_dir:
        for base in (pathlib.Path.cwd(), pathlib.Path(__file__).resolve().parents[2]):
            entry = base / task_dir / "data_entry.json"
            if entry.is_file():
                query = json.loads(entry.read_text()).get("user_query")
                if query:
                    return str(query)
    for m in (r.meta.get("harness_meta") or {}).get("transcript") or []:
        if isinstance(m, dict) and m.get("role") == "user" and m.get("content"):
            return _text(m["content"])
    return _task_of(r)


def _message(m: dict) -> ChatMessage:
    """One transcript message ({role, content}, OpenAI-style tool_calls / tool_call_id) as Inspect's message."""
    role, content = m.get("role"), _text(m.get("content"))
    if role == "assistant":
        return ChatMessageAssistant(content=content, tool_calls=_tool_calls(m.get("tool_calls")), source="generate")
    if role == "tool":
        extra = {"ok": m["ok"]} if "ok" in m else None
        return ChatMessageTool(content=content, tool_call_id=m.get("tool_call_id") or None, metadata=extra)
    if role == "system":
        return ChatMessageSystem(content=content)
    return ChatMessageUser(content=content, metadata=None if role == "user" else {"role": role})


def _tool_calls(raw: Any) -> list[ToolCall] | None:
    """OpenAI-style calls ({id, function: {name, arguments: JSON text}}); unparsable arguments stay visible."""
    out = []
    for i, c in enumerate(raw or []):
        fn = c.get("function") or {}
        args, err = fn.get("arguments") or "{}", None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as e:
                args, err = {"raw": args}, str(e)
        out.append(ToolCall(id=str(c.get("id") or i), function=str(fn.get("name", "")),
                            arguments=args if isinstance(args, dict) else {"value": args}, parse_error=err))
    return out or None


def _from_calls(query: str, calls: Sequence[CallRecord], decode: Callable[[list[int]], str]) -> list[ChatMessage]:
    """No harness transcript: the task query, then per model call the new prompt tokens since its parent call
    (tool results, follow-ups: as rendered for the policy) and the decoded completion; the last completion is
    the rollout's final output."""
    out: list[ChatMessage] = [ChatMessageUser(content=query)]
    for c in calls:
        if c.parent_call_id and c.prefix_match_len:
            new = decode(c.prompt_ids[c.prefix_match_len:]).strip()
            if new:
                out.append(ChatMessageUser(content=new, metadata={"rendered_prompt": True}))
        out.append(ChatMessageAssistant(content=decode(c.completion_ids), source="generate",
                                        metadata={"call_id": c.call_id, "weight_version": c.weight_version}))
    return out


def _decoder(tok: Any) -> Callable[[list[int]], str]:
    """Token ids -> text with the run's tokenizer; with none given the packaged Qwen3 one, loaded on first use
    (exports whose rollouts all have a harness transcript never load one)."""
    held = [tok]

    def decode(ids: list[int]) -> str:
        if held[0] is None:
            from research.models.tokenizer import load_tokenizer

            held[0] = load_tokenizer(None)
        return held[0].decode(ids, skip_special_tokens=True)

    return decode


def _text(content: Any) -> str:
    """A message's content as text: Anthropic-style block lists keep their text blocks (others as JSON)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b["text"] if isinstance(b, dict) and isinstance(b.get("text"), str) else json.dumps(b)
                         for b in content)
    return json.dumps(content)


def _usage(calls: Sequence[CallRecord]) -> ModelUsage:
    inp, outp = sum(len(c.prompt_ids) for c in calls), sum(len(c.completion_ids) for c in calls)
    return ModelUsage(input_tokens=inp, output_tokens=outp, total_tokens=inp + outp)


def _value(r: RolloutResult) -> float:
    """The verifier's reward; a rollout without one (not `ok`) scores 0, as in the report's mean reward."""
    return float(r.reward) if r.status == "ok" and r.reward is not None else 0.0


def _accuracy(results: Sequence[RolloutResult], threshold: float) -> float:
    return _mean([float(r.success(threshold)) for r in results])


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _task_of(r: RolloutResult) -> str:
    return str(r.meta.get("task_id") or r.group_id.rsplit("/", 1)[0])


def _task_name(results: Sequence[RolloutResult]) -> str:
    """harness_rl/<the task folders' parent(s)>, e.g. harness_rl/library."""
    parents = sorted({pathlib.Path(str(r.meta["task_dir"])).parent.name for r in results if r.meta.get("task_dir")})
    return "harness_rl/" + ("+".join(parents) or "eval")


def _model_name(versions: Sequence[int]) -> str:
    if not versions:
        return "harness-rl/policy"
    lo, hi = versions[0], versions[-1]
    return f"harness-rl/policy@v{lo}" + (f"-v{hi}" if hi != lo else "")


def _file_name(log: EvalLog) -> str:
    """Inspect's own naming, `<created>_<task>_<id>.eval`, each part with _ / : + as - (the viewer's log list
    parses the task and id back out of the name)."""
    parts = (log.eval.created[:19], log.eval.task.rsplit("/", 1)[-1], log.eval.task_id)
    return "_".join(re.sub(r"[_/:+]", "-", p) for p in parts) + ".eval"


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("harness-rl")
    except PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness_env.eval.inspect_log", description=__doc__.split("\n")[0])
    p.add_argument("--results", required=True, help="a launch.eval --out dir, a launch.train workdir or its eval/")
    p.add_argument("--out", required=True, help="a .eval / .json file, or a directory (an Inspect-style name)")
    p.add_argument("--task", default=None, help="the log's task name (default: harness_rl/<task folder>)")
    p.add_argument("--model", default=None, help="the log's model name (default: harness-rl/policy@v<version>)")
    p.add_argument("--tokenizer", default="", help="decodes rollouts without a transcript ('': packaged Qwen3)")
    p.add_argument("--threshold", type=float, default=1.0, help="reward counted as a success")
    a = p.parse_args(argv)
    tok = None
    if a.tokenizer:
        from research.models.tokenizer import load_tokenizer

        tok = load_tokenizer(a.tokenizer)
    try:
        path = export(a.results, a.out, task_name=a.task, model=a.model, tok=tok, threshold=a.threshold)
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
