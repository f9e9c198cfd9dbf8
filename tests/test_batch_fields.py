"""The packed batch has one table of fields (research/trees/batch.py); nobody else spells a list of its keys.

A renamed or added field used to break one of six hand-written key lists silently (the rl_loop bench crashed
with KeyError: 'tokens'). These tests fail when a list of >= 3 field names is written outside the table, and
check that what packing, the step builder and AOT produce matches the table.
"""

import ast
import pathlib

import numpy as np
import pytest

from research.trees import batch as fields

ROOT = pathlib.Path(__file__).resolve().parents[1]
OWNER = ROOT / "research" / "trees" / "batch.py"


def _spelled_key_lists(path: pathlib.Path, at_least: int = 3) -> list[tuple[int, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        # a dict keyed by field names is a key list too (per_process once kept its own padding dict)
        if isinstance(node, ast.Dict | ast.Tuple | ast.List | ast.Set):
            elts = node.keys if isinstance(node, ast.Dict) else node.elts
            keys = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in fields.BY_NAME]
            if len(keys) >= at_least:
                out.append((node.lineno, keys))
    return out


def test_no_key_list_is_spelled_outside_the_table():
    found = {}
    for pkg in ("research", "harness_env", "launch", "configs", "tests"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            # tests may name a few keys they assert on; a copy of a whole key list is what this catches there
            if path != OWNER and (hits := _spelled_key_lists(path, 6 if pkg == "tests" else 3)):
                found[str(path.relative_to(ROOT))] = hits
    assert not found, f"batch key lists spelled outside research/trees/batch.py (derive them with names()): {found}"


def test_the_scan_finds_a_spelled_list(tmp_path):
    p = tmp_path / "x.py"
    p.write_text('KEYS = ("tokens", "positions", "weight")\nOK = ("tokens", "positions")\n'
                 'FILL = {"parent_index": -1, "tree_id": -1, "expert_ids": -1}\nONE = {"tokens": 0, "x": 1}\n')
    assert _spelled_key_lists(p) == [(1, ["tokens", "positions", "weight"]),
                                     (3, ["parent_index", "tree_id", "expert_ids"])]


def test_packed_rows_match_the_table():
    from research.trees import synthetic
    from research.trees.builder import build_tree
    from research.trees.packing import pack_trees
    from research.trees.targets import node_stats, normalizer

    tree = build_tree(*synthetic.make_group(np.random.default_rng(0), sessions=3))
    stats = node_stats(tree, occ_adv=np.linspace(-1, 1, len(tree.occ_call)), agg_name="token_mean")
    packed = pack_trees([tree], [stats], [normalizer(tree, "token_mean")], row_len=64, num_rows=3)
    assert set(packed) == set(fields.ROW_FIELDS)
    fields.check(packed)
    pad = packed["segment_ids"] == 0
    assert pad.any()
    np.testing.assert_array_equal(packed["subtree_end"][pad], np.nonzero(pad)[1])
    assert (packed["parent_index"][pad] == -1).all() and (packed["tree_id"][pad] == -1).all()


def test_check_names_the_bad_key():
    with pytest.raises(KeyError, match="'tokenz'"):
        fields.check({"tokenz": np.zeros((2, 4), np.int32)})
    with pytest.raises(ValueError, match="weight"):
        fields.check({"weight": np.zeros((2, 4), np.int32)})
    with pytest.raises(ValueError, match="dim T"):
        fields.check({"tokens": np.zeros((2, 4), np.int32), "weight": np.zeros((2, 5), np.float32)})


def test_aot_abstract_batch_is_the_table():
    import jax

    from configs import demo_cpu
    from research.train.aot import abstract_batch
    from research.train.state import make_mesh

    cfg = demo_cpu.get_config("test")
    mesh = make_mesh(cfg.mesh, devices=jax.devices()[:1])
    b = abstract_batch(cfg, mesh, step="ppo", kl=True)
    fields.check(b)
    assert set(b) == (set(fields.ROW_FIELDS) - set(fields.HOST_ONLY)) | {"loss_idx", "loss_valid", "old_values",
                                                                         "ref_logp"}
    assert b["tokens"].shape == (cfg.train.batch_rows, cfg.train.row_len)
