"""Bench `tree_vs_flat`: tree training vs flat per-call training on harness-shaped rollout groups.

    python -m launch.bench --suite=tree_vs_flat [--opt turns=[10,20] --opt scale=0.1 --opt prefix=2048]

A group = `sessions` (G=8) sessions of one task sharing a `prefix`-token system prompt + tools (20k in
real harnesses; 2k on CPU by default), each making `turns` calls; a turn adds gen (50-500) generated
and tool (50-500) tool-output tokens, times `scale` (CPU default 0.05; 1.0 = the real shape).
Both views run the SAME jitted train step (tiny MoE model, tree PPO objective, [rows, row_len]
batches): the tree view packs the group's prefix tree; the flat view packs every call as its own
causal sequence. Measured per T:
  tokens_ratio_T  = flat tokens / tree tokens (exact, from the full group);
  speedup_T       = flat step time / tree step time for one pass over the group. The tree view is
                    timed in full; the flat view (tens of times more rows) is timed on `flat_steps`
                    steps and scaled by its step count (steps have a fixed shape, rows are alike);
  loss_rel_diff_T = |loss_flat - loss_tree| / |loss_flat| on the first `loss_calls` calls of the group
                    (spanning sessions 0, 1, ...: their tree vs their flat rows, same params, advantages
                    from the full group), forward only.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from research import losses
from research.models import tiny_moe
from research.rl.objective import Objective, all_slots, make_rl_loss_fn
from research.train.optim import default_optim_config, make_optimizer
from research.train.state import init_train_state, make_mesh, policy_state_init
from research.train.step import make_train_step
from research.trees import synthetic
from research.trees.batch import DEVICE_ROW_FIELDS
from research.trees.builder import GroupTree, build_tree
from research.trees.packing import pack_trees
from research.trees.targets import node_stats, normalizer, rollout_advantages

KEYS = DEVICE_ROW_FIELDS
AGG = "token_mean"


def _pack(trees: list[GroupTree], adv_of: dict[str, float], row_len: int) -> dict[str, np.ndarray]:
    stats = [node_stats(t, occ_adv=np.asarray([adv_of[t.calls[c].rollout_id] for c in t.occ_call]), agg_name=AGG)
             for t in trees]
    return pack_trees(trees, stats, [normalizer(t, AGG) for t in trees], row_len=row_len)


def _steps(packed: dict[str, np.ndarray], rows: int) -> list[dict[str, jnp.ndarray]]:
    """Fixed-shape [rows, row_len] step batches; `norm` carries the pass's global normaliser once."""
    n = -(-packed["tokens"].shape[0] // rows) * rows
    total = float(packed["norm"].sum())
    out = []
    for s in range(0, n, rows):
        b = {}
        for k in KEYS:
            x = packed[k][s:s + rows]
            pad = [(0, rows - x.shape[0])] + [(0, 0)] * (x.ndim - 1)
            b[k] = np.pad(x, pad, constant_values=-1 if k == "parent_index" else 0)
        b["norm"] = np.zeros(rows, np.float32)
        b["norm"][0] = total
        b["loss_idx"], b["loss_valid"] = all_slots(rows, b["tokens"].shape[1])  # the head on every slot
        out.append({k: jnp.asarray(v) for k, v in b.items()})
    return out


def _timed(step, state, batches):
    t0 = time.perf_counter()
    for b in batches:
        state, m = step(state, b)
    jax.block_until_ready(m["loss"])
    return state, time.perf_counter() - t0


def _one(turns: int, *, sessions, prefix, gen, tool, scale, rows, flat_steps, loss_calls, seed, cfg, step, state,
         loss_eval):
    rng = np.random.default_rng(seed)
    gl = tuple(max(1, int(g * scale)) for g in gen)
    tl = tuple(max(1, int(t * scale)) for t in tool)
    calls, results = synthetic.make_harness_group(rng, sessions=sessions, turns=turns, prefix_len=prefix,
                                                  gen_len=gl, tool_len=tl, vocab=cfg.vocab_size)
    tree = build_tree(calls, results)
    flat_calls = sorted(calls, key=lambda c: (c.rollout_id, c.call_index))
    flat = [build_tree([c], results) for c in flat_calls]
    adv = rollout_advantages([tree], estimator="grpo")[0]
    adv_of = {tree.calls[c].rollout_id: float(a) for c, a in zip(tree.occ_call, adv)}
    longest = max(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    row_len = -(-longest // 512) * 512  # every call fits a row: flat chains are never split
    tree_steps = _steps(_pack([tree], adv_of, row_len), rows)
    flat_packed = _pack(flat, adv_of, row_len)
    flat_all = _steps(flat_packed, rows)
    state, _ = _timed(step, state, tree_steps[:1] + flat_all[:1])  # compile (one shape for both) + warm up
    state, tree_s = _timed(step, state, tree_steps)
    measured = flat_all[:flat_steps]
    state, flat_s = _timed(step, state, measured)
    flat_s_total = flat_s / len(measured) * len(flat_all)
    # loss on the first `loss_calls` calls (rollout 0's session first): their tree vs their flat rows
    sub = list(range(min(loss_calls, len(flat_calls))))
    sub_tree = build_tree([flat_calls[i] for i in sub], results)
    sub_flat = [flat[i] for i in sub]
    loss_tree = sum(float(loss_eval(state.params, b)) for b in _steps(_pack([sub_tree], adv_of, row_len), rows))
    loss_flat = sum(float(loss_eval(state.params, b)) for b in _steps(_pack(sub_flat, adv_of, row_len), rows))
    tree_tok, flat_tok = tree.num_nodes, sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)
    return state, {
        f"tree_tokens_{turns}": tree_tok, f"flat_tokens_{turns}": flat_tok,
        f"tokens_ratio_{turns}": flat_tok / tree_tok,
        f"tree_step_s_{turns}": tree_s, f"flat_step_s_{turns}": flat_s_total,
        f"tree_steps_{turns}": len(tree_steps), f"flat_steps_{turns}": len(flat_all),
        f"flat_steps_timed_{turns}": len(measured), f"row_len_{turns}": row_len,
        f"speedup_{turns}": flat_s_total / tree_s,
        f"loss_rel_diff_{turns}": abs(loss_flat - loss_tree) / max(abs(loss_flat), 1e-12),
        f"loss_flat_{turns}": loss_flat, f"loss_tree_{turns}": loss_tree, f"loss_calls_{turns}": len(sub),
    }


def run(turns=(10, 20, 40), sessions: int = 8, prefix: int = 2048, gen=(50, 500), tool=(50, 500),
        scale: float = 0.05, rows: int = 1, flat_steps: int = 2, loss_calls: int = 24, seed: int = 0) -> dict:
    turns = [turns] if isinstance(turns, int) else list(turns)
    cfg = tiny_moe()
    obj = Objective(loss=losses.LossConfig(aggregation=AGG))
    mesh = make_mesh(dict(data=1, fsdp=1, expert=1, tensor=1), devices=jax.devices()[:1])
    opt, _ = make_optimizer(default_optim_config())
    init = policy_state_init(cfg, opt)
    loss_fn = make_rl_loss_fn(cfg, obj)
    out = {"prefix": prefix, "scale": scale, "sessions": sessions, "rows_per_step": rows,
           "model": "tiny_moe", "backend": jax.default_backend()}
    loss_eval = jax.jit(lambda p, b: loss_fn(p, b, None)[0])
    for t in turns:
        state, shardings = init_train_state(init, mesh, cfg.logical_rules, jax.random.PRNGKey(seed))
        step = make_train_step(loss_fn=loss_fn, optimizer=opt, state_shardings=shardings,
                               batch_shardings=NamedSharding(mesh, PartitionSpec()))
        _, res = _one(t, sessions=sessions, prefix=prefix, gen=gen, tool=tool, scale=scale, rows=rows,
                      flat_steps=flat_steps, loss_calls=loss_calls, seed=seed, cfg=cfg, step=step, state=state,
                      loss_eval=loss_eval)
        out.update(res)
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}, flush=True)
    return out
