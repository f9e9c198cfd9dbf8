"""Executes notebooks/inspect_rollouts.py on the workdir of a real one-step run (tiny policy, bwrap)."""

import os
import pathlib

import jupytext
import pytest

from harness_env.sandbox import get_backend

NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "inspect_rollouts.py"


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_inspect_rollouts_notebook_on_a_run(tmp_path, monkeypatch):
    from configs import demo_cpu
    from harness_env.rl.loop import train

    if not get_backend("bwrap").available()[0]:
        pytest.skip("bwrap unavailable")
    cfg = demo_cpu.get_config("test")
    cfg.train.steps = 1
    wd = tmp_path / "run"
    train(cfg, wd)
    nb = jupytext.read(NOTEBOOK)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert len(code) >= 4 and any(c.cell_type == "markdown" for c in nb.cells)
    monkeypatch.setenv("INSPECT_WORKDIR", str(wd))
    monkeypatch.setenv("INSPECT_OUT", str(tmp_path))
    ns: dict = {"__name__": "__notebook__"}
    for src in code:
        exec(compile(src, str(NOTEBOOK), "exec"), ns)
    assert os.path.getsize(tmp_path / "rollout_tree.png") > 1000
    tree = ns["tree"]
    assert tree.num_nodes < ns["flat_tokens"]  # the group's calls share their prompt
    assert len(ns["rows"]) == len(ns["group_calls"]) >= 2
    assert all(r["generated_tokens"] > 0 and r["context_tokens"] > r["generated_tokens"] for r in ns["rows"])
    assert ns["train_rewards"] and ns["train_rewards"][0][0] == 1
