"""`launch.bench --suite=engine` end to end on a tiny model: its keys, the same-run ratios, the profile, and
that ours and transformers decode the same greedy tokens (both serve the same exported weights)."""

import pytest

pytest.importorskip("transformers")


@pytest.mark.parametrize("kernels", [None, False])
def test_engine_bench_reports_ratios_profile_and_agrees_with_transformers(kernels):
    from research.benchmarks import engine

    r = engine.run(new_tokens=6, prompt_len=8, concurrency=(1, 8), layers=1, hidden=64, vocab=512, reps=3,
                   hf_threads=(1,), profile=True, kernels=kernels)
    assert r["greedy_match"] == 1.0
    for c in (1, 8):
        assert r[f"ratio_c{c}"] == pytest.approx(r[f"tokens_per_s_c{c}"] / r[f"transformers_tokens_per_s_c{c}"],
                                                 rel=0.01)
        prof = r[f"profile_c{c}"]
        assert prof["total"] > 0 and prof["moe"] > 0 and prof["lm_head"] > 0
    # continuous batching serves 8 requests in the decode steps of about two (measured 10 vs 5: admission comes
    # in two ticks); one after another would take 8x. A step count, so load barely moves it; tokens/s follows
    # (measured 4.9x and 6.7x idle, 2.2x beside another test worker), so the timed bound only asks for faster
    assert 0 < r["decode_steps_c8"] <= 4 * r["decode_steps_c1"], r
    assert 0 < r["tokens_per_s_c1"] < r["tokens_per_s_c8"], r
    # the baseline too, against its own batch-1 rate in the same run: `generate` at batch 8 decodes 8 rows in the
    # steps of one (per-step overhead dominates at this size), so a baseline that stopped batching fails here
    assert 0 < r["transformers_tokens_per_s_c1"] < r["transformers_tokens_per_s_c8"], r
    from research.serving import cpu_kernels

    assert r["cpu_kernels"] is (cpu_kernels.wanted("float32") if kernels is None else kernels)
