"""Each real harness CLI (Claude Code, Codex, OpenClaw, opencode), installed from npm, on two real ClawGym
tasks as shipped, in bwrap, through the shim with a scripted engine that speaks the harness's own shell tool
(issue 11, part 1): on task_0185 it runs a script that solves the task with relative paths (so it only works
if the harness started in /root/.openclaw/workspace) -> reward 1.0; on task_0000 it does nothing -> 0.0.
Prints each rollout's timings (the README's per-harness table comes from these runs)."""
import json

import pytest
from rollout_kit import (
    DO_NOTHING,
    SOLVE_0185,
    SOLVED_0185,
    WS,
    clawgym_train,
    logs_of,
    per_task_policy,
    query_marker,
    run_rollouts,
)

from harness_env.harnesses import get_harness
from harness_env.runner import RolloutSpec
from harness_env.sandbox import Limits, get_backend

pytestmark = [pytest.mark.slow, pytest.mark.harness]
IDLE_TASK = "task_0000"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["claude_code", "codex", "openclaw", "opencode"])
def test_real_cli_solves_one_real_task_and_idles_on_another(name, tmp_path, qwen3_tokenizer_dir):
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine

    backend = get_backend("bwrap")
    ok, why = backend.available()
    if not ok:
        pytest.skip(why)
    root = clawgym_train()
    solve, idle = root / "task_0185", root / IDLE_TASK
    tok = load_tokenizer(qwen3_tokenizer_dir)
    plans = {query_marker(solve): ([SOLVE_0185], SOLVED_0185), query_marker(idle): ([], DO_NOTHING)}
    engine = ReplayEngine(per_task_policy(name, plans, tok.decode), tok)
    results, calls = run_rollouts(tmp_path, engine, tok, [RolloutSpec(solve, name, 0), RolloutSpec(idle, name, 0)],
                                  backend=backend, concurrency=2, timeout_s=300,
                                  limits=Limits(cpus=2.0, memory_mb=4096, pids=1024, wall_s=330))
    by = {r.rollout_id.split(".")[0]: r for r in results}
    for r in results:
        print(f"{name} {r.rollout_id}: {r.status} reward={r.reward} calls={r.meta.get('calls')} "
              + " ".join(f"{k}={v:.2f}" for k, v in sorted(r.timings.items())))
        assert r.status == "ok", f"{r.rollout_id}: {r.status}: {r.message}\n{logs_of(tmp_path, r.rollout_id)}"
        assert r.meta["workspace_dir"] == WS
    assert by["task_0185"].reward == 1.0, logs_of(tmp_path, by["task_0185"].rollout_id)
    assert by[IDLE_TASK].reward == 0.0
    # the record of how the unmodified CLI was configured: its package, documented flags, env, config files
    inv = json.loads((tmp_path / "run" / "rollouts" / by["task_0185"].rollout_id / "logs" / "invocation.json")
                     .read_text())
    assert inv["harness"] == name and inv["package"] == get_harness(name).package.spec
    assert inv["argv"][0].endswith(get_harness(name).package.bin.rsplit("/", 1)[-1])
    assert name != "codex" or "model_provider" in inv["config_files"][".codex/config.toml"]
    assert "<redacted>" in json.dumps(inv)  # the session's key: in the env (claude, codex) or a config file
    assert {c.rollout_id for c in calls} == {r.rollout_id for r in results} and {c.harness for c in calls} == {name}
