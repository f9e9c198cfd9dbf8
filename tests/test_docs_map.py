"""WORKSPACE.md and README.md stay true: every path, module, `module.name` and `python -m` command they cite exists.

WORKSPACE.md once documented `research/data/pipeline.make_dataset`, which did not exist, and omitted a launcher;
a map that drifts is worse than none. Checked without importing the project: paths on disk, `python -m X`
by the module's file, `pkg.mod.name` and `path/mod.name` by a definition of `name` in the module's source, and
in the map's table each bare file name (`loop.py`) in the row of its folder.
"""

import importlib.util
import itertools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ("WORKSPACE.md", "README.md", "docs/design.md")
TOP = ("research", "harness_env", "launch", "configs", "notebooks", "tests", "docs", ".ci")
PATH = re.compile(r"(?<![\w/.])((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./{},*+-]*)")
DOTTED = re.compile(r"(?<![\w/.])(?<!-m )((?:research|harness_env|launch|configs)(?:\.\w+)+)")
COMMAND = re.compile(r"python -m ([\w.]+)")


def _spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text) + re.findall(r"```\n(.*?)```", text, re.S)


def _braces(s: str) -> list[str]:
    """`a/{b,c}.py` -> [a/b.py, a/c.py] (one level, any number of groups)."""
    parts = re.split(r"\{([^{}]*)\}", s)
    fixed, alts = parts[0::2], [p.split(",") for p in parts[1::2]]
    return ["".join(x for pair in itertools.zip_longest(fixed, combo, fillvalue="") for x in pair)
            for combo in itertools.product(*alts)] if alts else [s]


def _defines(module_file: pathlib.Path, name: str) -> bool:
    src = module_file.read_text()
    return bool(re.search(rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*{name}\s*(?::[^=\n]+)?=|"
                          rf"^\s*from\s+\S+\s+import\s+.*\b{name}\b|^{name}\b", src, re.M))


def _module_file(dotted: str) -> pathlib.Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py", base / "__main__.py"):
        if cand.exists():
            return cand
    return None


def _check_path(ref: str) -> str | None:
    ref = ref.rstrip(".,;:)")
    ref = re.sub(r":[\w,]*$", "", ref)  # configs/x.py:arg
    for one in _braces(ref):
        for piece in one.split("+"):
            if not piece or "*" in piece and list(ROOT.glob(piece)):
                continue
            p = ROOT / piece
            if p.exists() or re.search(r"(^|/)[A-Z][A-Z_]*(\.|/|$)", piece):  # placeholders: configs/NAME.py
                continue
            stem, _, attr = piece.rpartition(".")  # research/data/pipeline.step_stream
            mod = ROOT / f"{stem}.py"
            if attr and mod.exists() and _defines(mod, attr):
                continue
            return f"{piece} (from {ref})"
    return None


def _check_dotted(ref: str) -> str | None:
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        f = _module_file(".".join(parts[:i]))
        if f is not None:
            rest = parts[i:]
            return None if not rest or _defines(f, rest[0]) else f"{ref} ({rest[0]} not defined in {f.name})"
    return f"{ref} (no such module)"


def _table_rows(text: str):
    """(folder, bare file names) of each map row whose first cell is one folder."""
    for line in text.splitlines():
        m = re.match(r"\| `([\w/]+/)` \|(.*)\|\s*$", line)
        if m:
            yield m.group(1), re.findall(r"`([\w]+(?:\.(?:py|cc|\{py,cc\})))`", m.group(2))


def _problems(doc: str) -> list[str]:
    text = (ROOT / doc).read_text()
    bad = []
    for span in _spans(text):
        bad += [b for b in map(_check_path, PATH.findall(span)) if b]
        bad += [b for b in map(_check_dotted, DOTTED.findall(span)) if b]
        bad += [f"python -m {m}" for m in COMMAND.findall(span) if importlib.util.find_spec(m.split(".")[0]) is None
                or (m.split(".")[0] in ("research", "harness_env", "launch") and _module_file(m) is None)]
    for folder, names in _table_rows(text):
        for n in names:
            if not any(next((ROOT / folder).rglob(f), None) for f in _braces(n)):
                bad.append(f"{folder}{n} (table row)")
    return bad


@pytest.mark.parametrize("doc", DOCS)
def test_every_citation_exists(doc):
    bad = _problems(doc)
    assert not bad, bad


def test_the_map_is_a_map():
    text = (ROOT / "WORKSPACE.md").read_text()
    assert len(text.splitlines()) <= 150, "WORKSPACE.md is the map; narratives go to docs/experiments/"
    assert "make_dataset" not in text


def test_the_checker_catches_drift(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("See `research/data/pipeline.make_dataset`, `research.rl.config.NoSuch`, `python -m launch.nope`,\n"
                   "`configs/{tiny,nope}.py` but `research/data/pipeline.step_stream` and `launch/` are fine.\n"
                   "| `research/rl/` | `config.py`, `gone.py` |\n")
    bad = _problems(str(doc))  # an absolute path: ROOT / doc is doc
    assert bad == ["research/data/pipeline.make_dataset (from research/data/pipeline.make_dataset)",
                   "research.rl.config.NoSuch (NoSuch not defined in config.py)", "python -m launch.nope",
                   "configs/nope.py (from configs/{tiny,nope}.py)", "research/rl/gone.py (table row)"], bad
