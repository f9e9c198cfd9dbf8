"""`launch.bench --suite=shim` keeps its keys (and adds the 20k-session ones), at toy sizes."""

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
    assert out["calls_per_s_20k"] > 0 and out["ratio_20k_vs_bare"] > 0 and out["capture_to_json_speedup"] > 1
    assert 400 < out["prompt_tokens_20k_last"] < 2000
