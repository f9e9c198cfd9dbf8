"""THE training objective: tree PPO/GRPO and SFT over packed tree rows, LM head only on loss slots.

One forward over the packed rows (tree attention); the log-prob of a slot's token is read from its
*parent's* hidden state (`parent_index`, research/trees/packing.py), so a token with several children
gives several exact predictions. Why a "compact head": with the real Qwen3 vocabulary (151,936) the
head dominates a small policy's step, and a harness call is mostly context (hundreds of prompt tokens,
tens of generated ones). So the batch carries `loss_idx_BxK` (row-local slots with count > 0, K fixed
per compile) and `loss_valid_BxK`; the trunk runs on every slot (tree attention needs them), the head
only on the K gathered parents. The full-head objective is the special case where every slot is a loss
slot (`all_slots`); tests check both against an independent full-head oracle (tests/tree_oracle.py).

Critic (`Objective.critic`): "none" (GRPO family) or "head" (PPO: a value head on the policy's hidden
states, V of an action predicted from the state before it; the value loss also trains the trunk).
PPO needs values before the update (GAE): `make_eval_fn` runs the same forward without gradients.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from research import losses
from research.models import ModelConfig, Qwen3, head_weight
from research.models.logprobs import token_logprobs
from research.models.mrope import VisionGrid
from research.models.vision import VisionConfig, VisionTower
from research.trees.batch import MODEL_KEYS, SLOT_FIELDS


@dataclasses.dataclass(frozen=True)
class Objective:
    """Hashable (static under jit). `temperature` is the sampler's, so trainer log-probs equal rollout ones."""

    loss: losses.LossConfig = losses.LossConfig()
    critic: str = "none"  # none | head
    logprob_chunk: int = 1024
    temperature: float = 1.0
    routing_replay: bool = True  # use recorded routed experts (batch["expert_ids"]) where present
    # a Qwen3-VL policy: params {"visual", "language_model"}; batches with images carry the VISUAL and IMAGES
    # fields (research/trees/batch.py) and the tower runs once per distinct image of the step
    vision: VisionConfig | None = None

    def __post_init__(self):
        if self.critic not in ("none", "head"):
            raise ValueError(f"critic {self.critic!r} not in none, head")
        if (self.loss.algo == "ppo") != (self.critic != "none"):
            raise ValueError(f"algo {self.loss.algo!r} with critic {self.critic!r}: ppo needs a critic, grpo none")
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature} must be > 0")


# ----------------------------------------------------------------------------------------------- slots


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


def all_slots(B: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    """The full head: every position is a loss slot (statistics are zero where nothing is trained)."""
    return np.tile(np.arange(T, dtype=np.int32), (B, 1)), np.ones((B, T), bool)


def scatter_slots(x_BxK: np.ndarray, idx_BxK: np.ndarray, valid_BxK: np.ndarray, T: int) -> np.ndarray:
    """Compact per-slot values back to [B, T] (zeros elsewhere)."""
    out = np.zeros((x_BxK.shape[0], T), np.float32)
    b, k = np.nonzero(valid_BxK)
    out[b, idx_BxK[b, k]] = np.asarray(x_BxK)[b, k]
    return out


def _take(x_BxT: Array, idx_BxK: Int[Array, "B K"]) -> Array:
    return jnp.take_along_axis(x_BxT, idx_BxK, axis=1)


def _slot(batch: dict, name: str):
    return _take(batch[name], batch["loss_idx"]) * batch["loss_valid"] if name in batch else None


# ----------------------------------------------------------------------------------------------- forward


def gather_parent(x_BxTxD: Float[Array, "B T D"], parent_index_BxT: Int[Array, "B T"]) -> Float[Array, "B T D"]:
    """x[b, parent[b, t]] (index 0 for roots/padding: those slots carry no loss)."""
    idx = jnp.maximum(parent_index_BxT, 0)
    return jnp.take_along_axis(x_BxTxD, idx[..., None], axis=1)


def _visual_inputs(params, batch: dict, obj: Objective) -> dict:
    """The text model's image inputs of a packed batch: the tower over the step's distinct images, each
    placeholder slot's merged token (and DeepStack features) gathered at the slot, [B, T, D] like the rows, the
    3-D positions. {} for a batch without images."""
    if "visual_index" not in batch:
        return {}
    grid = VisionGrid(batch["patch_hw"], batch["patch_taps"], batch["patch_weights"], batch["patch_frame"], ())
    merged, deep = VisionTower(obj.vision).apply({"params": params["visual"]}, batch["pixels"], grid)
    index = jnp.asarray(batch["visual_index"])
    rows = jnp.maximum(index, 0)  # each slot's merged token, laid out [B, T, D] like the rows (and sharded so)
    return {"positions_BxT": jnp.moveaxis(batch["mrope_positions"], -1, 0), "visual_MxD": merged[rows],
            "visual_mask_BxT": index >= 0, "deepstack_KxMxD": jnp.stack([d[rows] for d in deep]) if deep else None}


def _trunk(params, batch: dict, model_cfg: ModelConfig, obj: Objective, **kw):
    """The policy's final hidden states over the packed rows (a vision policy: its text model, fed images)."""
    if obj.vision is None:
        return Qwen3(model_cfg).apply({"params": params}, *(batch[k] for k in MODEL_KEYS), **kw)
    args = dict(zip(("tokens_BxT", "positions_BxT", "segment_ids_BxT", "subtree_end_BxT"),
                    (batch[k] for k in MODEL_KEYS), strict=True))
    args.update(_visual_inputs(params, batch, obj))
    if args["positions_BxT"].ndim == 2:  # text-only rows of a vision policy: 1-D positions on all three axes
        args["positions_BxT"] = jnp.stack([args["positions_BxT"]] * 3)
    return Qwen3(model_cfg).apply({"params": params["language_model"]}, **args, **kw)


def _expert_ids(params, batch, model_cfg: ModelConfig, obj: Objective):
    """Recorded routing where known (-1 elsewhere: filled with the router's own choice, no gradient)."""
    eids = batch.get("expert_ids") if obj.routing_replay else None
    if eids is None:
        return None
    _, aux = _trunk(params, batch, model_cfg, obj, return_routing=True)
    return jnp.where(eids >= 0, eids, jax.lax.stop_gradient(aux["routed_experts"]))


def compact_forward(params, batch: dict, model_cfg: ModelConfig, obj: Objective):
    """(h_par_BxKxD, logp_BxK, entropy_BxK) at the loss slots (invalid slots give finite junk)."""
    hidden = _trunk(params, batch, model_cfg, obj,
                    expert_ids_BxTxLxK=_expert_ids(params, batch, model_cfg, obj))  # routing replay (MoE)
    idx = batch["loss_idx"]
    h_par = gather_parent(hidden, _take(batch["parent_index"], idx))
    lm = params if obj.vision is None else params["language_model"]
    logp, ent = token_logprobs(h_par, head_weight(lm, model_cfg), _take(batch["tokens"], idx),
                               chunk_size=obj.logprob_chunk, return_entropy=True, temperature=obj.temperature)
    return h_par, logp, ent


def _values(h_par_BxKxD: Float[Array, "B K D"], critic_params) -> Float[Array, "B K"]:
    return h_par_BxKxD.astype(jnp.float32) @ critic_params["value_w"] + critic_params["value_b"]


def init_critic_params(model_cfg: ModelConfig, rng: jax.Array | None = None):
    """The value head (boxed, logical axis names), zero-initialised: V = 0 until the critic learns."""
    del rng
    return {"value_w": nn.LogicallyPartitioned(jnp.zeros((model_cfg.hidden_size,), jnp.float32), names=("embed",)),
            "value_b": jnp.zeros((), jnp.float32)}


# ----------------------------------------------------------------------------------------------- losses


def make_rl_loss_fn(model_cfg: ModelConfig, obj: Objective):
    """loss_fn(params, batch, rng, critic_params=None) for make_train_step."""

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
        trained = s["count"] > 0
        # engine/trainer agreement at the slots trained on (behaviour = rollout log-probs)
        metrics["behav_logp_maxdiff"] = jnp.max(jnp.where(trained, jnp.abs(logp - s["behav_logp"]), 0.0))
        if s["ref_logp"] is not None:
            kl = losses.kl_term(logp=jax.lax.stop_gradient(logp), ref_logp=s["ref_logp"],
                                estimator=obj.loss.kl_estimator)
            metrics["kl_ref"] = (s["count"] * kl).sum() / jnp.maximum(s["count"].sum(), 1)
        if obj.critic == "head":
            values = _values(h_par, critic_params)
            old_v = s["old_values"] if s["old_values"] is not None else jax.lax.stop_gradient(values)
            v_loss = losses.tree_value_loss(values=values, old_values=old_v, weight=s["weight"],
                                            ret_sum=s["ret_sum"], ret_sq_sum=s["ret_sq_sum"], normalizer=norm,
                                            cfg=obj.loss)
            metrics["value_loss"] = v_loss
            loss = loss + obj.loss.value_coef * v_loss
        return loss, metrics

    return loss_fn


def make_sft_loss_fn(model_cfg: ModelConfig, obj: Objective):
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


def make_eval_fn(model_cfg: ModelConfig, obj: Objective):
    """Jitted (params, critic_params, batch) -> {logp, entropy, values?} at the loss slots (no gradients):
    PPO's value pre-pass, the KL reference, pi_old, and the post-update diagnostics."""

    def eval_fn(params, critic_params, batch):
        h_par, logp, ent = compact_forward(params, batch, model_cfg, obj)
        out = {"logp": logp, "entropy": ent}
        if obj.critic == "head":
            out["values"] = _values(h_par, critic_params)
        return out

    return jax.jit(eval_fn)
