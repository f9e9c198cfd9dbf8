"""`launch.bench --suite=shim` keeps its keys (and adds the 20k-session ones), at toy sizes."""

import pytest

from research.benchmarks import shim

OLD_KEYS = {"calls_per_s", "capture_to_json_ms_p50", "concurrent", "first_call_overhead_ms_p50", "fsync",
            "overhead_ms_p50", "overhead_ms_p50_last_turn", "overhead_ms_p50_minus_to_json", "overhead_ms_p99",
            "prompt_tokens_first", "prompt_tokens_last", "sessions", "throughput_calls", "turns"}
NEW_KEYS = {"calls_per_s_20k", "calls_per_s_20k_bare", "ratio_20k_vs_bare", "latency_ms_p50_20k",
            "latency_ms_p50_20k_bare", "shim_cpu_ms_per_call_20k", "cpu_ms_per_call_20k_bare", "calls_20k",
            "fsync_ms_p50", "overhead_ms_p50_minus_fsync", "capture_to_json_stdlib_ms_p50",
            "capture_to_json_speedup", "goal_overhead_ms_p50", "goal_calls_per_s_20k", "prompt_tokens_20k_last"}


def test_shim_bench_keys_at_toy_size(qwen3_tokenizer_dir):
    out = shim.run(sessions=1, turns=3, prompt_tokens=400, concurrent=3, calls_per_session=2, long_turns=2,
                   tokenizer=str(qwen3_tokenizer_dir))
    assert OLD_KEYS | NEW_KEYS <= set(out), (OLD_KEYS | NEW_KEYS) - set(out)
    assert out["calls_20k"] == 3 * 2 and out["throughput_calls"] == 3 * 2
    # the same-run baseline: the same client against a server that only parses each body and replays canned
    # bytes. The shim renders, tokenizes and fsyncs a capture record per call on top, so it is the slower one
    # and spends more CPU per call (measured 0.36x and 0.86 vs 0.19 ms here); reaching the baseline would mean
    # one of the two runs did not measure its server
    assert out["ratio_20k_vs_bare"] == pytest.approx(out["calls_per_s_20k"] / out["calls_per_s_20k_bare"])
    assert out["ratio_20k_vs_bare"] < 1 and out["shim_cpu_ms_per_call_20k"] > out["cpu_ms_per_call_20k_bare"], out
    assert out["capture_to_json_speedup"] == pytest.approx(out["capture_to_json_stdlib_ms_p50"]
                                                           / out["capture_to_json_full_ms_p50"])
    assert out["capture_to_json_speedup"] > 1  # orjson vs the stdlib on the same records, same run
    assert 400 < out["prompt_tokens_20k_last"] < 2000
