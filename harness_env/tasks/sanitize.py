"""What the agent left in its workspace that could fool, hang or break the checker, removed before grading.

Runs INSIDE the verifier's fresh sandbox (stdlib only, `python3 -I -S -c`), after the agent's sandbox is closed
(nothing of the agent runs, so nothing races it) and before `reward/` is copied in, so links are resolved by the
kernel in exactly the view the checker will have. Why each rule:

- a symlink whose target resolves into `<workspace>/reward/` or outside the workspace is removed: the checker
  would read the task's own expected answer (`ln -s reward/expected.txt out.txt` scored 1.0) or a file of the
  system through it. Links that stay inside the workspace (to an input, to another output) are kept. Hard links
  cannot reach either: `reward/` is copied in after this (new inodes), and a link out of the workspace mount
  fails with EXDEV inside the sandbox (tests/test_grader_links.py checks both).
- FIFOs, sockets and device nodes are removed: no task's output is one, and a checker that opens a FIFO blocks
  until the reward timeout (`mkfifo out.txt` cost 60 s and ended as reward_error).
- regular files larger than the workspace's disk cap are removed: only a sparse file can be, and a checker
  reading a 400 GB sparse file dies or times out.
- the owner's rwx on directories and rw on files are restored (`chmod 000 .` made reward.sh fail with
  "permission denied"): the checker then grades what the agent wrote, and an agent cannot turn its failure into
  a grading error.

Each removal is reported (the rollout's `meta["sanitized"]`); a workspace with more than `max_entries` entries is
not walked to the end and grading refuses it (RewardError), since an unvisited link could still fool the checker.
"""

from __future__ import annotations

import json

SCRIPT = r"""
import json, os, stat, sys
ws, rname, max_bytes, max_entries = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rules = set(sys.argv[5].split(",")) if len(sys.argv) > 5 else {"links", "special", "oversize", "modes"}
rdir = os.path.join(ws, rname)
rep = {"links": [], "special": [], "oversize": [], "modes": 0, "entries": 0, "truncated": False, "errors": []}

def rel(p):
    return os.path.relpath(p, ws)

def allowed(real):
    inside = real == ws or real.startswith(ws + os.sep)
    return inside and real != rdir and not real.startswith(rdir + os.sep)

def mode(p, st, want):
    if "modes" not in rules:
        return
    m = stat.S_IMODE(st.st_mode)
    if m & want != want:
        try:
            os.chmod(p, m | want)
            rep["modes"] += 1
        except OSError as e:
            rep["errors"].append(f"chmod {rel(p)}: {e.strerror}")

def remove(p, kind):
    if kind not in rules:
        return
    try:
        os.unlink(p)
        rep[kind].append(rel(p))
    except OSError as e:
        rep["errors"].append(f"unlink {rel(p)}: {e.strerror}")

mode(ws, os.lstat(ws), 0o700)
stack = [ws]
while stack:
    d = stack.pop()
    try:
        names = sorted(os.listdir(d))
    except OSError as e:
        rep["errors"].append(f"list {rel(d)}: {e.strerror}")
        continue
    for n in names:
        rep["entries"] += 1
        if rep["entries"] > max_entries:
            rep["truncated"] = True
            stack = []
            break
        p = os.path.join(d, n)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            if not allowed(os.path.realpath(p)):
                remove(p, "links")
        elif stat.S_ISDIR(st.st_mode):
            mode(p, st, 0o700)
            stack.append(p)
        elif stat.S_ISREG(st.st_mode):
            if st.st_size > max_bytes:
                remove(p, "oversize")
            else:
                mode(p, st, 0o600)
        else:
            remove(p, "special")
print(json.dumps(rep))
"""


RULES = ("links", "special", "oversize", "modes")  # every rule, always; a test switches one off to prove it acts


def argv(workspace_dir: str, reward_dirname: str, max_file_bytes: int, max_entries: int) -> list[str]:
    """The verifier-sandbox command that sanitizes `workspace_dir` (its report is one JSON line on stdout)."""
    return ["/usr/bin/python3", "-I", "-S", "-c", SCRIPT, workspace_dir, reward_dirname, str(max_file_bytes),
            str(max_entries), ",".join(RULES)]


def parse_report(stdout: str) -> dict:
    """The script's report; ValueError when its last line is not one."""
    lines = stdout.strip().splitlines()
    rep = json.loads(lines[-1]) if lines else None
    if not isinstance(rep, dict) or "entries" not in rep:
        raise ValueError(f"no sanitizer report in {stdout[-300:]!r}")
    return rep
