"""Bench `engine`: decode tokens/s of the JAX engine at 1, 8 and 32 concurrent requests vs transformers.

    python -m launch.bench --suite=engine [--opt new_tokens=64] [--opt reps=3] [--opt profile=true] ...

Same weights in both (ours exported with research.models.hf_io.save_hf, loaded by transformers'
Qwen3MoeForCausalLM), fp32, greedy, no stop token, `prompt_len`-token random prompts. Tokens/s is
end to end (prefill included) over the whole round: c requests x new_tokens / wall time. The
transformers baseline is `generate` at batch 1 and batch 8 (same prompts), after one warm-up call, with
torch at 1 and at 2 threads, keeping the faster (on a loaded machine torch's spinning OpenMP threads can
make 2 threads 5x slower than 1; the baseline gets its best); ours runs after the engine's warm-up
(compilation excluded from both). The machine is shared, so the two
are measured interleaved, `reps` times (ours c1, theirs c1, ours c8, theirs c8, ours c32, ...), and each
key is the median over reps; `ratio_c1` / `ratio_c8` = ours / transformers. `greedy_match` is the
fraction of the c=1 tokens on which both implementations agree (a cross-check that both run the same model).

`profile=true` adds `profile_c{1,8}`: milliseconds per decode step of the engine's block function by
category (lm_head, moe, attention, attn_proj, sampling, cache_io, other; see xla_profile.py) at batch 1 and 8.
`kernels=false` serves on XLA's ops instead of the CPU decode kernels (research/serving/cpu_kernels; the
default decides as the engine does), reported as `cpu_kernels`.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time

import jax
import numpy as np

from research.benchmarks import xla_profile
from research.models import init_params, tiny_moe
from research.serving.api import GenerateRequest, SamplingParams
from research.serving.jax_engine import EngineConfig, JaxEngine
from research.serving.qwen3_runner import Qwen3Runner
from research.serving.runner import DecodeState


def categories(vocab: int) -> tuple[tuple[str, str], ...]:
    """Profile categories: named scopes of decode.py / runner.py (the LM head also by its [B, V] result)."""
    return (("sampling", "sampling"), ("lm_head", rf"lm_head|\|f32\[\d+,{vocab}\]"), ("moe", "moe"), ("mlp", "mlp"),
            ("attention", "attention"), ("attn_proj", "attn_proj"), ("cache_io", "cache_io"))


def bench_config(layers: int, hidden: int, experts: int, top_k: int, vocab: int):
    return tiny_moe(
        num_layers=layers, hidden_size=hidden, num_heads=8, num_kv_heads=4, head_dim=hidden // 8,
        intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2, num_experts=experts,
        num_experts_per_tok=top_k, vocab_size=vocab, dtype="float32",
    )


async def _round(engine: JaxEngine, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    reqs = [GenerateRequest(p, SamplingParams(temperature=0.0, max_new_tokens=new_tokens)) for p in prompts]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(r) for r in reqs))
    dt = time.perf_counter() - t0
    assert all(len(r.token_ids) == new_tokens for r in results)
    return len(prompts) * new_tokens / dt, [r.token_ids for r in results]


class _Transformers:
    """transformers' `generate` on our weights (exported to an HF checkpoint)."""

    def __init__(self, cfg, params):
        import torch
        from transformers import AutoModelForCausalLM

        from research.models.hf_io import save_hf

        self.torch = torch
        with tempfile.TemporaryDirectory() as d:
            save_hf(params, cfg, d)
            self.model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()

    def best_round(self, batch: list[list[int]], n: int, threads: tuple[int, ...]) -> tuple[float, list[int]]:
        """The faster of one round per torch thread count."""
        before = self.torch.get_num_threads()
        try:
            runs = []
            for t in threads:
                self.torch.set_num_threads(t)
                runs.append(self.round(batch, n))
            return max(runs, key=lambda r: r[0])
        finally:
            self.torch.set_num_threads(before)

    def round(self, batch: list[list[int]], n: int) -> tuple[float, list[int]]:
        torch = self.torch
        ids = torch.tensor(batch, dtype=torch.long)
        with torch.no_grad():
            t0 = time.perf_counter()
            gen = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, eos_token_id=None, pad_token_id=0)
            dt = time.perf_counter() - t0
        assert gen.shape[1] == ids.shape[1] + n
        return len(batch) * n / dt, gen[0, ids.shape[1]:].tolist()


async def _measure(engine, hf, prompts, concurrency, new_tokens, reps, hf_threads) -> tuple[dict, list, list]:
    """Interleaved rounds; returns (per-key lists of tokens/s, our first c=1 completion, theirs)."""
    samples: dict[str, list[float]] = {}
    ours_first = hf_first = None
    await _round(engine, prompts[: max(concurrency)], 4)  # waits for the warm-up compilation, fills every bucket
    if hf is not None:
        hf.round(prompts[:1], 4)
    for _ in range(reps):
        for c in concurrency:
            await engine.flush_cache()  # no prefix reuse from the previous round
            steps0 = engine.stats["decode_steps"]
            tps, toks = await _round(engine, prompts[:c], new_tokens)
            samples.setdefault(f"tokens_per_s_c{c}", []).append(tps)
            # the load-independent side of batching: decode steps a round of c requests took (c x one's if serial)
            samples.setdefault(f"decode_steps_c{c}", []).append(engine.stats["decode_steps"] - steps0)
            ours_first = ours_first or toks[0]
            if hf is not None and c in (1, 8):
                tps, first = hf.best_round(prompts[:c], new_tokens, hf_threads)
                samples.setdefault(f"transformers_tokens_per_s_c{c}", []).append(tps)
                hf_first = hf_first or first
    return samples, ours_first, hf_first


def profile_block(engine: JaxEngine, batch: int, *, steps: int, ctx_len: int, calls: int = 5) -> dict:
    """Milliseconds per decode step by category for one `steps`-step block of `batch` slots (all decoding)."""
    fns, S = engine._fns, engine.cfg.num_slots
    state = {"cache": engine.runner.init_cache(S, engine.cfg.max_len + engine.cfg.prefill_chunk),
             "state": DecodeState.zeros(S)}
    tokens = np.random.default_rng(0).integers(0, engine.runner.vocab_size, S).astype(np.int32)  # varied routing
    host = DecodeState(tokens, np.full(S, ctx_len // 2, np.int32), np.full(S, 1 << 20, np.int32), np.zeros(S, np.int32))
    args = lambda: (engine._params, state["cache"], state["state"], np.ones(S, bool), host, engine._sampling,
                    np.int32(steps))
    kw = dict(batch=batch, ctx_len=ctx_len, steps=steps)
    names = xla_profile.op_names(fns.decode.lower(*args(), **kw).compile().as_text())

    def call():
        state["cache"], state["state"], out = fns.decode(*args(), **kw)
        jax.block_until_ready(out)

    times = xla_profile.trace_ops(call, calls=calls)
    cats = categories(engine.runner.vocab_size)
    per_step = {k: round(v / steps, 3) for k, v in xla_profile.by_category(times, names, cats).items()}
    per_step["total"] = round(sum(per_step.values()), 3)
    return per_step


def run(
    *,
    new_tokens: int = 64,
    prompt_len: int = 32,
    concurrency: tuple[int, ...] = (1, 8, 32),
    layers: int = 4,
    hidden: int = 256,
    experts: int = 8,
    top_k: int = 2,
    vocab: int = 4096,
    seed: int = 0,
    reps: int = 3,
    decode_steps: int = 8,
    transformers: bool = True,
    hf_threads: tuple[int, ...] = (1, 2),
    profile: bool = False,
    kernels: bool | None = None,
) -> dict:
    concurrency = tuple(int(c) for c in concurrency)
    cfg = bench_config(layers, hidden, experts, top_k, vocab)
    params = jax.jit(lambda k: init_params(cfg, k))(jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, vocab, (max(concurrency), prompt_len)).tolist()
    hf = _Transformers(cfg, params) if transformers else None
    slots = max(concurrency)
    ecfg = EngineConfig(num_slots=slots, max_len=prompt_len + new_tokens + 8, prefill_chunk=prompt_len,
                        decode_buckets=tuple(sorted(set(concurrency))), decode_steps=decode_steps)

    runner = Qwen3Runner(cfg, kernels=kernels)

    async def go():
        engine = JaxEngine(runner, params, config=ecfg)
        try:
            measured = await _measure(engine, hf, prompts, concurrency, new_tokens, reps,
                                     tuple(int(t) for t in hf_threads))
            prof = {}
            if profile:
                for b in (1, 8):
                    bucket = next(x for x in ecfg.buckets() if x >= b)
                    prof[f"profile_c{b}"] = profile_block(engine, bucket, steps=decode_steps,
                                                          ctx_len=ecfg.len_bucket(prompt_len + new_tokens // 2))
            return measured, engine.stats["decode_steps"], prof
        finally:
            await engine.close()

    (samples, ours_first, hf_first), steps, prof = asyncio.run(go())
    result = {"model": f"moe L{layers} d{hidden} E{experts} top{top_k} V{vocab}", "new_tokens": new_tokens,
              "cpu_kernels": runner.kernels,
              "prompt_len": prompt_len, "reps": reps, "decode_steps": decode_steps,
              **{k: round(statistics.median(v), 2) for k, v in samples.items()}, "engine_decode_steps": steps,
              **prof}
    if hf is not None:
        agree = next((i for i, (a, b) in enumerate(zip(ours_first, hf_first)) if a != b), len(hf_first))
        result["greedy_match"] = round(agree / len(hf_first), 3)
        for c in (1, 8):
            ours, theirs = result.get(f"tokens_per_s_c{c}"), result.get(f"transformers_tokens_per_s_c{c}")
            if ours and theirs:
                result[f"ratio_c{c}"] = round(ours / theirs, 3)
    return result
