"""Static flags on a task's checker: what an adversarial policy could exploit that grading alone does not stop.

Read from the files of `reward/` (no sandbox, milliseconds per task), so a whole task set is audited in seconds
(`python -m harness_env.tasks audit DIR`). Each flag carries the first line that raised it:

- `executes_code`: the checker executes or imports something it does not ship (subprocess, os.system,
  exec, importlib, a sys.path change; a shell line running a script outside reward/): the agent's code then runs
  with the checker's rights and can print the score it likes (a module calling `os._exit(0)` in a test runner).
- `reads_inputs`: the checker reads the task's input files from the workspace. ClawGym checkers recompute their
  expected answers from them, so an agent that empties the inputs and writes empty outputs scores 1.0; the rollout
  records `meta.inputs_changed` for this reason.
- `ships_answer_files`: reward/ holds data files (expected answers). Grading removes every link into reward/
  before the copy (harness_env/tasks/sanitize.py), so this is informational: where a link attack would have paid.
  Not raised for web tasks (env/): their checker compares the app's server-side state, written by the app in its
  own sandbox, never a workspace file an output could link from.

A task may declare how its checker guards against the agent's code (`metadata.agent_code_guard`, a sentence:
e.g. it compares the values the code returns, never an exit status); `executes_code` is then not raised
statically, and validation (harness_env/tasks/validate.py) proves the declaration: with every code file of the
workspace replaced by one that exits 0 at once, the task must still score below 1.0 (else `exit_fooled`).

Heuristics, by design conservative (a flag is a place to look, not a verdict); `select_tasks(exclude_flags=...)`
and `config.tasks.exclude_flags` leave flagged tasks out of a run.
"""

from __future__ import annotations

import pathlib
import re

FLAGS = ("executes_code", "reads_inputs", "ships_answer_files")
_PY_EXEC = re.compile(r"\b(subprocess|os\.system\s*\(|os\.popen\s*\(|os\.exec\w*\s*\(|runpy|importlib|__import__\s*\("
                      r"|\bexec\s*\(|spec_from_file_location|sys\.path\.(insert|append)\s*\()")
_SH_RUN = re.compile(r"(?:^|[;&|(`]\s*|\bthen\s+|\bdo\s+)(?:exec\s+)?(python3?|bash|sh|node|pytest|npm|make)\s+"
                     r"(?!-c\b)(\S+)")
_INPUTS = re.compile(r"""(?:["'/]input(?:s|_files)?/|["']input(?:s)?["'])""")
_CODE_SUFFIXES = {".py", ".sh", ".bash", ".js"}


def _lines(path: pathlib.Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def _runs_script_outside_reward(line: str) -> bool:
    for _, target in _SH_RUN.findall(line):
        t = target.strip("\"'")
        if "reward/" not in t and not t.startswith("-") and "$(dirname" not in t:
            return True
    return False


_EXEC_MODULES = {"subprocess", "importlib", "runpy", "pty", "multiprocessing"}
_EXEC_CALLS = {"system", "popen", "execv", "execvp", "execl", "execlp", "spawnv", "exec", "__import__",
               "spec_from_file_location", "import_module", "run_path", "run_module"}


def _py_findings(text: str) -> tuple[int | None, int | None]:
    """(line of the first construct that runs code it does not ship, line of the first path into input/), by
    the syntax tree (a word inside a string is no finding); None where there is none."""
    import ast

    tree = ast.parse(text)
    runs, inputs = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n.split(".")[0] in _EXEC_MODULES for n in names):
                runs.append(node.lineno)
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            target = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
            if name in _EXEC_CALLS or (target == "sys.path" and name in ("insert", "append", "extend")):
                runs.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            v = node.value.strip("/")
            if v in ("input", "inputs") or v.startswith(("input/", "inputs/")):
                inputs.append(node.lineno)
    return min(runs, default=None), min(inputs, default=None)


def flags_of(task_root: str | pathlib.Path) -> dict[str, str]:
    """flag -> the first `file:line: text` that raised it, for the task folder `task_root`."""
    import json

    rdir = pathlib.Path(task_root) / "reward"
    out: dict[str, str] = {}
    try:
        meta = json.loads((pathlib.Path(task_root) / "data_entry.json").read_text()).get("metadata") or {}
    except (OSError, ValueError, AttributeError):
        meta = {}
    guarded = isinstance(meta, dict) and bool(meta.get("agent_code_guard"))
    web = (pathlib.Path(task_root) / "env").is_dir()
    files = sorted(p for p in rdir.rglob("*") if p.is_file() and not p.is_symlink()) if rdir.is_dir() else []
    for p in files:
        rel = p.relative_to(rdir)
        if p.suffix not in _CODE_SUFFIXES:
            if not web:
                out.setdefault("ships_answer_files", str(rel))
            continue
        lines = _lines(p)

        def where(i: int, rel=rel, lines=lines) -> str:
            return f"{rel}:{i}: {lines[i - 1].strip()[:120]}"

        if p.suffix == ".py":
            try:
                run, inp = _py_findings("\n".join(lines))
            except (SyntaxError, ValueError):  # unparsable: by the text, conservatively
                run = next((i for i, t in enumerate(lines, 1) if _PY_EXEC.search(t)), None)
                inp = next((i for i, t in enumerate(lines, 1) if _INPUTS.search(t)), None)
        else:
            run = next((i for i, t in enumerate(lines, 1) if _runs_script_outside_reward(t.split("#", 1)[0])), None)
            inp = next((i for i, t in enumerate(lines, 1) if _INPUTS.search(t.split("#", 1)[0])), None)
        if run is not None and not guarded:
            out.setdefault("executes_code", where(run))
        if inp is not None:
            out.setdefault("reads_inputs", where(inp))
    return out


def audit(task_roots: list[pathlib.Path]) -> dict:
    """{"tasks": n, "counts": {flag: n}, "flagged": {task: {flag: evidence}}} over `task_roots`."""
    flagged = {}
    for root in task_roots:
        f = flags_of(root)
        if f:
            flagged[pathlib.Path(root).name] = f
    counts = {flag: sum(flag in f for f in flagged.values()) for flag in FLAGS}
    return {"tasks": len(task_roots), "counts": counts, "any": len(flagged), "flagged": flagged}
