"""The learner: one TrainState, the jitted RL and SFT steps, the RL update on a batch, weight export.

Algorithms (`config.algo`): "grpo" (tree GRPO-family, no critic), "ppo" (tree PPO with a value head:
GAE on the trees from a no-grad pre-pass), "sft" (NLL of captured demonstrations). One state serves
all three, so an SFT warm start continues as RL in the same run; an SFT step on a PPO state simply
leaves the critic untouched.

The RL update on one batch (`Learner.train`): `train.epochs` passes over the batch, each split into
`train.minibatches` optimizer steps over disjoint row slices (reshuffled per pass). pi_old is the
policy before the update: the behaviour log-probs (exact for the fp32 JAX engine) or, with
`rl.recompute_old_logp`, a trainer forward. With one pass of one minibatch the PPO ratio is 1 and the
clip never acts; with more, it bounds how far one batch moves the policy. A batch in which no loss
token carries an advantage is not stepped on at all (`train.skip_empty`): with zero gradients Adam's
momentum would still move every parameter. Diagnostics (`rl/diagnostics.py`) measure what the update
did to the batch's own tokens.
"""

from __future__ import annotations

import functools
import logging
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from research.models import hf_io, qwen3_vl
from research.models.hf_io import load_hf
from research.rl import diagnostics, dlogp
from research.rl.batches import StepBatch
from research.rl.config import RunConfig
from research.rl.objective import (
    init_critic_params,
    make_eval_fn,
    make_rl_loss_fn,
    make_sft_loss_fn,
    scatter_slots,
)
from research.train.optim import make_optimizer
from research.train.state import StateInit, abstract_train_state, init_train_state, make_mesh, policy_state_init
from research.train.step import SHARED_FIELDS, TrainStep, make_train_step
from research.trees import batch as fields
from research.trees.batch import PPO_FIELDS
from research.trees.targets import ppo_stats_from_values

log = logging.getLogger(__name__)


def state_init(run: RunConfig) -> StateInit:
    """Policy (+ value head for PPO) params and their optimizers, as functions (nothing is allocated)."""
    optimizer, _ = make_optimizer(run.optim)
    if run.algo != "ppo":
        return policy_state_init(run.model, optimizer, vision=run.vision)
    return policy_state_init(run.model, optimizer, critic_init_fn=lambda r: init_critic_params(run.model, r),
                             critic_optimizer=make_optimizer(run.critic_optim)[0], vision=run.vision)


def rl_optimizer(run: RunConfig, init: StateInit):
    """The RL phase's optimizer: `config.rl_optim` when set (an SFT warm start at a high lr followed by RL
    at a much lower one, with fresh Adam moments: see Learner.start_rl), else the policy's `config.optim`."""
    return init.optimizer if run.rl_optim is None else make_optimizer(run.rl_optim)[0]


def make_steps(run: RunConfig, init: StateInit, mesh, state_shardings) -> dict[str, TrainStep]:
    """{"rl": TrainStep, "sft": TrainStep} sharing the state layout; rows sharded over `train.batch_axes` (a
    vision policy's images, which are not rows, replicated: each device's rows may show any of them)."""
    obj = run.objective()
    kw = dict(state_shardings=state_shardings, batch_shardings=functools.partial(
        fields.sharding, mesh=mesh, batch_axes=tuple(run.train.batch_axes)), critic_optimizer=init.critic_optimizer,
              num_microbatches=run.train.num_microbatches)
    return {"rl": make_train_step(loss_fn=make_rl_loss_fn(run.model, obj), optimizer=rl_optimizer(run, init), **kw),
            "sft": make_train_step(loss_fn=make_sft_loss_fn(run.model, obj), optimizer=init.optimizer, **kw)}


def _global_sum(x: float) -> float:
    """x summed over processes (one process: x)."""
    if jax.process_count() == 1:
        return x
    return float(np.sum(multihost_utils.process_allgather(np.asarray(x, np.float64))))


class Learner:
    def __init__(self, config):
        # a RunConfig its caller validated for these devices (the loop's start) comes back as is: not twice
        self.run = run = RunConfig.of(config, num_devices=jax.device_count())
        self.model_cfg = run.model
        self.mesh = make_mesh(run.mesh)
        self.obj = run.objective()
        self.init = state_init(run)
        rules = self.model_cfg.logical_rules
        self.state, self.shardings = init_train_state(self.init, self.mesh, rules, jax.random.PRNGKey(run.seed))
        self.abstract = abstract_train_state(self.init, self.mesh, rules)
        if run.init_checkpoint:  # start from an HF checkpoint (a resumed run restores over it)
            self.state = self.state.replace(params=self._load_hf(run.init_checkpoint))
        self._steps = make_steps(run, self.init, self.mesh, self.shardings)
        self._eval = make_eval_fn(self.model_cfg, self.obj)
        self.ref_params = None  # frozen reference policy (only when the KL penalty is on): see init_reference
        self.last_dlogp: list[np.ndarray] | None = None  # per tree of the last RL update: research/rl/dlogp.py

    def _load_hf(self, path: str):
        """An HF checkpoint's params, each array put into its shard (a Qwen3-VL dir for a vision policy, read with
        the run's configs: a tensor whose shape they do not give is a CheckpointError naming its key)."""
        if self.run.vision is None:
            return load_hf(path, self.model_cfg, shardings=self.shardings.params)[0]
        params = qwen3_vl.params_from_state(self.model_cfg, self.run.vision, hf_io.state_reader(path))
        return jax.device_put(params, self.shardings.params)

    @property
    def step(self) -> int:
        """Optimizer updates applied so far (the learning-rate schedule's clock)."""
        return int(self.state.step)

    def start_rl(self) -> bool:
        """Entering the RL phase: with `config.rl_optim`, fresh optimizer moments for it (returns True).

        Why: Adam's second moments from SFT's last steps (tiny gradients on memorised demonstrations) would
        turn the first, much larger policy gradients into steps of several times the learning rate, and
        the SFT learning rate itself is far too high for RL (measured: a 0.78 pass-rate policy collapses to
        0 within 10 GRPO steps at the SFT lr of 4e-3)."""
        if self.run.rl_optim is None:
            return False
        opt = rl_optimizer(self.run, self.init)
        if jax.tree.structure(jax.eval_shape(opt.init, self.state.params)) != jax.tree.structure(self.state.opt_state):
            raise ValueError("config.rl_optim must build the same optimizer state structure as config.optim")
        fresh = jax.jit(opt.init, out_shardings=self.shardings.opt_state)(self.state.params)
        self.state = self.state.replace(opt_state=fresh)
        return True

    # ------------------------------------------------------------------ reference policy (KL penalty)
    @property
    def uses_reference(self) -> bool:
        return self.run.uses_reference

    def init_reference(self, directory: str | pathlib.Path | None = None) -> None:
        """Fixes the reference policy of the KL penalty; call it when the RL phase starts (and on resume).

        Why a saved copy: the reference is the policy as it was when RL began (after any SFT warm start),
        which a resumed run can no longer recompute from its trained params. `config.rl.ref_checkpoint` (an
        HF dir) is immutable, so it is simply loaded again. Otherwise the first call snapshots the current
        params and, given `directory`, saves them there once (orbax finalises by an atomic rename, so a
        `kill -9` leaves the complete reference or none); later calls (a resumed run) restore that copy.
        """
        if not self.uses_reference or self.ref_params is not None:
            return
        if self.run.rl.ref_checkpoint:

            self.ref_params = self._load_hf(self.run.rl.ref_checkpoint)
            log.info("reference policy: HF checkpoint %s", self.run.rl.ref_checkpoint)
            return
        if directory is None:
            self.ref_params = self._snapshot()
            return
        path = pathlib.Path(directory).absolute() / "params"
        ckpt = ocp.StandardCheckpointer()
        try:
            if path.exists():
                self.ref_params = ckpt.restore(path, self.abstract.params)
                log.info("reference policy: restored from %s", path)
                return
            for tmp in path.parent.glob(f"{path.name}.orbax-checkpoint-tmp*"):  # a save killed mid-write
                shutil.rmtree(tmp, ignore_errors=True)
            self.ref_params = self._snapshot()
            ckpt.save(path, self.ref_params)
            ckpt.wait_until_finished()
            log.info("reference policy: params at step %d saved to %s", self.step, path)
        finally:
            ckpt.close()

    def _snapshot(self):
        """A device copy on the same shardings (the train step donates the state's own buffers)."""
        return jax.tree.map(jnp.copy, self.state.params)

    def slot_eval(self, params, dev: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{logp, entropy, values?} as [B, T] float32 (zero off the loss slots) under `params`, no gradients."""
        with jax.set_mesh(self.mesh):
            out = self._eval(params, self.state.critic_params, dev)
        T = dev["tokens"].shape[1]
        return {k: scatter_slots(np.asarray(v), dev["loss_idx"], dev["loss_valid"], T) for k, v in out.items()}

    def reference_logp(self, dev: dict[str, np.ndarray]) -> np.ndarray:
        """[B, T] float32 log-probs of the batch's tokens under the reference, at the loss slots (0 elsewhere)."""
        if self.ref_params is None:
            self.init_reference()  # a Learner driven without the loop: the reference is its first RL state
        return self.slot_eval(self.ref_params, dev)["logp"]

    # ------------------------------------------------------------------ steps
    def prepare(self, batch: StepBatch) -> dict[str, np.ndarray]:
        """Reference log-probs (KL penalty on); pi_old (recompute_old_logp); PPO: values from a no-grad
        pass -> GAE on the trees -> fresh node statistics + old_values."""
        dev = dict(batch.device)
        if self.uses_reference:
            dev["ref_logp"] = self.reference_logp(batch.device)
        need_old, ppo = self.run.rl.recompute_old_logp, self.run.algo == "ppo"
        if not (need_old or ppo):
            return dev
        out = self.slot_eval(self.state.params, batch.device)
        if need_old:
            dev["old_logp"] = out["logp"]
        if ppo:
            rl = self.run.rl
            stats = ppo_stats_from_values(batch.trees, batch.packed, out["values"], gamma=rl.gamma, lam=rl.lam,
                                          aggregation=rl.aggregation)
            dev.update({k: stats[k] for k in PPO_FIELDS})
        return dev

    def train(self, batch: StepBatch, *, sft: bool = False) -> dict[str, float]:
        """One SFT step, or the RL update on `batch` (epochs x minibatches optimizer steps; see module doc). After
        an RL update with diagnostics, `last_dlogp` holds each tree's per-node log-prob change (research/rl/dlogp.py;
        None when the batch has more loss tokens than `metrics.dlogp_tokens`)."""
        self.last_dlogp = None
        if sft:
            self.state, metrics = self._steps["sft"](self.state, batch.device)
            return {k: float(v) for k, v in jax.device_get(metrics).items()}
        dev = self.prepare(batch)
        multi = jax.process_count() > 1  # rows span processes: host statistics come from this process's rows
        signal = diagnostics.signal(batch.packed if multi else dev, batch.trees)
        if self.run.train.skip_empty and self.run.algo != "ppo" and _global_sum(signal["adv_tokens"]) == 0:
            return {**signal, "skipped": 1.0}  # (every process agrees: the sum is global)
        old_logp = dev.get("old_logp", dev["behav_logp"])
        runs = [jax.device_get(m) for m in self._update(dev)]
        metrics = {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}
        metrics.update(signal, skipped=0.0, optimizer_steps=float(len(runs)),
                       clip_frac_last=float(runs[-1]["clip_frac"]))
        if self.run.train.diagnostics and not multi:
            new = self.slot_eval(self.state.params, dev)
            metrics.update(diagnostics.update_effect(dev, old_logp=old_logp, new_logp=new["logp"]))
            if 0 < sum(t.occ_node.shape[0] for t in batch.trees) <= self.run.metrics.dlogp_tokens:
                self.last_dlogp = dlogp.node_dlogp(batch.packed, batch.trees, new["logp"])
        return metrics

    def _update(self, dev: dict[str, np.ndarray]):
        """Yields the metrics of each optimizer step of the RL update (device arrays)."""
        t = self.run.train
        B = dev["tokens"].shape[0]
        rng = np.random.default_rng([self.run.seed, self.step])  # row order: a function of (seed, step), resumable
        if t.minibatches > 1:
            dev = diagnostics.per_row_normaliser(dev)
        for _ in range(t.epochs):
            order = rng.permutation(B) if (t.epochs > 1 or t.minibatches > 1) else np.arange(B)
            for rows in np.split(order, t.minibatches):
                whole = len(rows) == B and (rows == np.arange(B)).all()
                mb = dev if whole else {k: v if k in SHARED_FIELDS else v[rows] for k, v in dev.items()}
                self.state, metrics = self._steps["rl"](self.state, mb)
                yield metrics

    def params_copy(self):
        """A copy of the policy params the engine may keep (the train step donates the state's buffers)."""
        return jax.tree.map(lambda x: jnp.array(np.asarray(x)), self.state.params)

    def restore(self, state) -> None:
        self.state = state
