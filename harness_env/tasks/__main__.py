"""Task tools: `python -m harness_env.tasks COMMAND ...`

  family   --split train|heldout|all [--n N] [--seed S] --out DIR   write make_file family tasks
  web      --split train|heldout|all [--n N] [--seed S] [--per-template K] [--validate] --out DIR
                                                                     write web family tasks (validated: plan
                                                                     1.0, nothing 0.0, mistake 0.0)
  synth    [--seeds DIR] --per-seed N [--seed S] --out DIR           validated variants of the seed tasks
  validate DIR                                                       reference solution 1.0, empty < 1.0
  audit DIR [--json FILE]                                            static checker flags (tasks/audit.py)
Validation and synthesis run every checker in a bwrap sandbox (the path rollouts use).
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys

from harness_env.sandbox import get_backend
from harness_env.tasks import LIBRARY, discover, family, synth
from harness_env.tasks.validate import validate_task


async def _validate(dirs: list[pathlib.Path]) -> int:
    backend = get_backend("bwrap")
    bad = 0
    for d in dirs:
        v = await validate_task(backend, d)
        bad += not v.ok
        print(f"{'ok  ' if v.ok else 'FAIL'} {v.task_id}: solution={v.solution_reward} empty={v.empty_reward} "
              f"{v.message}")
    return 1 if bad else 0


def _audit(root: pathlib.Path, out: pathlib.Path | None) -> int:
    import json

    from harness_env.tasks.audit import FLAGS, audit

    r = audit(discover(root))
    print(f"{r['tasks']} tasks, {r['any']} flagged: " + ", ".join(f"{f} {r['counts'][f]}" for f in FLAGS))
    if out is not None:
        out.write_text(json.dumps(r, indent=1))
    return 0


def _web(a) -> int:  # noqa: ANN001
    from harness_env.tasks import web_family
    from harness_env.web.validate import validate

    dirs = web_family.generate(a.out, a.split, a.n, a.seed, per_template=a.per_template)
    print(f"wrote {len(dirs)} {a.split} web tasks to {a.out}")
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
    w = sub.add_parser("web")
    w.add_argument("--split", default="train", choices=["train", "heldout", "all"])
    w.add_argument("--n", type=int, default=None)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--per-template", type=int, default=10)
    w.add_argument("--validate", action="store_true")
    w.add_argument("--out", required=True, type=pathlib.Path)
    s = sub.add_parser("synth")
    s.add_argument("--seeds", type=pathlib.Path, default=LIBRARY)
    s.add_argument("--per-seed", type=int, default=3)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", required=True, type=pathlib.Path)
    v = sub.add_parser("validate")
    v.add_argument("dir", type=pathlib.Path)
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
    if a.cmd == "web":
        return _web(a)
    if a.cmd == "synth":
        seeds = [d for d in discover(a.seeds) if synth.is_seed(d)]
        kept, failed = asyncio.run(synth.synthesize(get_backend("bwrap"), seeds, a.out, per_seed=a.per_seed,
                                                    seed=a.seed))
        for v_ in failed:
            print(f"dropped {v_.task_id}: {v_.message}")
        print(f"{len(kept)} validated variants of {len(seeds)} seeds in {a.out}")
        return 0
    return asyncio.run(_validate(discover(a.dir)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
