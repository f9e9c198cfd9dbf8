"""launch.sweep's library (harness_env/rl/sweep.py): per seed, SFT once, then RL and the equal-minutes SFT control
branch from that one SFT checkpoint; the table's numbers; resume after the sweep has finished."""

import json
import pathlib
import shutil

import pytest

from harness_env.rl import sweep


def _evals(*points):
    return [{"version": v, "minutes": m, "pass": p, "reward": p} for v, m, p in points]


def test_summary_numbers_and_checks():
    rows = [{"seed": 0, "sft": _evals((0, 0.0, 0.0), (10, 5.0, 0.3)),
             "rl": _evals((0, 0.0, 0.0), (10, 5.0, 0.3), (15, 7.0, 0.7), (20, 9.0, 0.9)),
             "control": _evals((0, 0.0, 0.0), (10, 5.0, 0.3), (14, 7.0, 0.4), (18, 9.5, 0.5), (20, 10.5, 0.6))},
            {"seed": 1, "sft": _evals((0, 0.0, 0.0), (10, 5.0, 0.5)),
             "rl": _evals((0, 0.0, 0.0), (10, 5.0, 0.5), (15, 7.0, 0.6), (20, 9.0, 0.4)),
             "control": _evals((10, 5.0, 0.5), (20, 9.0, 0.45))}]
    s = sweep.summarize(rows, sft_steps=10)
    t0, t1 = s["table"]
    assert t0 == {**t0, "start": 0.3, "final": 0.9, "rl": [(5, 0.7), (10, 0.9)], "rl_minutes": 4.0,
                  "control": 0.5, "control_steps": 8, "control_best": 0.6, "ok": True}  # control: first eval >= 9 min
    assert t1 == {**t1, "start": 0.5, "final": 0.4, "control": 0.45, "ok": False}  # ended below its start
    assert s["final"] == {"median": pytest.approx(0.65), "min": 0.4, "max": 0.9}
    assert s["start"]["median"] == pytest.approx(0.4) and s["control"]["max"] == 0.5
    assert not s["every_seed_ok"] and not s["median_final_ok"]
    # equal minutes: 4 RL minutes at the SFT phase's 0.5 minutes per step buy 8 SFT steps
    assert sweep.control_steps(rows[0]["sft"], rows[0]["rl"], 10) == 8
    # one SFT eval (after SFT only): the pace since the run's start, 5 minutes for 10 steps; a zero-length span
    # never divides (it asked for 11.8e9 control steps)
    one = rows[0]["sft"][-1:]
    assert sweep.control_steps(one, rows[0]["rl"], 10) == 8
    with pytest.raises(ValueError, match="pace"):
        sweep.control_steps(_evals((10, 0.0, 0.3)), rows[0]["rl"], 10)


def test_a_seed_that_does_not_beat_its_control_fails():
    rows = [{"seed": 3, "sft": _evals((0, 0, 0.0), (10, 5, 0.1)), "rl": _evals((10, 5, 0.1), (20, 9, 0.6)),
             "control": _evals((10, 5, 0.1), (18, 9, 0.6))}]
    assert not sweep.summarize(rows, 10)["table"][0]["ok"]  # 0.6 is not > the control's 0.6


def test_min_gain_is_the_rise_a_seed_needs_above_its_start():
    rows = [{"seed": 0, "sft": _evals((0, 0, 0.0), (10, 5, 0.1)), "rl": _evals((10, 5, 0.1), (20, 9, 0.375)),
             "control": _evals((10, 5, 0.1), (18, 9, 0.1))}]
    assert sweep.summarize(rows, 10)["table"][0]["ok"]  # +0.275 >= the demo's 0.25
    s = sweep.summarize(rows, 10, min_gain=0.3)  # learning through a CLI asks for +0.3
    assert not s["table"][0]["ok"] and s["min_gain"] == 0.3


def test_relay_answers_read_the_clue_per_task_and_the_form_each_second_call_writes(tmp_path):
    from harness_env.tasks import relay
    from research.capture import CallRecord, CaptureLog, RolloutResult
    from research.models.tokenizer import load_tokenizer

    tok = load_tokenizer(None)
    (tmp_path / "eval").mkdir()
    results, calls = CaptureLog(tmp_path / "eval" / "results.jsonl"), CaptureLog(tmp_path / "eval_capture.jsonl")
    river = [n for n in relay.numbers("heldout") if relay.clue_of(n) == "river"]
    stone = [n for n in relay.numbers("heldout") if relay.clue_of(n) == "stone"]
    # right; the literal form of the right word; the wrong word; a malformed second call; no second call
    plan = {river[0]: "echo river > out.txt", river[1]: "echo the word river > out.txt",
            stone[0]: "echo river > out.txt", stone[1]: '{"cmd": "ech', stone[2]: None}
    for n, text in plan.items():
        rid = f"eval00250.relay-{n}.codex.0"
        reward = {"echo river > out.txt": 1.0 if n in river else 0.0, "echo the word river > out.txt": 0.0}
        results.append(RolloutResult(rollout_id=rid, group_id=f"relay-{n}/codex", harness="codex", status="ok",
                                     reward=reward.get(text, 0.0), meta={"task_dir": str(tmp_path / f"relay-{n}")}))
        for index, ids in ((0, [3]), (1, tok.encode(text or ""))):
            if index == 1 and text is None:
                continue
            calls.append(CallRecord(rollout_id=rid, session_id="s", group_id=f"relay-{n}/codex", harness="codex",
                                    call_index=index, prompt_ids=[1, 2], completion_ids=ids,
                                    logprobs=[0.0] * len(ids), weight_version=250, finish_reason="stop"))
    results.close(), calls.close()
    a = sweep.relay_answers(tmp_path, 250)
    assert a == {"n": 5, "by_clue": {"river": 0.5, "stone": 0.0}, "forms": {"exact": 2, "literal": 1, "none": 2},
                 "copied": pytest.approx(2 / 5)}


def test_work_clock_sums_processes_and_skips_idle_time(tmp_path, monkeypatch):
    """eval/elapsed_min is work minutes: a resumed (or copied) run continues its clock from its checkpoint."""
    from configs import demo_cpu
    from research.rl import run_state
    from research.rl.trainer import Learner

    now = [100.0]
    monkeypatch.setattr(run_state.time, "monotonic", lambda: now[0])
    learner = Learner(demo_cpu.get_config("test"))
    st = run_state.RunState(tmp_path, save_every=1, keep=2)
    now[0] = 130.0
    st.meta["sft_step"] += 1
    st.commit("sft", learner.state, force=True)  # 30 s of work saved with the checkpoint
    st.finish(learner.state)
    st.close()
    now[0] = 5000.0  # the run sat idle (or another branch ran) for over an hour
    again = run_state.RunState(tmp_path, save_every=1, keep=2)
    again.restore(learner.abstract)
    now[0] = 5012.0
    assert again.work_s == pytest.approx(42.0)
    again.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sweep_branches_rl_and_control_from_one_sft_checkpoint(tmp_path):
    from configs import demo_cpu

    cfg = demo_cpu.get_config("test")
    cfg.sft.update(steps=2, num_demos=4, groups_per_step=2)
    cfg.eval.update(at_start=True, after_sft=True, every=1, sft_every=1, num_tasks=2)
    cfg.train.update(steps=2)
    import tempfile

    # a short root: the runs' Unix sockets live in their workdirs (AF_UNIX paths: < 108 bytes)
    root = pathlib.Path(tempfile.mkdtemp(prefix="sw", dir="/tmp"))
    summary = sweep.run_sweep(cfg, [0, 1], root)
    assert {p.name for p in root.iterdir()} >= {"seed0", "seed1", "sweep.json", "sweep.csv", "sweep.png"}
    for s in (0, 1):
        base = root / f"seed{s}"
        sft = json.loads((base / "sft" / "done.json").read_text())
        rl = json.loads((base / "rl" / "done.json").read_text())
        ctl = json.loads((base / "control" / "done.json").read_text())
        assert (sft["sft_step"], sft["rl_step"]) == (2, 0)
        assert (rl["sft_step"], rl["rl_step"]) == (2, 2)  # RL resumed the SFT checkpoint: no SFT step redone
        assert ctl["rl_step"] == 0 and ctl["sft_step"] > 2
        sft_ledger = (base / "sft" / "ledger.jsonl").read_text()
        assert (base / "rl" / "ledger.jsonl").read_text().startswith(sft_ledger)  # the SFT history, then RL
        assert (base / "control" / "ledger.jsonl").read_text().startswith(sft_ledger)
        evs = sweep.evals(base / "rl")
        assert [e["version"] for e in evs] == [0, 1, 2, 3, 4]
        assert all(a["minutes"] <= b["minutes"] for a, b in zip(evs, evs[1:]))  # one work clock, continued
    assert [e["seed"] for e in summary["table"]] == [0, 1]
    assert summary["table"][0]["control_steps"] >= 1
    csv_rows = (root / "sweep.csv").read_text().splitlines()
    assert len(csv_rows) == 3 and csv_rows[0].startswith("seed,start,final")
    mtime = (root / "seed0" / "rl" / "done.json").stat().st_mtime
    again = json.loads(json.dumps(sweep.run_sweep(cfg, [0, 1], root)))
    assert again == json.loads((root / "sweep.json").read_text())["summary"]
    assert (root / "seed0" / "rl" / "done.json").stat().st_mtime == mtime  # a finished part is not rerun
    shutil.rmtree(root, ignore_errors=True)
