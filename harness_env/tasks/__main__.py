"""Task tools: `python -m harness_env.tasks COMMAND ...`

  family   --split train|heldout|all [--n N] [--seed S] --out DIR   write make_file family tasks
  web      --split train|heldout|all [--n N] [--seed S] [--per-template K] [--validate] --out DIR
                                                                     write web family tasks (validated: plan
                                                                     1.0, nothing 0.0, mistake 0.0)
  visual   (the same options)                                        write visual web family tasks (the answer
                                                                     is on the screen only)
  synth    [--seeds DIR] --per-seed N [--seed S] --out DIR           validated variants of the seed tasks
  validate DIR [--jsonl FILE] [--concurrency N] [--emptied]          reference solution (if any) 1.0, empty < 1.0,
                                                                     the untouched workspace grades without error
                                                                     below 1.0; static flags; --emptied also grades
                                                                     with every input emptied (the tamper table).
                                                                     Resumable: rows already in FILE are kept.
  audit DIR [--json FILE]                                            static checker flags (tasks/audit.py)
Validation and synthesis run every checker in a bwrap sandbox (the path rollouts use).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import sys

from harness_env.sandbox import get_backend
from harness_env.tasks import LIBRARY, discover, family, synth
from harness_env.tasks.validate import validate_task


async def _validate(dirs: list[pathlib.Path], jsonl: pathlib.Path | None, concurrency: int, emptied: bool) -> int:
    import dataclasses
    import json

    from harness_env.tasks.validate import grade_emptied, load_task

    backend = get_backend("bwrap")
    done = {}
    if jsonl is not None and jsonl.exists():
        for line in jsonl.read_text().splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                done[row["dir"]] = row
    todo = [d for d in dirs if str(d) not in done]
    sem, lock = asyncio.Semaphore(max(1, concurrency)), asyncio.Lock()

    async def one(d: pathlib.Path) -> None:
        async with sem:
            v = await validate_task(backend, d)
            row = {"dir": str(d), **dataclasses.asdict(v), "ok": v.ok}
            if emptied and v.untouched_reward is not None:
                task = load_task(d)
                if task.input_dir.is_dir():
                    row["emptied_reward"], row["emptied_error"] = await grade_emptied(backend, task)
        async with lock:
            done[str(d)] = row
            if jsonl is not None:
                with jsonl.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            if len(dirs) <= 50 or not row["ok"]:
                print(f"{'ok  ' if row['ok'] else 'FAIL'} {v.task_id}: solution={v.solution_reward} "
                      f"empty={v.empty_reward} untouched={v.untouched_reward} {v.message}")

    await asyncio.gather(*(one(d) for d in todo))
    rows = [done[str(d)] for d in dirs]
    print(json.dumps(summarize(rows)))
    return 0 if all(r["ok"] for r in rows) else 1


def summarize(rows: list[dict]) -> dict:
    """Counts over validation rows: the README's numbers for a task set."""
    from harness_env.tasks.audit import FLAGS

    n = len(rows)
    out = {"tasks": n, "ok": sum(r["ok"] for r in rows),
           "untouched_error": sum(r["untouched_reward"] is None for r in rows),
           "untouched_one": sum(r["untouched_reward"] == 1.0 for r in rows),
           "flags": {f: sum(f in (r.get("flags") or {}) for r in rows) for f in FLAGS},
           "exit_probed": sum(r.get("exit_fooled") is not None for r in rows),
           "exit_fooled": sum(r.get("exit_fooled") is True for r in rows)}
    if any("emptied_reward" in r for r in rows):
        out["emptied_graded"] = sum("emptied_reward" in r for r in rows)
        out["emptied_one"] = sum(r.get("emptied_reward") == 1.0 for r in rows)
        out["emptied_error"] = sum("emptied_reward" in r and r["emptied_reward"] is None for r in rows)
    return out


def _audit(root: pathlib.Path, out: pathlib.Path | None) -> int:
    import json

    from harness_env import tamper
    from harness_env.tasks.audit import FLAGS, audit
    from harness_env.tasks.loader import TaskError, load_task

    dirs = discover(root)
    r = audit(dirs)
    print(f"{r['tasks']} tasks, {r['any']} flagged: " + ", ".join(f"{f} {r['counts'][f]}" for f in FLAGS))
    queries = []
    for d in dirs:
        with contextlib.suppress(TaskError):
            queries.append(load_task(d).user_query)
    r["queries"] = {"asks_for_edits": sum(map(tamper.asks_for_edits, queries)),
                    "forbids_input_edits": sum(map(tamper.forbids_input_edits, queries))}
    print(f"queries: {r['queries']['asks_for_edits']} ask for an edit in place (upper bound), "
          f"{r['queries']['forbids_input_edits']} forbid changing the inputs")
    if out is not None:
        out.write_text(json.dumps(r, indent=1))
    return 0


def _web(a) -> int:  # noqa: ANN001
    from harness_env.tasks import visual_family, web_family
    from harness_env.web.validate import validate

    fam = visual_family if a.cmd == "visual" else web_family
    dirs = fam.generate(a.out, a.split, a.n, a.seed, per_template=a.per_template)
    print(f"wrote {len(dirs)} {a.split} {a.cmd} tasks to {a.out}")
    if not a.validate:
        return 0
    bad = 0
    for d in dirs:
        v = validate(d)
        bad += not v.ok
        print(f"{'ok  ' if v.ok else 'FAIL'} {v.task_id}: plan={v.solution} nothing={v.nothing} wrong={v.wrong} "
              f"{v.message}")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m harness_env.tasks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("family")
    f.add_argument("--split", default="train", choices=["train", "heldout", "all"])
    f.add_argument("--n", type=int, default=None)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--out", required=True, type=pathlib.Path)
    for name, per_template in (("web", 10), ("visual", 20)):
        w = sub.add_parser(name)
        w.add_argument("--split", default="train", choices=["train", "heldout", "all"])
        w.add_argument("--n", type=int, default=None)
        w.add_argument("--seed", type=int, default=0)
        w.add_argument("--per-template", type=int, default=per_template)
        w.add_argument("--validate", action="store_true")
        w.add_argument("--out", required=True, type=pathlib.Path)
    s = sub.add_parser("synth")
    s.add_argument("--seeds", type=pathlib.Path, default=LIBRARY)
    s.add_argument("--per-seed", type=int, default=3)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", required=True, type=pathlib.Path)
    v = sub.add_parser("validate")
    v.add_argument("dir", type=pathlib.Path)
    v.add_argument("--jsonl", type=pathlib.Path, default=None, help="one row per task; rows already there are kept")
    v.add_argument("--concurrency", type=int, default=2)
    v.add_argument("--emptied", action="store_true", help="also grade with every input file emptied")
    au = sub.add_parser("audit")
    au.add_argument("dir", type=pathlib.Path)
    au.add_argument("--json", type=pathlib.Path, default=None, help="write every task's flags here")
    a = p.parse_args(argv)
    if a.cmd == "audit":
        return _audit(a.dir, a.json)
    if a.cmd == "family":
        dirs = family.generate(a.out, a.split, a.n, a.seed)
        print(f"wrote {len(dirs)} {a.split} tasks to {a.out}")
        return 0
    if a.cmd in ("web", "visual"):
        return _web(a)
    if a.cmd == "synth":
        seeds = [d for d in discover(a.seeds) if synth.is_seed(d)]
        kept, failed = asyncio.run(synth.synthesize(get_backend("bwrap"), seeds, a.out, per_seed=a.per_seed,
                                                    seed=a.seed))
        for v_ in failed:
            print(f"dropped {v_.task_id}: {v_.message}")
        print(f"{len(kept)} validated variants of {len(seeds)} seeds in {a.out}")
        return 0
    return asyncio.run(_validate(discover(a.dir), a.jsonl, a.concurrency, a.emptied))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
