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
