"""Executes notebooks/tree_losses.py (jupytext -> notebook -> run the code cells; no kernel needed)."""

import os
import pathlib

import jupytext

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "tree_losses.py"


def test_tree_losses_notebook_runs_and_matches(tmp_path, monkeypatch):
    nb = jupytext.read(NOTEBOOK)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert len(code) >= 5 and any(c.cell_type == "markdown" for c in nb.cells)
    monkeypatch.setenv("NOTEBOOK_OUT", str(tmp_path))
    ns: dict = {"__name__": "__notebook__"}
    for src in code:
        exec(compile(src, str(NOTEBOOK), "exec"), ns)
    assert ns["max_rel_diff"] < 1e-5
    assert ns["tree"].num_nodes < ns["flat_tokens"]
    assert os.path.getsize(tmp_path / "tree_losses.png") > 1000
