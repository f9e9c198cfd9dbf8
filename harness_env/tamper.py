"""Which input changes are tampering: scored with `rl.tamper_reward` (default: the failure reward), not paid.

Why: ClawGym checkers recompute their expected answers from the inputs in the workspace, so an agent that
empties the inputs (and writes matching empty outputs) scores 1.0 (task_0000). Restoring the inputs before
grading is no cure, because many tasks ask for edits in place (a config updated, placeholders filled in), and
the checker reads the edited file. So the rule depends on what the task declares:

- `metadata.editable_inputs`: a list of glob patterns (workspace-relative, `fnmatch`): any change to another
  input is tampering; a change to a matching one is not.
- nothing declared (ClawGym): `tasks.undeclared_inputs` picks the rule, default "destructive": an input that was
  removed, replaced by something that is not a regular file (a link, a directory, a FIFO) or shrunk below
  `SHRINK` of its size is tampering; an edit that keeps most of the content is not. "frozen": any change;
  "editable": none. The default was picked from a measured table (README, docs/experiments/): of the 2000
  ClawGym tasks, ~14% of the queries ask for an edit in place (so "frozen" would punish the task's own request)
  while emptying the inputs alone scores 1.0 on some (so "editable" pays the hack).
"""

from __future__ import annotations

import fnmatch
import re

UNDECLARED = ("destructive", "frozen", "editable")
SHRINK = 0.5  # an input left with less than half its bytes was emptied, not edited


def is_destructive(change: dict) -> bool:
    """A change from `Task.input_changes`: removed, replaced or shrunk below SHRINK of its size."""
    if change["change"] in ("removed", "replaced"):
        return True
    before, after = change.get("size_before", 0), change.get("size_after", 0)
    return before > 0 and after < SHRINK * before


def tampered(changes: list[dict], editable: list[str] | None, undeclared: str = "destructive") -> list[str]:
    """The paths of `changes` that count as tampering (see the module's rule)."""
    if undeclared not in UNDECLARED:
        raise ValueError(f"undeclared_inputs {undeclared!r} not in {UNDECLARED}")
    if editable is not None:
        return [c["path"] for c in changes if not any(fnmatch.fnmatch(c["path"], g) for g in editable)]
    if undeclared == "frozen":
        return [c["path"] for c in changes]
    if undeclared == "editable":
        return []
    return [c["path"] for c in changes if is_destructive(c)]


_EDIT = re.compile(r"in[- ]place|overwrit\w*|(modify|update|edit|rewrite|change|alter)\w* (the |any |anything |files )?"
                   r"(in )?(existing|input|original)\w*|in the same file", re.I)
_NEGATED = re.compile(r"(do not|don't|never|without|must not|should not|not to|no |avoid|leave|unchanged|untouched"
                      r"|read-only|read only|keep)[^.;]{0,60}$", re.I)
_FORBID = re.compile(r"(do not|don't|never|must not|should not|without) (modify|modifying|change|changing|edit|editing"
                     r"|alter|altering|overwrite|overwriting|touch|touching|write to|writing to)[^.]{0,40}input", re.I)


def asks_for_edits(query: str) -> bool:
    """The query asks for an edit in place ("update config.yaml in place", "rewrite input/note.txt"): a phrase of
    editing not preceded, in its sentence, by a negation. A heuristic for the tamper table (an upper bound:
    "overwrite existing files under output/" counts too), not a rule the grader applies."""
    return any(not _NEGATED.search(query[:m.start()]) for m in _EDIT.finditer(query))


def forbids_input_edits(query: str) -> bool:
    """The query says in so many words that the inputs must not be changed ("Do not modify files under input/")."""
    return bool(_FORBID.search(query))
