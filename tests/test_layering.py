"""The layering: research/ (the JAX library, the shim, the engine) never imports harness_env/ (sandboxes,
harnesses, tasks, the RL loop through them), so the library stands alone and the dependency runs one way.
Inside research/, the model (research/models) never imports the serving layer (research/serving): the engine
builds on the model (its CPU kernels come in as injected ops), so the trainer's model never needs the engine."""

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]


def _imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import module`
    return out


def test_research_never_imports_harness_env():
    bad = {str(p.relative_to(REPO)): sorted(m for m in _imports(p) if m.split(".")[0] == "harness_env")
           for p in (REPO / "research").rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from harness_env.tasks import family\n")
    assert "harness_env.tasks" in _imports(f)


def _serving(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if m == "research.serving" or m.startswith("research.serving."))


def test_models_never_import_serving():
    bad = {str(p.relative_to(REPO)): _serving(_imports(p)) for p in (REPO / "research/models").rglob("*.py")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_serving_check_sees_every_import_form(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from research import serving\nimport research.serving.api\n"
                 "def f():\n    from research.serving.cpu_kernels import OPS\n")
    assert _serving(_imports(f)) == ["research.serving", "research.serving.api", "research.serving.cpu_kernels",
                                     "research.serving.cpu_kernels.OPS"]


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
