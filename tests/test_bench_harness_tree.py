"""Bench `harness_tree` (harness_env/benchmarks/harness_tree.py) through the real Codex CLI: exact keys, and the
tree computes the CLI's long shared prefix once (group of 4: flat / tree well above the reference agent's)."""

import pytest

pytestmark = pytest.mark.harness


def test_the_tree_saves_most_of_a_real_clis_tokens():
    from harness_env.benchmarks import harness_tree

    r = harness_tree.run(harnesses="reference,codex", group=4)
    keys = {"first_prompt", "calls", "flat_tokens", "tree_tokens", "tree_vs_flat", "reward", "vs_reference"}
    assert set(r) == {"backend", "group"} | {f"{h}_{k}" for h in ("reference", "codex") for k in keys}
    assert r["codex_reward"] == r["reference_reward"] == 1.0 and r["codex_calls"] >= 3
    assert r["codex_first_prompt"] > 5000 and r["codex_tree_tokens"] < r["codex_flat_tokens"] / 8, r
    assert r["codex_vs_reference"] > 1.5, r  # the longer the shared prefix, the more the tree saves
