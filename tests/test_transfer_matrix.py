"""The transfer matrix: policies restored from the workdirs of `launch.train` runs, each evaluated under every
harness with the context window its prompts were learned under."""

import asyncio

import pytest

from harness_env.eval import policies


class _Run:
    """The two fields `policies.window` reads from a RunConfig."""

    def __init__(self, harnesses: str, max_len: int):
        self.rollout = type("R", (), {"harnesses": harnesses})()
        self.engine = type("E", (), {"max_len": max_len})()


def test_a_policy_is_served_with_its_training_window_where_that_fits_else_the_harnesses_own():
    assert policies.window(_Run("codex:1", 10240), "codex") == 10240  # the prompt it learned
    assert policies.window(_Run("codex:1", 10240), "claude_code") == 13312  # too small for Claude Code's prompt
    assert policies.window(_Run("codex:1", 10240), "reference") == 10240
    assert policies.window(_Run("claude_code:1,codex:1,openclaw:1", 13312), "codex") == 13312  # the mix's window


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_transfer_matrix_restores_each_runs_checkpoint_and_evaluates_it_under_each_harness(tmp_path):
    from configs import demo_cpu
    from harness_env.rl.sweep import run_part
    from harness_env.runner import RunnerConfig
    from harness_env.sandbox import Limits, get_backend
    from harness_env.tasks import family
    from research.capture import CallRecord, read_log
    from research.models.tokenizer import load_tokenizer

    ok, why = get_backend("bwrap").available()
    assert ok, why
    cfg = demo_cpu.get_config("test")
    cfg.train.steps = 2
    run_part(cfg, tmp_path / "run")
    tasks = family.generate(tmp_path / "tasks", "heldout", n=2)
    run_cfg = RunnerConfig(out_dir=tmp_path / "eval", progress=False, concurrency=2, limits=Limits(memory_mb=1024))
    matrix = asyncio.run(policies.transfer_matrix(
        {"a": tmp_path / "run", "b": tmp_path / "run"}, ["reference", "reference_bash"], tasks=tasks, k=1,
        tok=load_tokenizer(None), out=tmp_path / "eval", cfg=run_cfg))
    assert set(matrix["cells"]) == {f"{p}/{h}" for p in "ab" for h in ("reference", "reference_bash")}
    for cell in matrix["cells"].values():
        # reference_bash trained at 512; the reference agent's ~400-token prompt + a reply needs its own 1024
        window = cfg.engine.max_len if cell["harness"] == "reference_bash" else 1024
        assert cell["version"] == 2 and cell["rollouts"] == 2 and cell["window"] == window, cell
        assert sum(cell["statuses"].values()) == 2 and 0.0 <= cell["pass_at_1"] <= 1.0
        cell_dir = tmp_path / "eval" / cell["policy"] / cell["harness"]
        assert (cell_dir / "results.jsonl").exists()
        # served as the run's rollouts were: its token cap on every call (a harness asks for thousands)
        calls = [c for c in read_log(cell_dir / "capture.jsonl") if isinstance(c, CallRecord)]
        assert calls and max(len(c.completion_ids) for c in calls) <= cfg.rollout.max_new_tokens
    md = (tmp_path / "eval" / "matrix.md").read_text().splitlines()
    assert md[0] == "| policy \\ harness | reference | reference_bash |" and len(md) == 4
    with pytest.raises(ValueError, match="no checkpoint"):
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "config.json").write_text((tmp_path / "run" / "config.json").read_text())
        policies.load_policy(tmp_path / "empty")
