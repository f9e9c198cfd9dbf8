"""A mix-harness RL training step on a web + CLI task mix, through the real loop (harness_env/rl/loop.train).

The tasks: 2 web tasks (browser harness, app per task) + 2 make_file tasks (shell), harnesses
`reference_bash:1,browser_use:1`: the loop's plan gives each task a harness that can run it (browser-use web
only, reference_bash CLI only). The policy is scripted (a tiny random model cannot drive a browser), right on
every other session and wrong on the rest, so every group has reward signal; the step then seals the captured
calls, builds the prefix trees of both kinds of group, and trains the tiny Qwen3 on them (one optimizer step)."""

import json
import pathlib

import pytest

from harness_env.tasks import family
from harness_env.tasks import web_family as wf
from harness_env.web import browser
from harness_env.web.policy import WebOracle
from research.capture import CallRecord, RolloutResult, read_log

pytestmark = [pytest.mark.slow, pytest.mark.harness]


def _policy(tasks, tok, queries):
    """Right / wrong alternating per task (one rollout = one session; the order in which the sessions of a task
    open, not of all sessions, which concurrent groups interleave): right plans and the make_file oracle, else the
    wrong web plan and the imperfect make_file expert."""
    from research.serving.replay import ReplayEngine

    right, wrong, seen, starts = WebOracle(tasks), WebOracle(tasks, wrong=True), {}, {}

    def reply(req) -> str:  # noqa: ANN001
        prompt = tok.decode(list(req.prompt_ids))
        if req.session_id not in seen:  # the n-th session to open on its task (each task is one group a step):
            task = next((q for q in queries if q in prompt), "")  # right if n is even, so a group's two
            starts[task] = starts.get(task, -1) + 1  # rollouts differ however the groups' sessions interleave
            seen[req.session_id] = starts[task] % 2 == 0
        good = seen[req.session_id]
        web = (right if good else wrong).reply(prompt)
        if web is not None:
            return web
        return family.oracle_reply(prompt) if good else family.oracle_reply(prompt, mistake="literal")

    class Scripted(ReplayEngine):
        async def update_weights(self, params, version: int) -> None:  # noqa: ANN001
            self._version = version

    return Scripted(reply, tok)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mix_harness_step_on_web_and_cli_tasks(tmp_path, monkeypatch):
    from configs import demo_cpu
    from harness_env.rl.loop import train
    from research.models.tokenizer import load_tokenizer
    from research.serving import factory

    ok, why = browser.chromium_available()
    if not ok:
        pytest.skip(why)
    src = tmp_path / "tasks"
    web = [wf.write_task(src, "todo", 0), wf.write_task(src, "delete_user", 1)]
    mistaken = [(n, w) for n, w in family.pairs("all") if family.literal_mistake(n, w)][:2]  # the imperfect
    for name, word in mistaken:  # expert errs on these (0.3 instead of 1.0)
        family.write_task(src, name, word)
    queries = [json.loads((d / "data_entry.json").read_text())["user_query"] for d in src.iterdir()]
    cfg = demo_cpu.get_config("test")
    cfg.tasks.update(source="dir", train_dir=str(src), eval_dir=str(src))
    cfg.rollout.update(harnesses="reference_bash:1,browser_use:1", groups_per_step=4, group_size=2, concurrency=2,
                       max_turns=12, max_new_tokens=1024, timeout_s=240.0, sandbox_memory_mb=3072)
    cfg.train.update(steps=1, row_len=16384)  # one browser-use call (~12k tokens) fits a row
    cfg.model.update(attention_impl="blockwise")  # O(T) memory at 16k-token rows (the demo's "reference" is T^2)
    cfg.eval.update(every=0, at_start=False)
    tok = load_tokenizer(cfg.tokenizer_dir or None)
    monkeypatch.setattr(factory, "policy_engine", lambda run, params, weight_version: _policy(web, tok, queries))
    wd = tmp_path / "run"
    summary = train(cfg, wd)
    assert summary["rl_step"] == 1 and summary["optimizer_steps"] == 1
    results = [r for r in read_log(wd / "rollouts" / "results.jsonl") if isinstance(r, RolloutResult)]
    assert len(results) == 8 and all(r.status == "ok" for r in results), [(r.rollout_id, r.message) for r in results]
    by_harness = {(r.harness, r.meta["category"]) for r in results}
    assert by_harness == {("browser_use", "web"), ("reference_bash", "make_file")}
    for group in {r.group_id for r in results}:  # right and wrong in every group: signal
        assert len({r.reward for r in results if r.group_id == group}) == 2, group
    calls = [c for c in read_log(wd / "capture.jsonl") if isinstance(c, CallRecord)]
    assert {c.harness for c in calls} == {"browser_use", "reference_bash"}
    rec = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines() if json.loads(x)["kind"] == "train"]
    assert len(rec) == 1 and not rec[0]["skipped"] and rec[0]["grad_norm"] > 0
    assert rec[0]["groups/browser_use"] == 2 and rec[0]["groups/reference_bash"] == 2
    assert rec[0]["tree_compression"] > 1.0
    ledger = [json.loads(x) for x in (wd / "ledger.jsonl").read_text().splitlines()]
    assert len([rid for e in ledger for rid in e["trained"]]) == 8
    assert pathlib.Path(wd / "checkpoints").is_dir()
