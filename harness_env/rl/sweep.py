"""Seed sweeps: per seed, one SFT phase, then RL *and* the SFT-only control from that same SFT checkpoint.

Why: a claim from one run is an anecdote. Which SFT policy a seed produces decides where RL starts, and a
control that does not start from the very same checkpoint compares two different starts. So per seed:

  WORKDIR/seed{s}/sft      the config with `algo="sft"` (its SFT steps and evals, nothing else);
  WORKDIR/seed{s}/rl       a copy of sft/, resumed with the config as given: the RL phase;
  WORKDIR/seed{s}/control  a copy of sft/, resumed with `algo="sft"` and as many more SFT steps as the RL
                           phase's work minutes buy at the SFT phase's pace (equal minutes, by construction).

Runs are compared at equal *work* minutes (research/rl/run_state.py: `work_s` sums a run's own processes;
a copy continues its source's clock). Every part resumes (each is a `launch.train` run; a finished part is
marked `done.json`), so the sweep command can be re-run after a kill. The result: `sweep.json`, `sweep.csv`
(one row per seed) and `sweep.png` (every seed's curve, RL solid and control dashed, and their medians).
"""

from __future__ import annotations

import copy
import csv
import json
import logging
import math
import pathlib
import shutil
import statistics
from collections.abc import Iterator

from harness_env.rl.branching import failed_tool_calls, records_of
from harness_env.rl.loop import train
from harness_env.tasks import relay
from harness_env.tasks.family import classify_answer
from research.capture import CallRecord, RolloutResult, read_log
from research.models.tokenizer import load_tokenizer
from research.rl.config import override
from research.rl.metrics import read_metrics

log = logging.getLogger(__name__)

_SKIP = shutil.ignore_patterns("*.sock", "done.json", "summary.json")


def _seed_config(config, seed: int, **overrides):  # noqa: ANN001

    return override(copy.deepcopy(config), {"seed": seed, **overrides})


def run_part(cfg, workdir: pathlib.Path, source: pathlib.Path | None = None) -> None:  # noqa: ANN001
    """`launch.train`'s run in `workdir` (first a copy of `source`, made atomically), unless marked done."""

    if (workdir / "done.json").exists():
        return
    if source is not None and not workdir.exists():
        tmp = workdir.with_name(workdir.name + ".copying")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp, ignore=_SKIP, symlinks=True)
        tmp.rename(workdir)
    summary = train(cfg, workdir)
    (workdir / "done.json").write_text(json.dumps(summary, indent=2))


def evals(workdir: pathlib.Path) -> list[dict]:
    """The run's held-out evals (last record per version), in version order."""
    last = {r["step"]: r for r in read_metrics(workdir) if r["kind"] == "eval"}
    return [{"version": v, "minutes": r.get("eval/elapsed_min", float("nan")),
             "pass": r.get("eval/all/pass_rate", 0.0), "reward": r.get("eval/all/reward", 0.0),
             "per_harness": {k.split("/")[1]: x for k, x in r.items()
                             if k.startswith("eval/") and k.endswith("/pass_rate") and k != "eval/all/pass_rate"}}
            for v, r in sorted(last.items())]


def _eval_results(workdir: pathlib.Path, version: int) -> dict[str, RolloutResult]:
    """The held-out rollouts of eval `version` (their ids start with `eval{version:05d}.`), by rollout id."""
    prefix = f"eval{version:05d}."
    return {r.rollout_id: r for r in read_log(workdir / "eval" / "results.jsonl")
            if isinstance(r, RolloutResult) and r.rollout_id.startswith(prefix)}


def _eval_calls(workdir: pathlib.Path, rollout_ids, call_index: int) -> Iterator[CallRecord]:  # noqa: ANN001
    """The eval's captured calls number `call_index` of the rollouts `rollout_ids`."""
    for c in read_log(workdir / "eval_capture.jsonl"):
        if isinstance(c, CallRecord) and c.call_index == call_index and c.rollout_id in rollout_ids:
            yield c


def answer_forms(workdir: pathlib.Path, version: int) -> dict:
    """Counts of the make_file family's held-out answers at eval `version` by form and name (family.classify_answer):
    `cut`, `echo`, `other`, `name_ok`, and per form how many copied the name right."""

    tok = load_tokenizer(None)
    params = {rid: json.loads((pathlib.Path(r.meta["task_dir"]) / "data_entry.json").read_text())["metadata"]["params"]
              for rid, r in _eval_results(workdir, version).items()}
    counts = {"n": 0, "cut": 0, "echo": 0, "other": 0, "name_ok": 0, "cut_name_ok": 0, "echo_name_ok": 0}
    for c in _eval_calls(workdir, params, 0):
        p = params[c.rollout_id]
        a = classify_answer(tok.decode(c.completion_ids), p["name"], p["word"])
        counts["n"] += 1
        counts[a["form"]] += 1
        if a["name_ok"]:
            counts["name_ok"] += 1
            counts[f"{a['form']}_name_ok"] += 1  # "other" answers never name a file
    return counts


def relay_answers(workdir: pathlib.Path, version: int) -> dict:
    """The relay family's held-out rollouts at eval `version`: pass rate per clue word (`by_clue`: a policy that
    conditions on what `cat clue.txt` returned passes on both, one with a favourite word on one only), the forms
    of their second calls' `echo [the word] WORD > out.txt` (well-formed for the CLI or not; "none" when a second
    call names no write), and `copied`, the share whose written word is the task's clue."""

    tok, results = load_tokenizer(None), _eval_results(workdir, version)
    # relay-NN: the clue follows from N
    clue = {rid: relay.clue_of(int(pathlib.Path(r.meta["task_dir"]).name.split("-")[1])) for rid, r in results.items()}
    passed = {rid: (r.reward or 0.0) >= 1.0 for rid, r in results.items()}
    forms, copied = {"exact": 0, "literal": 0, "none": 0}, 0
    for c in _eval_calls(workdir, clue, 1):
        w = relay.written(tok.decode(c.completion_ids))
        forms[w[0] if w else "none"] += 1
        copied += bool(w and w[1] == clue[c.rollout_id])
    n = len(clue)
    by_clue = {w: float(statistics.mean([passed[r] for r in clue if clue[r] == w] or [0.0])) for w in relay.CLUES}
    forms["none"] += n - sum(forms.values())  # rollouts that never made a second call
    return {"n": n, "by_clue": by_clue, "forms": forms, "copied": copied / max(n, 1)}


def recovery(workdir: pathlib.Path, version: int) -> dict:
    """Error recovery at eval `version`: of the held-out rollouts with a failed shell call (a tool result that
    reports a non-zero exit: branching.failed_tool_calls), how many, and the share that still succeeded (None: none
    had one)."""

    tok = load_tokenizer(None)
    passed = {rid: (r.reward or 0.0) >= 1.0 for rid, r in _eval_results(workdir, version).items()}
    calls = records_of(workdir / "eval_capture.jsonl", passed)
    hit = [rid for rid, recs in calls.items() if failed_tool_calls(recs, tok.decode)]
    return {"n": len(passed), "with_failure": len(hit),
            "recovered": statistics.mean(passed[r] for r in hit) if hit else None}


def control_steps(sft_evals: list[dict], rl_evals: list[dict], sft_steps: int) -> int:
    """SFT steps the RL phase's work minutes buy at the SFT phase's measured pace (evals included): between its
    first and last evals, or, with only the one after SFT (eval.at_start off), since the run's start (minute 0:
    the demonstrations' capture is then counted in the pace, which a control copied from the SFT run does not
    repeat, so it runs a little past the RL phase's minutes; measured 12.4 vs 11.8 through Codex)."""
    start, end = sft_evals[0], sft_evals[-1]
    span = end["minutes"] - (start["minutes"] if len(sft_evals) >= 2 else 0.0)
    if span <= 0:
        raise ValueError(f"the SFT phase's pace: its evals span {span} work minutes")
    rl_minutes = rl_evals[-1]["minutes"] - end["minutes"]
    return max(1, math.ceil(rl_minutes / (span / max(sft_steps, 1))))


def run_seed(config, seed: int, root: pathlib.Path, *, control: bool = True) -> dict:  # noqa: ANN001
    sft_steps = int(config.sft.steps)
    if sft_steps <= 0:
        raise ValueError("a sweep shares one SFT phase between RL and its control: config.sft.steps must be > 0")
    base = root / f"seed{seed}"
    base.mkdir(parents=True, exist_ok=True)
    log.info("sweep seed %d: SFT", seed)
    run_part(_seed_config(config, seed, algo="sft"), base / "sft")
    log.info("sweep seed %d: RL from the SFT checkpoint", seed)
    run_part(_seed_config(config, seed), base / "rl", source=base / "sft")
    row = {"seed": seed, "sft": evals(base / "sft"), "rl": evals(base / "rl")}
    if config.tasks.source == "make_file":  # which skill a failure lacks: the name copy or the form
        row["answers"] = {str(v): answer_forms(base / "rl", v) for v in (sft_steps, row["rl"][-1]["version"])}
    if config.tasks.source == "relay":  # does the policy read the clue, or guess a favourite word?
        row["answers"] = {str(v): relay_answers(base / "rl", v) for v in (sft_steps, row["rl"][-1]["version"])}
    if config.tasks.source == "recover":  # recovery before / after RL (the failed `cat clue.txt` of moved tasks)
        row["recovery"] = {str(v): recovery(base / "rl", v) for v in (sft_steps, row["rl"][-1]["version"])}
    if control:
        extra = control_steps(row["sft"], row["rl"], sft_steps)
        every = max(1, extra // 4) if config.eval.sft_every else 0
        log.info("sweep seed %d: control, %d more SFT steps (equal minutes)", seed, extra)
        run_part(_seed_config(config, seed, algo="sft", **{"sft.steps": sft_steps + extra, "eval.sft_every": every,
                                                              "eval.after_sft": True}),
                  base / "control", source=base / "sft")
        row["control"] = evals(base / "control")
    return row


def at_or_after(points: list[dict], minutes: float) -> dict:
    later = [p for p in points if p["minutes"] >= minutes - 1e-9]
    return later[0] if later else points[-1]


def summarize(rows: list[dict], sft_steps: int, min_gain: float = 0.25) -> dict:
    """Per seed: held-out at RL start, after each RL eval, the control at equal minutes; then medians and the
    acceptance checks of a claim (each seed: final >= min(start + min_gain, 0.95), > its control, never below its
    start; the demo's: min_gain 0.25 and the median final >= 0.85; learning through a CLI: min_gain 0.3)."""
    table = []
    for r in rows:
        start = [p for p in r["rl"] if p["version"] <= sft_steps][-1]  # the eval RL starts from
        rl = [p for p in r["rl"] if p["version"] > sft_steps]
        final = rl[-1] if rl else start
        entry = {"seed": r["seed"], "start": start["pass"], "start_reward": start["reward"],
                 "rl": [(p["version"] - sft_steps, p["pass"]) for p in rl], "final": final["pass"],
                 "final_reward": final["reward"], "rl_minutes": final["minutes"] - start["minutes"]}
        if r.get("control"):
            ctl = [p for p in r["control"] if p["version"] > sft_steps]
            eq = at_or_after(ctl, final["minutes"]) if ctl else start
            entry.update(control=eq["pass"], control_reward=eq["reward"], control_steps=eq["version"] - sft_steps,
                         control_best=max(p["pass"] for p in ctl) if ctl else start["pass"])
        entry["ok"] = (entry["final"] >= min(entry["start"] + min_gain, 0.95) and entry["final"] >= entry["start"]
                       and entry["final"] > entry.get("control", -1.0))
        table.append(entry)
    out = {"seeds": [e["seed"] for e in table], "sft_steps": sft_steps, "min_gain": min_gain, "table": table}
    for key in ("start", "final", "control"):
        vals = [e[key] for e in table if key in e]
        if vals:
            out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    out["every_seed_ok"] = bool(table) and all(e["ok"] for e in table)
    out["median_final_ok"] = bool(table) and out["final"]["median"] >= 0.85
    return out


def write_outputs(root: pathlib.Path, rows: list[dict], summary: dict) -> None:
    (root / "sweep.json").write_text(json.dumps({"summary": summary, "runs": rows}, indent=2))
    with open(root / "sweep.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seed", "start", "final", "rl_curve", "control_equal_minutes", "control_steps", "control_best",
                    "rl_minutes", "ok"])
        for e in summary["table"]:
            w.writerow([e["seed"], e["start"], e["final"], " ".join(f"{k}:{p:.3f}" for k, p in e["rl"]),
                        e.get("control", ""), e.get("control_steps", ""), e.get("control_best", ""),
                        f"{e['rl_minutes']:.2f}", e["ok"]])
    plot_sweep(rows, root / "sweep.png", summary.get("sft_steps", 0))


def median_curve(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Per eval index, the median (minutes, pass) over curves that share one eval schedule (the shortest's length)."""
    n = min((len(c) for c in curves), default=0)
    return [(statistics.median(c[j][0] for c in curves), statistics.median(c[j][1] for c in curves))
            for j in range(n)]


def plot_sweep(rows: list[dict], out: pathlib.Path, sft_steps: int = 0) -> pathlib.Path:
    """Held-out pass rate against work minutes: each seed thin (RL solid from the start, the control dashed from
    its branch point, SFT step `sft_steps`), medians thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for kind, style in (("rl", "-"), ("control", "--")):
        curves = [[p for p in r[kind] if kind == "rl" or p["version"] >= sft_steps] for r in rows if r.get(kind)]
        for i, c in enumerate(curves):
            ax.plot([p["minutes"] for p in c], [p["pass"] for p in c], style, color=f"C{i % 10}", lw=0.8, alpha=0.6)
        med = median_curve([[(p["minutes"], p["pass"]) for p in c] for c in curves])
        if med:  # every seed has the same eval schedule: the median of each eval's minutes and pass rate
            label = "median, SFT then RL" if kind == "rl" else "median, SFT only (control)"
            ax.plot([m for m, _ in med], [p for _, p in med], style, color="black", lw=2.2, label=label)
    ax.set_xlabel("work minutes since the run started")
    ax.set_ylabel("held-out pass rate (greedy)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(f"{len(rows)} seeds: each seed thin (RL solid, control dashed), medians thick")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def run_sweep(config, seeds: list[int], workdir: str | pathlib.Path, *, control: bool = True,  # noqa: ANN001
              min_gain: float = 0.25) -> dict:
    """Runs (or resumes) every seed in order, rewriting the table after each; returns the summary."""
    root = pathlib.Path(workdir).absolute()
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in seeds:
        rows.append(run_seed(config, seed, root, control=control))
        summary = summarize(rows, int(config.sft.steps), min_gain)
        write_outputs(root, rows, summary)
    return summary
