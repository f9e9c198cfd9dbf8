"""Which tasks a run uses: the one task-selection function behind `launch.eval` and the RL loop.

A source is `library` (ours), `make_file` / `family` (the generated make_file family), `web` (the generated
web task family: 14 templates x 10 variants, its own split by variant), `visual` (web tasks whose answer is on
the screen only: 3 templates x 20 variants), `relay` (the two-call family that CLIs
learn through, split by task number), `recover` (its error-recovery variant), or a folder of
ClawGym-format tasks (e.g. ../shared/clawgym/train, 2000 real tasks). A folder is split into train /
held-out by a seeded hash of each task's folder name: stable when tasks are added or removed, different
for another seed, and independent of the order anything is listed in. The family keeps its own split
(by (name, word) pair, so every held-out word is also seen in training). `limit` then draws a seeded
random sample (returned in name order), so `--limit=50` is a fair sample of a 2000-task folder rather
than its first 50 names.
"""

from __future__ import annotations

import hashlib
import pathlib
import random

from harness_env.tasks import family, recover, relay, visual_family, web_family
from harness_env.tasks.loader import TaskError, discover

LIBRARY = pathlib.Path(__file__).with_name("library")
SPLITS = ("all", "train", "heldout")
FAMILY = ("make_file", "family")
WEB = "web"  # the web task family (harness_env/tasks/web_family.py), generated like the make_file family
RELAY = "relay"  # the two-call relay family (harness_env/tasks/relay.py), split by task number
RECOVER = "recover"  # the error-recovery family (harness_env/tasks/recover.py), split by task number
VISUAL = "visual"  # web tasks whose answer is on the screen only (harness_env/tasks/visual_family.py)
_GENERATED = {"make_file": family, "family": family, WEB: web_family, RELAY: relay, RECOVER: recover,
              VISUAL: visual_family}


def oracle_reply(prompt_text: str) -> str:
    """The scripted solver's next reply (reference `bash` format) for a prompt of a generated shell family: the
    family whose `is_task` knows the prompt's query answers, the make_file family otherwise (its oracle says "No
    task." to a prompt it does not know either)."""
    for fam in dict.fromkeys(_GENERATED.values()):
        if hasattr(fam, "is_task") and fam.is_task(prompt_text):
            return fam.oracle_reply(prompt_text)
    return family.oracle_reply(prompt_text)


def split_of(name: str, *, seed: int = 0, heldout_fraction: float = 0.1) -> str:
    """`heldout` for a `heldout_fraction` share of task names (seeded hash), else `train`."""
    h = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big")
    return "heldout" if h / 2.0**64 < heldout_fraction else "train"


def select_tasks(source: str, *, split: str = "all", seed: int = 0, heldout_fraction: float = 0.1,
                 limit: int | None = None, scratch: str | pathlib.Path | None = None,
                 exclude_flags: tuple[str, ...] = ()) -> list[pathlib.Path]:
    """The task folders of `split` from `source`, at most `limit` of them (seeded sample), leaving out the tasks
    whose checker raises any of `exclude_flags` (harness_env/tasks/audit.py).

    `scratch` is where the make_file family is generated (required for it). Raises TaskError for an
    unknown split or a source that is neither a known name nor a folder."""
    if split not in SPLITS:
        raise TaskError(f"split {split!r} not in {SPLITS}")
    if not 0.0 <= heldout_fraction <= 1.0:
        raise TaskError(f"heldout_fraction {heldout_fraction} not in [0, 1]")
    if source in _GENERATED:
        if scratch is None:
            raise TaskError(f"the {source} family needs a scratch dir to be generated into")
        sub = {WEB: "web_tasks", RELAY: "relay_tasks", RECOVER: "recover_tasks", VISUAL: "visual_tasks"}.get(
            source, "tasks")
        out = pathlib.Path(scratch) / sub / split
        if not out.is_dir() or not any(out.iterdir()):
            _GENERATED[source].generate(out, split=split, seed=seed)
        dirs = sorted(p for p in out.iterdir() if p.is_dir())
    else:
        folder = LIBRARY if source == "library" else pathlib.Path(source)
        if not folder.is_dir():
            raise TaskError(f"task source {source!r}: not library, make_file, nor a task directory")
        dirs = discover(folder)
        if split != "all":
            dirs = [d for d in dirs if split_of(d.name, seed=seed, heldout_fraction=heldout_fraction) == split]
    if exclude_flags:
        from harness_env.tasks.audit import FLAGS, flags_of

        unknown = sorted(set(exclude_flags) - set(FLAGS))
        if unknown:
            raise TaskError(f"exclude_flags {unknown} not in {FLAGS}")
        dirs = [d for d in dirs if not set(flags_of(d)) & set(exclude_flags)]
    if limit is not None and limit >= 0 and limit < len(dirs):
        dirs = sorted(random.Random(seed).sample(dirs, limit))
    return dirs


def parse_spec(spec: str) -> tuple[str, dict]:
    """`launch.eval --tasks` strings: `library` | `family:SPLIT[:N]` (as before) | `web:SPLIT[:N]` |
    `relay:SPLIT[:N]` | `recover:SPLIT[:N]` | `make_file` | `web` | `relay` | `recover` | DIR; returns (source,
    overrides for select_tasks)."""
    if spec.startswith(("family:", "web:", "relay:", "recover:")):
        kind, split, *n = spec.split(":")
        return kind, {"split": split, **({"limit": int(n[0])} if n else {})}
    return spec, {}
