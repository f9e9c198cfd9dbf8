"""Bench `engine`: decode tokens/s of the JAX engine at 1, 8 and 32 concurrent requests vs transformers.

    python -m launch.bench --suite=engine [--opt new_tokens=64] [--opt layers=4] ...

Same weights in both (ours exported with research.models.hf_io.save_hf, loaded by transformers'
Qwen3MoeForCausalLM), fp32, greedy, no stop token, `prompt_len`-token random prompts. Tokens/s is
end to end (prefill included) over the whole round: c requests x new_tokens / wall time. The
transformers baseline is `generate` at batch 1 (and batch 8 when `hf_batch8`), after one warm-up call;
ours runs after the engine's warm-up (compilation excluded from both). `greedy_match` is the fraction
of the c=1 tokens on which both implementations agree (a cross-check that both run the same model).
"""

from __future__ import annotations

import asyncio
import tempfile
import time

import jax
import numpy as np

from research.models import init_params, tiny_moe
from research.serving.api import GenerateRequest, SamplingParams
from research.serving.jax_engine import EngineConfig, JaxEngine
from research.serving.qwen3_runner import Qwen3Runner


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


async def _ours(cfg, params, prompts, concurrency, new_tokens, prompt_len) -> tuple[dict, list[int]]:
    slots = max(concurrency)
    ecfg = EngineConfig(num_slots=slots, max_len=prompt_len + new_tokens + 8, prefill_chunk=prompt_len,
                        decode_buckets=tuple(sorted(set(concurrency))))
    engine = JaxEngine(Qwen3Runner(cfg), params, config=ecfg)
    try:
        await _round(engine, prompts[:slots], 4)  # waits for the warm-up compilation, fills every bucket
        out, first = {}, None
        for c in concurrency:
            await engine.flush_cache()  # no prefix reuse from the previous round
            tps, toks = await _round(engine, prompts[:c], new_tokens)
            out[f"tokens_per_s_c{c}"] = round(tps, 2)
            first = first or toks[0]
        out["engine_decode_steps"] = engine.stats["decode_steps"]
        return out, first
    finally:
        await engine.close()


def _transformers(cfg, params, prompts, new_tokens, batch8: bool) -> tuple[dict, list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    from research.models.hf_io import save_hf

    with tempfile.TemporaryDirectory() as d:
        save_hf(params, cfg, d)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=new_tokens)
    out: dict = {}

    def timed(batch: list[list[int]], n: int) -> tuple[float, list[int]]:
        ids = torch.tensor(batch, dtype=torch.long)
        with torch.no_grad():
            t0 = time.perf_counter()
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, **{**kw,
                                 "min_new_tokens": n})
            dt = time.perf_counter() - t0
        assert gen.shape[1] == ids.shape[1] + n
        return len(batch) * n / dt, gen[0, ids.shape[1]:].tolist()

    timed(prompts[:1], 4)  # warm-up
    tps, first = timed(prompts[:1], new_tokens)
    out["transformers_tokens_per_s_c1"] = round(tps, 2)
    if batch8:
        out["transformers_tokens_per_s_c8"] = round(timed(prompts[:8], new_tokens)[0], 2)
    return out, first


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
    transformers: bool = True,
    hf_batch8: bool = True,
) -> dict:
    concurrency = tuple(int(c) for c in concurrency)
    cfg = bench_config(layers, hidden, experts, top_k, vocab)
    params = jax.jit(lambda k: init_params(cfg, k))(jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, vocab, (max(concurrency), prompt_len)).tolist()
    out, ours_first = asyncio.run(_ours(cfg, params, prompts, concurrency, new_tokens, prompt_len))
    result = {"model": f"moe L{layers} d{hidden} E{experts} top{top_k} V{vocab}", "new_tokens": new_tokens,
              "prompt_len": prompt_len, **out}
    if transformers:
        hf, hf_first = _transformers(cfg, params, prompts, new_tokens, hf_batch8)
        result.update(hf)
        agree = next((i for i, (a, b) in enumerate(zip(ours_first, hf_first)) if a != b), len(hf_first))
        result["greedy_match"] = round(agree / len(hf_first), 3)
        result["ratio_c1"] = round(result["tokens_per_s_c1"] / hf["transformers_tokens_per_s_c1"], 3)
    return result
