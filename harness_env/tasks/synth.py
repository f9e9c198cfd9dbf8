"""Task synthesis from seed tasks: variants with changed parameters/inputs and a consistent checker.

Two mechanisms, both deterministic from (seed, seed task, variant index):
  - parameters: `metadata.synthesis.params = {name: {"default": literal, "choices": [...]}}`. The seed is
    a concrete task; a variant replaces each default literal by a drawn choice in every text file
    (query, inputs, checker, solution), so query, checker and solution change together.
  - inputs: an optional `synth.py` next to data_entry.json with `mutate(rng, task_dir) -> dict` that
    rewrites the variant's inputs and the checker's expected values (e.g. fresh CSV rows + totals).
Every variant is validated (`validate.validate_task`: the reference solution gets 1.0 in a sandbox,
an empty workspace less); variants that fail are dropped and reported, never shipped.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import pathlib
import random
import shutil

from harness_env.sandbox.base import Backend
from harness_env.tasks.loader import load_task
from harness_env.tasks.validate import Validation, validate_task


def _rng(seed: int, task_id: str, index: int) -> random.Random:
    h = hashlib.sha256(f"{seed}:{task_id}:{index}".encode()).digest()
    return random.Random(int.from_bytes(h[:8], "little"))


def _substitute(root: pathlib.Path, mapping: dict[str, str]) -> None:
    """Replaces each default literal by its value in every text file and in file names (inputs too)."""
    if not mapping:
        return
    for p in sorted(root.rglob("*"), key=lambda q: -len(q.parts)):  # deepest first: renames stay valid
        name = p.name
        for old, val in mapping.items():
            name = name.replace(old, val)
        if name != p.name:
            p = p.rename(p.with_name(name))
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name == "synth.py":
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        new = text
        for old, val in mapping.items():
            new = new.replace(old, val)
        if new != text:
            p.write_text(new)


def _mutate(seed_dir: pathlib.Path, variant: pathlib.Path, rng: random.Random) -> dict:
    script = seed_dir / "synth.py"
    if not script.is_file():
        return {}
    spec = importlib.util.spec_from_file_location(f"hrl_synth_{seed_dir.name}", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return dict(mod.mutate(rng, variant) or {})


def make_variant(seed_dir: str | pathlib.Path, out_dir: str | pathlib.Path, index: int, seed: int = 0) -> pathlib.Path:
    """Writes variant `index` of the seed task into out_dir/<task_id>__s<seed>v<index>; returns its path."""
    seed_dir = pathlib.Path(seed_dir)
    task = load_task(seed_dir)
    rng = _rng(seed, task.task_id, index)
    params = task.metadata.get("synthesis", {}).get("params", {})
    chosen = {name: rng.choice(p["choices"]) for name, p in sorted(params.items())}
    vid = f"{task.task_id}__s{seed}v{index}"
    variant = pathlib.Path(out_dir) / vid
    if variant.exists():
        shutil.rmtree(variant)
    shutil.copytree(seed_dir, variant, ignore=shutil.ignore_patterns("synth.py", "__pycache__"))
    _substitute(variant, {str(params[n]["default"]): str(v) for n, v in chosen.items()})
    mutated = _mutate(seed_dir, variant, rng)
    entry = json.loads((variant / "data_entry.json").read_text())
    entry["task_id"] = vid
    entry.setdefault("metadata", {}).update(
        {"synthesized_from": task.task_id, "synth_seed": seed, "synth_index": index, "params": {**chosen, **mutated}})
    entry["metadata"].pop("synthesis", None)
    (variant / "data_entry.json").write_text(json.dumps(entry, indent=2) + "\n")
    return variant


def is_seed(task_dir: pathlib.Path) -> bool:
    try:
        task = load_task(task_dir)
    except ValueError:
        return False
    return bool(task.metadata.get("synthesis", {}).get("params")) or (task_dir / "synth.py").is_file()


async def synthesize(backend: Backend, seed_dirs: list[pathlib.Path], out_dir: str | pathlib.Path, *,
                     per_seed: int, seed: int = 0) -> tuple[list[pathlib.Path], list[Validation]]:
    """Variants of every seed, each validated; returns (kept variant dirs, failed validations)."""
    kept, failed = [], []
    for seed_dir in seed_dirs:
        for i in range(per_seed):
            variant = make_variant(seed_dir, out_dir, i, seed)
            v = await validate_task(backend, variant)
            if v.ok:
                kept.append(variant)
            else:
                failed.append(v)
                shutil.rmtree(variant, ignore_errors=True)
    return kept, failed
