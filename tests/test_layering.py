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
