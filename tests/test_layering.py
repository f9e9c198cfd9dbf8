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


# the core (what the loop trains with, and the loop itself) and the packages where imports inside functions hid
# import cycles (sandbox/base.py <-> its backends, images/build.py <-> docker_sandbox.py, harnesses/base.py and
# install.py <-> each other through web/browser.py, attention_pallas.py <-> attention_ops.py). Each cycle was
# broken by moving code to where the dependency runs one way; an import inside a function there hid it.
CHECKED = ("research/rl", "research/train", "research/trees", "research/data", "harness_env/rl",
           "harness_env/sandbox", "harness_env/images", "harness_env/harnesses", "research/models")
PROJECT = ("research", "harness_env", "configs", "launch")
# The only imports that may wait for the function that needs them there: optional or heavy dependencies a run
# may never touch. No project module is here (none imports one of these at its top), so a deferred project
# import is always a cycle dodge or a hidden dependency; nor is the standard library or a core dependency.
OPTIONAL_OR_HEAVY = {
    "docker": "optional: only the docker backend and the image build talk to dockerd",
    "kubernetes": "optional and heavy (~0.4 s): only the kubernetes backend, with a cluster, needs the client",
    "matplotlib": "heavy (~0.5 s with pyplot): only a run that writes plots (metrics, sweeps) draws",
    "tensorboardX": "optional and heavy (~1.6 s): only with TensorBoard logging on",
    "huggingface_hub": "optional: only a tokenizer named by hub id, not a local directory, is downloaded",
    "tqdm": "optional: progress bars are drawn only on a terminal (research/rl/console.py)",
    "jax.experimental.pallas": "the Triton / Mosaic back-ends (triton, tpu) load only when a kernel is built for "
                               "that target",
}


def _deferred_imports(path: pathlib.Path) -> list[str]:
    """Every import inside a function (a method too) of `path`: "function:line module"."""
    out = []
    for fn in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                        [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                out += [f"{fn.name}:{node.lineno} {m}" for m in mods]
    return out


def _allowed(module: str) -> bool:
    return any(module == k or module.startswith(k + ".") for k in OPTIONAL_OR_HEAVY)


def _unexplained_deferred_imports(path: pathlib.Path) -> list[str]:
    return sorted(set(d for d in _deferred_imports(path) if not _allowed(d.split(" ")[1])))


def _deferred_project_imports(path: pathlib.Path) -> list[str]:
    return [d for d in _deferred_imports(path) if d.split(" ")[1].split(".")[0] in PROJECT]


def test_the_checked_packages_import_their_dependencies_at_the_top():
    files = [p for d in CHECKED for p in (REPO / d).rglob("*.py")]
    bad = {str(p.relative_to(REPO)): v for p in files if (v := _unexplained_deferred_imports(p))}
    assert bad == {}, ("import it at the top (break a cycle by moving code), or add an optional or heavy "
                       "dependency to OPTIONAL_OR_HEAVY with the reason")


def test_the_deferred_import_check_sees_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef f():\n    from research.rl import config\n")
    assert _deferred_project_imports(f) == ["f:4 research.rl"]
    assert _unexplained_deferred_imports(f) == ["f:4 research.rl"]


def test_only_listed_optional_or_heavy_imports_may_wait(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("class B:\n    def m(self):\n        import hashlib\n        import matplotlib.pyplot as plt\n"
                 "        from docker.types import Mount\n        from dockerfile import x\n"
                 "        from harness_env.sandbox import bwrap\n")
    assert _unexplained_deferred_imports(f) == ["m:3 hashlib", "m:6 dockerfile", "m:7 harness_env.sandbox"]
    assert all(reason for reason in OPTIONAL_OR_HEAVY.values())
    assert not any(k.split(".")[0] in PROJECT for k in OPTIONAL_OR_HEAVY)
