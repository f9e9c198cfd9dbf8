"""Tree PPO/GRPO and SFT losses that run the LM head only on loss slots ("compact head").

Why: with the real Qwen3 vocabulary (151,936) the head dominates a tiny policy's step — a harness
prompt is ~400 context tokens per call but only tens of generated ones. The packed batch therefore
carries `loss_idx_BxK` (row-local slots with count > 0, K fixed per compile) and `loss_valid_BxK`; the
trunk runs on every slot (tree attention needs them), the head only on the K gathered parents. Every
loss statistic is zero on the other slots, so the loss is exactly research.trees.objective's (tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from research import losses
from research.models import ModelConfig, Qwen3, head_weight
from research.models.logprobs import token_logprobs
from research.trees.objective import MODEL_KEYS, TreeObjective, _expert_ids, gather_parent

SLOT_FIELDS = ("behav_logp", "weight", "count", "adv_pos", "adv_neg", "ret_sum", "ret_sq_sum", "old_values",
               "ref_logp", "old_logp")


def loss_slots(count_BxT: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(idx [B, K'], valid [B, K']) of slots with count > 0; K' = k, doubled until every row fits."""
    per_row = (count_BxT > 0).sum(1).max(initial=0)
    while k < per_row:
        k *= 2
    B = count_BxT.shape[0]
    idx, valid = np.zeros((B, k), np.int32), np.zeros((B, k), bool)
    for b in range(B):
        (s,) = np.nonzero(count_BxT[b] > 0)
        idx[b, : len(s)], valid[b, : len(s)] = s, True
    return idx, valid


def _take(x_BxT: Array, idx_BxK: Int[Array, "B K"]) -> Array:
    return jnp.take_along_axis(x_BxT, idx_BxK, axis=1)


def compact_forward(params, batch: dict, model_cfg: ModelConfig, obj: TreeObjective):
    """(h_par_BxKxD, logp_BxK, entropy_BxK) at the loss slots (invalid slots give finite junk)."""
    model = Qwen3(model_cfg)
    hidden = model.apply({"params": params}, *(batch[k] for k in MODEL_KEYS),
                         expert_ids_BxTxLxK=_expert_ids(model, params, batch, obj))  # routing replay (MoE)
    idx = batch["loss_idx"]
    h_par = gather_parent(hidden, _take(batch["parent_index"], idx))
    logp, ent = token_logprobs(h_par, head_weight(params, model_cfg), _take(batch["tokens"], idx),
                               chunk_size=obj.logprob_chunk, return_entropy=True, temperature=obj.temperature)
    return h_par, logp, ent


def _values(h_par_BxKxD: Float[Array, "B K D"], critic_params) -> Float[Array, "B K"]:
    return h_par_BxKxD.astype(jnp.float32) @ critic_params["value_w"] + critic_params["value_b"]


def _slot(batch: dict, name: str):
    return _take(batch[name], batch["loss_idx"]) * batch["loss_valid"] if name in batch else None


def make_rl_loss_fn(model_cfg: ModelConfig, obj: TreeObjective):
    """loss_fn(params, batch, rng, critic_params=None) for make_train_step (critic = value head only)."""
    if obj.critic == "separate":
        raise ValueError("the compact-head loop supports critic 'none' or 'head'")

    def loss_fn(params, batch, rng, critic_params=None):
        del rng
        h_par, logp, ent = compact_forward(params, batch, model_cfg, obj)
        s = {k: _slot(batch, k) for k in SLOT_FIELDS}
        norm = batch["norm"].sum()
        old = s["old_logp"] if s["old_logp"] is not None else s["behav_logp"]
        loss, metrics = losses.tree_policy_loss(
            logp=logp, old_logp=old, behav_logp=s["behav_logp"], weight=s["weight"], adv_pos=s["adv_pos"],
            adv_neg=s["adv_neg"], count=s["count"], normalizer=norm, cfg=obj.loss, ref_logp=s["ref_logp"],
            entropy=ent)
        if s["ref_logp"] is not None:
            metrics["kl_ref"] = (s["count"] * losses.kl_term(logp=jax.lax.stop_gradient(logp), ref_logp=s["ref_logp"],
                                                             estimator="k3")).sum() / jnp.maximum(s["count"].sum(), 1)
        if obj.critic == "head":
            values = _values(h_par, critic_params)
            v_loss = losses.tree_value_loss(
                values=values, old_values=s["old_values"] if s["old_values"] is not None else values,
                weight=s["weight"], ret_sum=s["ret_sum"], ret_sq_sum=s["ret_sq_sum"], normalizer=norm, cfg=obj.loss)
            metrics["value_loss"] = v_loss
            loss = loss + obj.loss.value_coef * v_loss
        return loss, metrics

    return loss_fn


def make_sft_loss_fn(model_cfg: ModelConfig, obj: TreeObjective):
    """Token-mean NLL of the generated (demonstration) tokens of packed trees; ignores any critic."""

    def loss_fn(params, batch, rng, critic_params=None):
        del rng, critic_params
        _, logp, ent = compact_forward(params, batch, model_cfg, obj)
        w = _slot(batch, "weight")
        n = jnp.maximum(w.sum(), 1.0)
        nll = -(w * logp).sum() / n
        acc = (w * (logp > jnp.log(0.5))).sum() / n
        return nll, {"nll": nll, "entropy": (w * ent).sum() / n, "loss_tokens": _slot(batch, "count").sum(),
                     "p_gt_half": acc}

    return loss_fn


def make_eval_fn(model_cfg: ModelConfig, obj: TreeObjective):
    """Jitted (params, critic_params, batch) -> {logp, values?} at the loss slots (PPO pre-pass, reference)."""

    def eval_fn(params, critic_params, batch):
        h_par, logp, _ = compact_forward(params, batch, model_cfg, obj)
        out = {"logp": logp}
        if obj.critic == "head":
            out["values"] = _values(h_par, critic_params)
        return out

    return jax.jit(eval_fn)


def scatter_slots(x_BxK: np.ndarray, idx_BxK: np.ndarray, valid_BxK: np.ndarray, T: int) -> np.ndarray:
    """Compact per-slot values back to [B, T] (zeros elsewhere)."""
    out = np.zeros((x_BxK.shape[0], T), np.float32)
    b, k = np.nonzero(valid_BxK)
    out[b, idx_BxK[b, k]] = np.asarray(x_BxK)[b, k]
    return out
