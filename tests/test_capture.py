"""The capture log: durable, torn-tail tolerant, and strict about bad records."""

import pytest

from research import capture


def _call(i=0, **kw):
    base = dict(rollout_id="r1", session_id="s1", group_id="g1", harness="ref", call_index=i,
                prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.1, -0.2],
                weight_version=0, finish_reason="stop", call_id=f"c{i}")
    base.update(kw)
    return capture.CallRecord(**base)


def test_roundtrip_and_torn_tail(tmp_path):
    path = tmp_path / "log.jsonl"
    with capture.CaptureLog(path) as log:
        log.append(_call(0))
        log.append(_call(1, routed_experts=[0, 1, 2, 3], routed_experts_shape=(2, 1, 2)))
        log.append(capture.RolloutResult(rollout_id="r1", group_id="g1", harness="ref", status="ok", reward=1.0))
    with open(path, "ab") as f:
        f.write(b'{"kind":"call","rollout_id":"r1","sess')  # crash mid-write
    recs = list(capture.read_log(path))
    assert [type(r).__name__ for r in recs] == ["CallRecord", "CallRecord", "RolloutResult"]
    assert recs[1].routed_experts_shape == (2, 1, 2)
    assert recs[0] == _call(0)
    # Reopening cuts the torn tail so new appends stay readable.
    with capture.CaptureLog(path) as log:
        log.append(_call(2))
    assert len(list(capture.read_log(path))) == 4


def test_corrupt_middle_line_raises(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(capture.to_json(_call(0)) + "\nnot json\n" + capture.to_json(_call(1)) + "\n")
    with pytest.raises(capture.CaptureError, match=r"log.jsonl:2"):
        list(capture.read_log(path))


def test_prompt_references_resolve_in_order_and_fail_loudly(tmp_path):
    """A continuing call is written as (earlier call, n) + its new tokens; reading the log gives the whole
    prompt back, a line read alone or a reference to nothing earlier is an error, not a short prompt."""
    path = tmp_path / "log.jsonl"
    parent = _call(0, prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.1, -0.2])
    into_completion = _call(1, prompt_ids=[1, 2, 3, 4, 5, 6, 7])  # n = 5: the whole prompt + completion
    into_prompt = _call(2, prompt_ids=[1, 2, 9])  # n = 2: a branch inside the parent's prompt
    with capture.CaptureLog(path) as log:
        log.append(parent)
        log.append(into_completion, prompt_ref=("c0", 5))
        log.append(into_prompt, prompt_ref=("c0", 2))
    lines = path.read_bytes().splitlines()
    assert b'"prompt_ids":[6,7]' in lines[1] and b'"prompt_ref":["c0",5]' in lines[1]
    assert b'"prompt_ids":[9]' in lines[2]
    assert list(capture.read_log(path)) == [parent, into_completion, into_prompt]
    with pytest.raises(capture.CaptureError, match="continues call 'c0', which is not earlier in this log"):
        capture.from_json(lines[1])
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(lines[0] + b"\n" + lines[1].replace(b'"c0",5', b'"c0",6') + b"\n")
    with pytest.raises(capture.CaptureError, match=r"bad.jsonl:2: .*prompt_ref length 6 outside"):
        list(capture.read_log(bad))


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(logprobs=[-0.1]), "1 logprobs for 2 completion tokens"),
        (dict(completion_ids=[], logprobs=[]), "empty completion"),
        (dict(completion_ids=[4, 99], logprobs=[0.0, 0.0]), "token id 99 outside vocab 50"),
        (dict(finish_reason="weird"), "finish_reason"),
    ],
)
def test_validate_names_rollout_and_call(kw, msg):
    with pytest.raises(capture.CaptureError, match=msg) as e:
        _call(3, **kw).validate(vocab_size=50)
    assert "rollout 'r1' call 3" in str(e.value)


def test_result_needs_reward_when_ok():
    with pytest.raises(capture.CaptureError, match="no reward"):
        capture.RolloutResult(rollout_id="r", group_id="g", harness="h", status="ok").validate()
    capture.RolloutResult(rollout_id="r", group_id="g", harness="h", status="timeout").validate()


def test_orjson_lines_read_like_stdlib_lines_and_non_finite_values(tmp_path):
    """Lines written by the stdlib serializer (older logs) and by orjson read back the same; a -inf
    logprob or NaN sub-score keeps the stdlib's -Infinity/NaN (orjson would write null)."""
    import json
    import math

    import numpy as np

    rec = _call(0, meta={"model": "é🙂", "n": np.int64(3), "arr": np.arange(3, dtype=np.int32)})
    line = capture.to_json(rec)
    assert capture.from_json(line).meta == {"model": "é🙂", "n": 3, "arr": [0, 1, 2]}
    plain = _call(1)
    old = json.dumps({"kind": "call", **{k: getattr(plain, k) for k in plain.__dataclass_fields__}},
                     separators=(",", ":"))
    assert capture.from_json(old) == plain == capture.from_json(capture.to_json(plain))
    neg = _call(2, logprobs=[-math.inf, -0.5])
    assert "-Infinity" in capture.to_json(neg)
    res = capture.RolloutResult(rollout_id="r", group_id="g", harness="h", status="ok", reward=1.0,
                                sub_scores={"x": math.nan})
    path = tmp_path / "log.jsonl"
    with capture.CaptureLog(path) as log:
        log.append_many([neg, res, plain])
    back = list(capture.read_log(path))
    assert back[0].logprobs[0] == -math.inf and math.isnan(back[1].sub_scores["x"]) and back[2] == plain


def test_group_commit_concurrent_appends(tmp_path, monkeypatch):
    """16 threads appending 400 records: every record lands whole and once, with fewer fsyncs than
    records (one fsync covers every line queued while the previous one ran)."""
    import os
    import threading
    import time

    n_fsync = [0]
    real = os.fsync

    def slow_fsync(fd):
        n_fsync[0] += 1
        time.sleep(0.002)
        real(fd)

    monkeypatch.setattr(capture.os, "fsync", slow_fsync)
    path = tmp_path / "log.jsonl"
    log = capture.CaptureLog(path)

    def worker(k):
        for i in range(25):
            log.append(_call(k * 100 + i, prompt_ids=list(range(1000 + k))))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    recs = list(capture.read_log(path))
    assert sorted(r.call_index for r in recs) == sorted(k * 100 + i for k in range(16) for i in range(25))
    assert all(r.prompt_ids == list(range(1000 + r.call_index // 100)) for r in recs)
    assert n_fsync[0] < 400 / 2


def test_failed_write_stops_the_log(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    log = capture.CaptureLog(path)
    log.append(_call(0))

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(capture.os, "fsync", boom)
    with pytest.raises(OSError, match="No space left"):
        log.append(_call(1))
    monkeypatch.undo()
    with pytest.raises(OSError, match="stopped after a failed write"):
        log.append(_call(2))  # fail-stop: nothing is acknowledged after a write that may be torn


def test_torn_tail_repair_scans_from_the_end(tmp_path):
    path = tmp_path / "log.jsonl"
    with capture.CaptureLog(path) as log:
        for i in range(50):
            log.append(_call(i, prompt_ids=list(range(3000))))
    with open(path, "ab") as f:
        f.write(b'{"kind":"call"' + b" " * 200_000)  # a torn line longer than one scan block
    with capture.CaptureLog(path) as log:
        log.append(_call(99))
    assert [r.call_index for r in capture.read_log(path)] == list(range(50)) + [99]
    path2 = tmp_path / "only_torn.jsonl"
    path2.write_bytes(b'{"kind":"ca')
    capture.CaptureLog(path2).close()
    assert path2.read_bytes() == b""
