"""The full-head tree objective, written independently of research/rl/objective.py: the tests' oracle.

It runs the LM head on EVERY slot of the packed rows (no loss-slot gather) and reads each slot's
log-prob from its parent's hidden state. The production objective (compact head) must equal it in
loss, metrics and gradients; research/rl/objective.py's `all_slots` must equal it too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from research import losses
from research.models import ModelConfig, Qwen3, head_weight
from research.models.logprobs import token_logprobs
from research.rl.objective import Objective
from research.trees.batch import MODEL_KEYS


def _parent(x_BxTxD, parent_BxT):
    return jnp.take_along_axis(x_BxTxD, jnp.maximum(parent_BxT, 0)[..., None], axis=1)


def _routing(model, params, batch, obj: Objective):
    eids = batch.get("expert_ids") if obj.routing_replay else None
    if eids is None:
        return None
    _, aux = model.apply({"params": params}, *(batch[k] for k in MODEL_KEYS), return_routing=True)
    return jnp.where(eids >= 0, eids, jax.lax.stop_gradient(aux["routed_experts"]))


def full_forward(params, batch, model_cfg: ModelConfig, obj: Objective):
    model = Qwen3(model_cfg)
    hidden = model.apply({"params": params}, *(batch[k] for k in MODEL_KEYS),
                         expert_ids_BxTxLxK=_routing(model, params, batch, obj))
    h_par = _parent(hidden, batch["parent_index"])
    logp, ent = token_logprobs(h_par, head_weight(params, model_cfg), batch["tokens"], chunk_size=obj.logprob_chunk,
                               return_entropy=True, temperature=obj.temperature)
    return h_par, logp, ent


def _values(h_par, critic_params):
    return h_par.astype(jnp.float32) @ critic_params["value_w"] + critic_params["value_b"]


def make_full_loss_fn(model_cfg: ModelConfig, obj: Objective):
    """loss_fn(params, batch, rng, critic_params=None) -> (loss, metrics) with the head on every slot."""

    def loss_fn(params, batch, rng, critic_params=None):
        del rng
        h_par, logp, ent = full_forward(params, batch, model_cfg, obj)
        norm = batch["norm"].sum()
        behav = batch["behav_logp"]
        loss, metrics = losses.tree_policy_loss(
            logp=logp, old_logp=batch.get("old_logp", behav), behav_logp=behav, weight=batch["weight"],
            adv_pos=batch["adv_pos"], adv_neg=batch["adv_neg"], count=batch["count"], normalizer=norm,
            cfg=obj.loss, ref_logp=batch.get("ref_logp"), entropy=ent)
        if obj.critic != "none":
            values = _values(h_par, critic_params)
            v_loss = losses.tree_value_loss(
                values=values, old_values=batch.get("old_values", jax.lax.stop_gradient(values)),
                weight=batch["weight"], ret_sum=batch["ret_sum"], ret_sq_sum=batch["ret_sq_sum"], normalizer=norm,
                cfg=obj.loss)
            metrics["value_loss"] = v_loss
            loss = loss + obj.loss.value_coef * v_loss
        return loss, metrics

    return loss_fn


def make_full_eval_fn(model_cfg: ModelConfig, obj: Objective):
    """Jitted (params, critic_params, batch) -> {logp, entropy, values?} on every slot."""

    def eval_fn(params, critic_params, batch):
        h_par, logp, ent = full_forward(params, batch, model_cfg, obj)
        out = {"logp": logp, "entropy": ent}
        if obj.critic != "none":
            out["values"] = _values(h_par, critic_params)
        return out

    return jax.jit(eval_fn)
