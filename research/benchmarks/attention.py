"""Bench suite `attention`: block-skipping tree attention vs no skipping vs the flat per-call view.

A synthetic rollout group shaped like a harness capture: a shared prefix (system prompt + tools + task,
2k tokens here, 10-25k in real harnesses), G sessions, each ``turns`` turns of appended tokens. As a prefix
tree packed in DFS order it is one row of ~16k tokens in which session s's queries see only the prefix
and session s. We time fwd+bwd attention (same q/k/v sizes) of
- ``skip``: ``impl="blockwise"`` on the tree row (visits only the visible blocks),
- ``dense_blocks``: the same kernel with skipping disabled (every key block visited, masked per element),
- ``flat``: every model call as its own causal sequence (prompt = prefix + earlier turns), packed
  best-fit into causal rows of the same length and run with ``impl="causal"`` (which already skips
  cross-segment and above-diagonal blocks: the flat view at its best).
Ratios: ``skip_speedup = dense_blocks / skip``, ``flat_speedup = flat / skip``.

Also (``pallas=True``) the Pallas kernels' check: both forms (gpu: Triton block-sparse loop, tpu: Mosaic
splash-style grid) in interpret mode on a small packed tree vs ``impl="reference"`` (max abs error of the
output and of the q/k/v gradients, ``pallas_{form}_*``), whether each lowers for its real target
(``pallas_lowers_cuda`` / ``pallas_lowers_tpu``), and which impl ``"auto"`` runs on this backend. On a
GPU/TPU the forms run compiled, and ``pallas_fwd_bwd_s`` vs ``skip_fwd_bwd_s`` times the kernel on the
big row.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from research.models import attention_ops as ao


def tree_row(prefix: int, sessions: int, turns: int, turn_tokens: tuple[int, int], block: int, seed: int):
    """One packed tree row (segment ids, subtree_end) and the flat call lengths of the same group."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(turn_tokens[0], turn_tokens[1] + 1, size=(sessions, turns))
    n = prefix + int(lens.sum())
    T = -(-n // block) * block
    seg = np.zeros(T, np.int32)
    seg[:n] = 1
    end = np.arange(T, dtype=np.int32)
    end[:prefix] = n - 1
    cur = prefix
    for s in range(sessions):
        end[cur : cur + lens[s].sum()] = cur + lens[s].sum() - 1
        cur += lens[s].sum()
    calls = (prefix + np.cumsum(lens, axis=1)).reshape(-1)  # call t of a session: prefix + turns 0..t
    return seg[None], end[None], calls


def pack_causal(lengths: np.ndarray, T: int) -> np.ndarray:
    """Best-fit-decreasing packing of causal sequences into rows of length T: segment ids [rows, T]."""
    rows: list[list[int]] = []
    for L in sorted((int(x) for x in lengths), reverse=True):
        if L > T:
            raise ValueError(f"call of {L} tokens does not fit a row of {T}")
        free = [T - sum(r) for r in rows]
        fits = [i for i, f in enumerate(free) if f >= L]
        if fits:
            rows[min(fits, key=lambda i: free[i])].append(L)
        else:
            rows.append([L])
    seg = np.zeros((len(rows), T), np.int32)
    for r, lens in enumerate(rows):
        cur = 0
        for s, L in enumerate(lens, start=1):
            seg[r, cur : cur + L] = s
            cur += L
    return seg


def _time_fwd_bwd(impl: str, seg, end, heads: int, kv_heads: int, head_dim: int, block: int, repeats: int):
    """AOT-compile fwd+bwd of sum(out * w) for one batch of rows; return (best seconds, compile seconds)."""
    B, T = seg.shape
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (B, T, heads, head_dim))
    k = jax.random.normal(ks[1], (B, T, kv_heads, head_dim))
    v = jax.random.normal(ks[2], (B, T, kv_heads, head_dim))
    w = jax.random.normal(ks[3], q.shape)

    def loss(q, k, v, seg, end):
        out = ao.attend(q, k, v, segment_ids_BxT=seg, subtree_end_BxT=end, impl=impl, block_q=block, block_k=block)
        return jnp.sum(out * w)

    args = (q, k, v, jnp.asarray(seg), jnp.asarray(end))
    t0 = time.perf_counter()
    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best, compile_s


def run(
    prefix: int = 2048,
    sessions: int = 8,
    turns: int = 20,
    turn_min: int = 40,
    turn_max: int = 135,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 64,
    block: int = 256,
    repeats: int = 2,
    flat: bool = True,
    pallas: bool = True,
    seed: int = 0,
) -> dict:
    seg, end, calls = tree_row(prefix, sessions, turns, (turn_min, turn_max), block, seed)
    T = seg.shape[1]
    bl = ao._block_lists(jnp.asarray(seg), jnp.asarray(end), block, block, causal=False)
    visible, total = int(bl.count.sum()), (T // block) ** 2
    opts = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, block=block)
    t_skip, c_skip = _time_fwd_bwd("blockwise", seg, end, repeats=repeats, **opts)
    t_dense, _ = _time_fwd_bwd("dense_blocks", seg, end, repeats=repeats, **opts)
    out = {
        "row_tokens": T,
        "tree_tokens": int((seg != 0).sum()),
        "flat_tokens": int(calls.sum()),
        "visible_block_fraction": visible / total,
        "visible_blocks": visible,
        "skip_fwd_bwd_s": t_skip,
        "skip_compile_s": c_skip,
        "dense_blocks_fwd_bwd_s": t_dense,
        "skip_speedup": t_dense / t_skip,
        "shape": f"H={heads} K={kv_heads} D={head_dim} block={block}",
    }
    if pallas:
        out.update(pallas_check(seed=seed))
        if jax.default_backend() != "cpu":  # compiled kernels: time them on the big row
            out["pallas_fwd_bwd_s"], _ = _time_fwd_bwd("pallas", seg, end, repeats=repeats, **opts)
            out["pallas_speedup"] = t_skip / out["pallas_fwd_bwd_s"]
    if flat:
        fseg = pack_causal(calls, T)
        fend = ao.segment_subtree_end(jnp.asarray(fseg))
        flat_visible = int(ao._block_lists(jnp.asarray(fseg), fend, block, block, causal=True).count.sum())
        t_flat, _ = _time_fwd_bwd("causal", fseg, fend, repeats=1, **opts)
        out.update(
            flat_rows=int(fseg.shape[0]),
            flat_visible_blocks=flat_visible,
            flat_fwd_bwd_s=t_flat,
            flat_speedup=t_flat / t_skip,
        )
    return out


def pallas_check(seed: int = 0, T: int = 48, block: int = 16) -> dict:
    """Both Pallas forms (interpreted on CPU, compiled elsewhere) vs the reference on a packed tree row next
    to a half-padded row: max abs errors of output and gradients; plus lowering for cuda (Triton) and tpu."""
    from research.models import attention_pallas as ap

    rng = np.random.default_rng(seed)
    seg1, end1, _ = tree_row(prefix=block, sessions=2, turns=2, turn_tokens=(3, 8), block=block, seed=seed)
    n = seg1.shape[1]
    seg2 = np.where(np.arange(n) < n // 2, 1, 0).astype(np.int32)[None]
    end2 = np.where(seg2 == 1, n // 2 - 1, np.arange(n)).astype(np.int32)
    seg, end = jnp.asarray(np.concatenate([seg1, seg2])), jnp.asarray(np.concatenate([end1, end2]))
    q, k, v = (jnp.asarray(rng.normal(size=(2, n, h, 16)), jnp.float32) for h in (4, 2, 2))
    w = jnp.asarray(rng.normal(size=q.shape), jnp.float32)

    def grads(impl):
        f = lambda q, k, v: jnp.sum(w * ao.attend(q, k, v, segment_ids_BxT=seg, subtree_end_BxT=end, impl=impl,
                                                  block_q=block, block_k=block))
        out = ao.attend(q, k, v, segment_ids_BxT=seg, subtree_end_BxT=end, impl=impl, block_q=block, block_k=block)
        return out, jax.grad(f, argnums=(0, 1, 2))(q, k, v)

    ref_out, ref_g = grads("reference")
    res = {"pallas_mode": "interpret" if jax.default_backend() == "cpu" else "compiled", "auto_impl": ao.auto_impl(),
           "pallas_check_tokens": int((seg != 0).sum())}
    for form in ap.FORMS:
        out, g = grads(f"pallas_{form}")
        res[f"pallas_{form}_out_max_err"] = float(jnp.abs(out - ref_out).max())
        res[f"pallas_{form}_grad_max_err"] = max(float(jnp.abs(a - b).max()) for a, b in zip(g, ref_g))
    for platform in ("cuda", "tpu"):
        try:
            ao.lower_for(platform)
            res[f"pallas_lowers_{platform}"] = True
        except Exception as e:  # reported, not raised: the bench says which target's lowering broke and why
            res[f"pallas_lowers_{platform}"] = f"{type(e).__name__}: {str(e)[:300]}"
    return res
