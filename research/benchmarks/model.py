"""Bench suite `model`: fwd+bwd training throughput of a tiny Qwen3-MoE, ours (JAX) vs transformers (torch).

Both sides get the *same weights* (exported through ``hf_io.save_hf`` and loaded by ``from_pretrained``)
and the same batch, in fp32 on CPU, and compute a token-mean next-token NLL and its gradient w.r.t. all
params: ours a jitted ``value_and_grad`` through the chunked fused-head ``token_logprobs``; theirs
``model(input_ids, labels=...).loss.backward()``. The loss values are cross-checked so a fast-but-wrong
implementation cannot win. Reported: tokens/s of each and ``ratio`` = ours / theirs (goal >= 1).

    python -m launch.bench --suite=model [--opt layers=4 --opt seq=512 --opt batch=2 --opt moe_impl=blocked]
"""

from __future__ import annotations

import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from research.models import ModelConfig, Qwen3, head_weight, init_params
from research.models.hf_io import save_hf
from research.models.logprobs import token_logprobs


def bench_config(layers: int = 4, d: int = 256, experts: int = 8, top_k: int = 2, vocab: int = 8192,
                 moe_impl: str = "blocked", attention_impl: str = "auto") -> ModelConfig:
    """A realistic tiny Qwen3-MoE: 30B-A3B's structure (GQA 2:1, q/k norm, norm_topk_prob) at d=256."""
    return ModelConfig(
        vocab_size=vocab, hidden_size=d, intermediate_size=4 * d, num_layers=layers, num_heads=4, num_kv_heads=2,
        head_dim=d // 4, num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=2 * d,
        norm_topk_prob=True, dtype="float32", moe_impl=moe_impl, attention_impl=attention_impl,
    )


def _ours(cfg: ModelConfig, params, tokens: np.ndarray):
    B, T = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    seg = jnp.ones((B, T), jnp.int32)
    end = jnp.full((B, T), T - 1, jnp.int32)
    tgt = jnp.asarray(np.roll(tokens, -1, axis=1))
    mask = jnp.ones((B, T), jnp.float32).at[:, -1].set(0.0)

    def loss_fn(p, toks):
        h = Qwen3(cfg).apply({"params": p}, toks, pos, seg, end)
        logp, _ = token_logprobs(h, head_weight(p, cfg), tgt, chunk_size=512, return_entropy=False)
        return -(logp * mask).sum() / mask.sum()

    step = jax.jit(jax.value_and_grad(loss_fn))
    toks = jnp.asarray(tokens)

    def run():
        loss, grads = step(params, toks)
        jax.block_until_ready(grads)
        return float(loss)

    return run


def _theirs(cfg: ModelConfig, params, tokens: np.ndarray):
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        save_hf(params, cfg, tmp)
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
    model.train()
    ids = torch.tensor(tokens, dtype=torch.long)

    def run():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss.item()

    return run


def _time(fn, iters: int, warmup: int) -> tuple[float, float]:
    for _ in range(warmup):
        loss = fn()
    best = float("inf")
    for _ in range(iters):  # best-of: the machine is shared, the minimum is the least-disturbed run
        t0 = time.perf_counter()
        loss = fn()
        best = min(best, time.perf_counter() - t0)
    return best, loss


def run(layers: int = 4, d: int = 256, experts: int = 8, top_k: int = 2, vocab: int = 8192, seq: int = 512,
        batch: int = 2, iters: int = 5, warmup: int = 2, moe_impl: str = "blocked",
        attention_impl: str = "auto") -> dict:
    import torch

    cfg = bench_config(layers, d, experts, top_k, vocab, moe_impl, attention_impl)
    params = init_params(cfg, jax.random.key(0))
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (batch, seq), 0, vocab))
    ours, theirs = _ours(cfg, params, tokens), _theirs(cfg, params, tokens)
    t_ours, loss_ours = _time(ours, iters, warmup)
    t_theirs, loss_theirs = _time(theirs, iters, warmup)
    if abs(loss_ours - loss_theirs) > 1e-3 * max(1.0, abs(loss_theirs)):
        raise AssertionError(f"loss mismatch: ours {loss_ours} vs transformers {loss_theirs}")
    n = batch * seq
    return {
        "ours_tokens_per_s": n / t_ours,
        "transformers_tokens_per_s": n / t_theirs,
        "ratio": t_theirs / t_ours,
        "loss": loss_ours,
        "loss_transformers": loss_theirs,
        "config": dict(layers=layers, d=d, experts=experts, top_k=top_k, vocab=vocab, seq=seq, batch=batch,
                       moe_impl=moe_impl, attention_impl=attention_impl),
        "backend": jax.default_backend(),
        "torch_threads": torch.get_num_threads(),
    }
