"""Metrics (exact numbers vs brute force), behaviour analytics on known traces, the report files, the
remote token-id engine, and `launch.eval` end to end (reference harness, oracle engine, bwrap, shim)."""
import asyncio
import itertools
import json

import pytest
from aiohttp import web

from harness_env.eval import analytics, metrics, report
from research.capture import RolloutResult
from research.serving.api import EngineError, GenerateRequest, SamplingParams
from research.serving.openai_client import OpenAICompletionsEngine


def _brute(n, c, k, all_=False):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hit = [all(outcomes[i] for i in s) if all_ else any(outcomes[i] for i in s) for s in subsets]
    return sum(hit) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(4, 0, 1), (4, 1, 1), (4, 1, 2), (4, 2, 2), (4, 3, 4), (5, 2, 3), (8, 8, 4)])
def test_pass_at_k_and_pass_hat_k_match_brute_force(n, c, k):
    assert metrics.pass_at_k(n, c, k) == pytest.approx(_brute(n, c, k))
    assert metrics.pass_hat_k(n, c, k) == pytest.approx(_brute(n, c, k, all_=True))


def test_pass_at_k_rejects_nonsense():
    with pytest.raises(ValueError):
        metrics.pass_at_k(2, 3, 1)
    with pytest.raises(ValueError):
        metrics.pass_at_k(2, 1, 3)


def _res(task, h, i, status="ok", reward=1.0, cat="csv"):
    return RolloutResult(rollout_id=f"{task}.{h}.{i}", group_id=f"{task}/{h}", harness=h, status=status,
                         reward=reward if status == "ok" else None, meta={"task_id": task, "category": cat})


def test_table_per_harness_and_category(tmp_path):
    rs = [_res("a", "x", 0), _res("a", "x", 1, reward=0.5), _res("b", "x", 0, "timeout"),
          _res("b", "x", 1, cat="csv"), _res("c", "x", 0, cat="json"), _res("c", "x", 1, "harness_error", cat="json")]
    rows = {(r.harness, r.group): r for r in metrics.table(rs, [1, 2])}
    allx = rows[("x", "all")]
    assert allx.tasks == 3 and allx.rollouts == 6
    assert allx.metrics["pass@1"] == pytest.approx(0.5)  # each task: 1 of 2 succeeded
    assert allx.metrics["pass@2"] == pytest.approx(1.0) and allx.metrics["pass^2"] == pytest.approx(0.0)
    assert allx.statuses == {"ok": 4, "timeout": 1, "harness_error": 1}
    assert allx.mean_reward == pytest.approx((1 + 0.5 + 0 + 1 + 1 + 0) / 6)
    assert rows[("x", "json")].tasks == 1 and rows[("x", "csv")].tasks == 2
    paths = report.write_report(tmp_path, list(rows.values()), [1, 2], {"x": {"turns_mean": 2.0}})
    assert json.loads(paths["json"].read_text())["rows"][0]["harness"] == "x"
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    assert "pass@2" in paths["csv"].read_text().splitlines()[0]
    assert "turns_mean" in paths["txt"].read_text()


def _tc(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call><|im_end|>"


def _prompt(system_tools, history):
    tools = "\n".join(json.dumps({"type": "function", "function": {"name": t}}) for t in system_tools)
    return f"<|im_start|>system\n<tools>\n{tools}\n</tools><|im_end|>\n" + history + "<|im_start|>assistant\n"


def _resp(text):
    return f"<|im_start|>user\n<tool_response>\n{text}\n</tool_response><|im_end|>\n"


def test_analytics_on_a_known_trace():
    tools = ["bash", "read_file", "write_file", "finish"]
    c1 = _tc("bash", command="python3 fix.py")  # fails
    c2 = _tc("write_file", path="fix.py", content="print(1)")
    c3 = _tc("bash", command="python3 fix.py")  # verification run, succeeds
    c4 = _tc("finish", message="done")
    h = "<|im_start|>user\ntask<|im_end|>\n"
    p1 = _prompt(tools, h)
    p2 = p1 + c1 + "\n" + _resp("exit code 1\nTraceback (most recent call last):")
    p3 = p2 + "<|im_start|>assistant\n" + c2 + "\n" + _resp("wrote 8 chars to fix.py")
    p4 = p3 + "<|im_start|>assistant\n" + c3 + "\n" + _resp("exit code 0\n1")
    b = analytics.analyze_texts("r", "reference", [(p1, c1), (p2, c2), (p3, c3), (p4, c4)])
    assert b.turns == 4
    assert [t.ok for t in b.tools] == [False, True, True, None]
    assert b.by_kind == {"write": 1, "inspect": 0, "run": 2, "shell_other": 0, "finish": 1, "browse": 0, "other": 0}
    assert b.self_verified and b.had_error and b.recovered
    assert b.coverage == pytest.approx(3 / 4)
    lazy = analytics.analyze_texts("s", "reference", [(p1, _tc("bash", command="echo hi > a.txt")),
                                                      (p1 + _resp("exit code 0"), c4)])
    assert not lazy.self_verified and not lazy.had_error and not lazy.recovered
    agg = analytics.aggregate([b, lazy])
    assert agg["self_verification_rate"] == 0.5 and agg["error_recovery_rate"] == 1.0 and agg["turns_mean"] == 3


def test_classify_shell_commands_by_what_they_do():
    assert analytics.classify("Bash", {"command": "pytest -q"})[0] == "run"
    assert analytics.classify("shell", {"command": ["bash", "-lc", "cat out.txt"]})[0] == "inspect"
    assert analytics.classify("exec_command", {"cmd": "sed -i s/a/b/ x"})[0] == "write"
    assert analytics.classify("Edit", {})[0] == "write" and analytics.classify("Grep", {})[0] == "inspect"


def test_remote_engine_takes_and_returns_token_ids():
    seen = {}

    async def completions(request):
        body = await request.json()
        seen.update(body)
        toks = ["token_id:5", "token_id:7"] if body["return_tokens_as_token_ids"] else ["a", "b"]
        return web.json_response({"choices": [{"finish_reason": "length", "logprobs": {
            "tokens": toks if body["prompt"][0] == 1 else ["x"], "token_logprobs": [-0.5, -0.25]}}]})

    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        eng = OpenAICompletionsEngine(f"http://127.0.0.1:{port}/v1")
        try:
            res = await eng.generate(GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=2)))
            with pytest.raises(EngineError, match="token_id"):
                await eng.generate(GenerateRequest([9], SamplingParams(max_new_tokens=2)))
        finally:
            await eng.close()
            await runner.cleanup()
        return res

    res = asyncio.run(go())
    assert res.token_ids == [5, 7] and res.logprobs == [-0.5, -0.25] and res.finish_reason == "length"
    assert seen["prompt"] == [9] and seen["max_tokens"] == 2


def test_launch_eval_end_to_end(tmp_path, qwen3_tokenizer_dir):
    from harness_env.eval.run import build_engine, evaluate, task_dirs
    from harness_env.runner import RunnerConfig
    from research.models.tokenizer import load_tokenizer

    tok = load_tokenizer(qwen3_tokenizer_dir)
    tasks = task_dirs("family:heldout:2", tmp_path)
    cfg = RunnerConfig(out_dir=tmp_path / "out", concurrency=4, timeout_s=60, progress=False)
    doc = asyncio.run(evaluate(tasks=tasks, harnesses=["reference"], k=2, engine=build_engine("oracle", tok),
                               tok=tok, out=tmp_path / "out", cfg=cfg))
    (row,) = [r for r in doc["rows"] if r.group == "all"]
    assert row.rollouts == 4 and row.metrics["pass@1"] == 1.0 and row.metrics["pass^2"] == 1.0
    beh = doc["behaviour"]["reference"]
    assert beh["rollouts"] == 4 and beh["turns_mean"] == 2 and beh["tool_calls_by_kind"]["write"] == 4
    # the one make_file expert (family.oracle_reply) writes with one bash call and ends with a plain answer:
    # 1 of the reference harness's 4 tools (bash, read_file, write_file, finish)
    assert beh["tool_coverage_mean"] == pytest.approx(1 / 4)
    assert all(p.exists() for p in doc["paths"].values())


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.timeout(600)
def test_launch_eval_through_codex_on_the_jax_engine_exits_0_with_a_context_sized_to_codex(tmp_path):
    """The newcomer's path: `launch.eval --endpoint=jax` through a real CLI. The engine's context is sized to the
    harness (its ~9k-token first request no longer ends every rollout as a context error), and the process exits 0
    (the JAX engine's serving thread is closed before exit: it used to abort with rc 134 after the report)."""
    import subprocess
    import sys

    from harness_env.harnesses.base import context_for

    repo = __import__("pathlib").Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "launch.eval", "--tasks=family:heldout:1", "--harness=codex", "--k=1",
           "--endpoint=jax", "--timeout_s=40", f"--out={tmp_path / 'out'}", "--concurrency=1"]
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(results) == 1 and "context" not in results[0]["message"], results[0]
    assert not any(f.startswith("context_length@0") for f in results[0]["meta"].get("serving_faults", []))
    assert context_for(["codex"]) == 32768
    refused = subprocess.run([*cmd[:-3], "--max_len=4096", f"--out={tmp_path / 'refused'}"], cwd=repo,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "4096" in refused.stderr and "codex" in refused.stderr, refused.stderr[-2000:]
    assert not (tmp_path / "refused" / "results.jsonl").exists()  # refused at start: no rollout ran
