"""The layering: research/ (the JAX library, the shim, the engine) never imports harness_env/ (sandboxes,
harnesses, tasks, the RL loop through them), so the library stands alone and the dependency runs one way."""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]


def _imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_research_never_imports_harness_env():
    bad = {str(p.relative_to(REPO)): sorted(m for m in _imports(p) if m.split(".")[0] == "harness_env")
           for p in (REPO / "research").rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from harness_env.tasks import family\n")
    assert "harness_env.tasks" in _imports(f)


# the core: what the loop trains with and the loop itself. An import inside a function there hid a dependency
# (research/rl/config.py, research/train/aot.py); modules outside it may defer optional or heavy imports
# (engine back-ends, bench suites, the Pallas kernels' mutual import with attention_ops).
CORE = ("research/rl", "research/train", "research/trees", "research/data", "harness_env/rl")


def _deferred_project_imports(path: pathlib.Path) -> list[str]:
    out = []
    for fn in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                        [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                out += [f"{fn.name}:{node.lineno} {m}" for m in mods
                        if m.split(".")[0] in ("research", "harness_env", "configs")]
    return out


def test_the_core_imports_its_dependencies_at_the_top():
    bad = {str(p.relative_to(REPO)): _deferred_project_imports(p) for d in CORE for p in (REPO / d).rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_deferred_import_check_sees_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef f():\n    from research.rl import config\n")
    assert _deferred_project_imports(f) == ["f:4 research.rl"]
