"""Tree PPO/GRPO objective for `research.train.step.make_train_step`: model forward on packed tree rows.

One forward over the packed rows (tree attention), then the log-prob of every slot's token is read
from its *parent's* hidden state (`parent_index`, see research/trees/packing.py): gather hidden by
parent, then the fused chunked log-prob function, so a token with several children yields several
exact predictions without [T, V] logits. Values (PPO) use the same gather: V of an action is
predicted from the state before it.

Critic modes (`TreeObjective.critic`): "none" (GRPO family), "head" (a value head on the policy's
hidden states; `critic_params` holds only the head, the value loss also trains the trunk), or
"separate" (an independent Qwen3 critic with its own head). The train state keeps the critic in
`critic_params` either way, updated by its own optimizer.

PPO needs values before the update (GAE): `make_tree_eval_fn` runs the same forward without
gradients and returns per-slot log-probs/values; `ppo_stats_from_values` turns them into the
batch's node statistics via GAE on the trees (host side) and fills `old_values`.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from research import losses
from research.models import ModelConfig, Qwen3, dummy_inputs, head_weight
from research.models.logprobs import token_logprobs
from research.trees.builder import GroupTree
from research.trees.targets import STAT_FIELDS, node_stats, tree_gae

MODEL_KEYS = ("tokens", "positions", "segment_ids", "subtree_end")


@dataclasses.dataclass(frozen=True)
class TreeObjective:
    loss: losses.LossConfig = losses.LossConfig()
    critic: str = "none"  # none | head | separate
    critic_model: ModelConfig | None = None  # for critic="separate"
    logprob_chunk: int = 1024
    temperature: float = 1.0  # the sampler's temperature, so trainer log-probs match rollout log-probs
    routing_replay: bool = True  # use recorded routed experts (batch["expert_ids"]) where present

    def __post_init__(self):
        if self.critic not in ("none", "head", "separate"):
            raise ValueError(f"critic {self.critic!r} not in none, head, separate")
        if (self.loss.algo == "ppo") != (self.critic != "none"):
            raise ValueError(f"algo {self.loss.algo!r} with critic {self.critic!r}: ppo needs a critic, grpo none")
        if self.critic == "separate" and self.critic_model is None:
            raise ValueError("critic='separate' needs critic_model")


def gather_parent(x_BxTxD: Float[Array, "B T D"], parent_index_BxT: Int[Array, "B T"]) -> Float[Array, "B T D"]:
    """x[b, parent[b, t]] (index 0 for roots/padding: those slots carry no loss)."""
    idx = jnp.maximum(parent_index_BxT, 0)
    return jnp.take_along_axis(x_BxTxD, idx[..., None], axis=1)


def _expert_ids(model, params, batch, obj):
    """Recorded routing where known (-1 elsewhere: filled with the router's own choice, no gradient)."""
    eids = batch.get("expert_ids") if obj.routing_replay else None
    if eids is None:
        return None
    _, aux = model.apply({"params": params}, *(batch[k] for k in MODEL_KEYS), return_routing=True)
    return jnp.where(eids >= 0, eids, jax.lax.stop_gradient(aux["routed_experts"]))


def _policy_forward(params, batch, model_cfg: ModelConfig, obj: TreeObjective):
    model = Qwen3(model_cfg)
    hidden = model.apply({"params": params}, *(batch[k] for k in MODEL_KEYS),
                         expert_ids_BxTxLxK=_expert_ids(model, params, batch, obj))
    h_par = gather_parent(hidden, batch["parent_index"])
    logp, ent = token_logprobs(h_par, head_weight(params, model_cfg), batch["tokens"], chunk_size=obj.logprob_chunk,
                               return_entropy=True, temperature=obj.temperature)
    return h_par, logp, ent


def _values(h_par, critic_params, batch, obj: TreeObjective):
    if obj.critic == "separate":
        hidden = Qwen3(obj.critic_model).apply({"params": critic_params["model"]}, *(batch[k] for k in MODEL_KEYS))
        h_par = gather_parent(hidden, batch["parent_index"])
    return h_par.astype(jnp.float32) @ critic_params["value_w"] + critic_params["value_b"]


def init_critic_params(model_cfg: ModelConfig, obj: TreeObjective, rng: jax.Array):
    """Critic params (boxed, logical axis names): the value head (+ a Qwen3 trunk when separate)."""
    cfg = obj.critic_model if obj.critic == "separate" else model_cfg
    out = {"value_w": nn.LogicallyPartitioned(jnp.zeros((cfg.hidden_size,), jnp.float32), names=("embed",)),
           "value_b": jnp.zeros((), jnp.float32)}
    if obj.critic == "separate":
        out["model"] = Qwen3(cfg).init(rng, *dummy_inputs())["params"]
    return out


def make_tree_loss_fn(model_cfg: ModelConfig, algo_config: TreeObjective):
    """loss_fn(params, batch, rng, critic_params=None) -> (loss, metrics) over packed tree rows."""
    obj = algo_config

    def loss_fn(params, batch, rng, critic_params=None):
        del rng
        h_par, logp, ent = _policy_forward(params, batch, model_cfg, obj)
        norm = batch["norm"].sum()
        behav = batch["behav_logp"]
        loss, metrics = losses.tree_policy_loss(
            logp=logp, old_logp=batch.get("old_logp", behav), behav_logp=behav, weight=batch["weight"],
            adv_pos=batch["adv_pos"], adv_neg=batch["adv_neg"], count=batch["count"], normalizer=norm,
            cfg=obj.loss, ref_logp=batch.get("ref_logp"), entropy=ent)
        if obj.critic != "none":
            values = _values(h_par, critic_params, batch, obj)
            v_loss = losses.tree_value_loss(
                values=values, old_values=batch.get("old_values", jax.lax.stop_gradient(values)),
                weight=batch["weight"], ret_sum=batch["ret_sum"], ret_sq_sum=batch["ret_sq_sum"], normalizer=norm,
                cfg=obj.loss)
            metrics["value_loss"] = v_loss
            loss = loss + obj.loss.value_coef * v_loss
        return loss, metrics

    return loss_fn


def make_tree_eval_fn(model_cfg: ModelConfig, algo_config: TreeObjective):
    """Jitted (params, critic_params, batch) -> {logp, entropy, values?}: pi_old / reference / GAE pre-pass."""
    obj = algo_config

    def eval_fn(params, critic_params, batch):
        h_par, logp, ent = _policy_forward(params, batch, model_cfg, obj)
        out = {"logp": logp, "entropy": ent}
        if obj.critic != "none":
            out["values"] = _values(h_par, critic_params, batch, obj)
        return out

    return jax.jit(eval_fn)


def ppo_stats_from_values(trees: list[GroupTree], packed: dict[str, np.ndarray], values_BxT: np.ndarray, *,
                          gamma: float, lam: float, aggregation: str) -> dict[str, np.ndarray]:
    """GAE on each tree with the pre-pass values; returns `packed` with fresh stats and `old_values`."""
    values_BxT = np.asarray(values_BxT, np.float32)
    own = packed["own"]
    out = dict(packed)
    node_values = [np.zeros(t.num_nodes, np.float32) for t in trees]
    for b, i in zip(*np.nonzero(own)):
        node_values[packed["tree_id"][b, i]][packed["node_id"][b, i]] = values_BxT[b, i]
    stats = []
    for t, nv in zip(trees, node_values):
        adv, ret = tree_gae(t, node_values=nv, gamma=gamma, lam=lam)
        stats.append(node_stats(t, occ_adv=adv, occ_ret=ret, agg_name=aggregation))
    for k in STAT_FIELDS:
        arr = np.zeros_like(packed[k])
        for t, s in enumerate(stats):
            sel = own & (packed["tree_id"] == t)
            arr[sel] = s[k][packed["node_id"][sel]]
        out[k] = arr
    out["old_values"] = values_BxT
    return out
