"""The learner: one TrainState, jitted steps for the configured algorithm, PPO pre-pass, weight export.

Algorithms (`config.algo`): "grpo" (tree GRPO-family, no critic), "ppo" (tree PPO with a value head:
GAE on the trees from a no-grad pre-pass), "sft" (NLL of captured demonstrations). One state serves
all three, so an SFT warm start continues as RL in the same run; an SFT step on a PPO state simply
leaves the critic untouched.
"""

from __future__ import annotations

import logging
import pathlib
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

from research import losses
from research.data.pipeline import PipelineConfig
from research.models import Qwen3, dummy_inputs
from research.rl.batches import StepBatch
from research.rl.objective import make_eval_fn, make_rl_loss_fn, make_sft_loss_fn, scatter_slots
from research.train.optim import make_optimizer
from research.train.state import StateInit, abstract_train_state, init_train_state, make_mesh, model_config
from research.train.step import make_train_step
from research.trees.objective import TreeObjective, init_critic_params, ppo_stats_from_values

ALGOS = ("grpo", "ppo", "sft")
log = logging.getLogger(__name__)


def loss_config(config: ml_collections.ConfigDict) -> losses.LossConfig:
    a = config.rl
    return losses.LossConfig(
        algo="ppo" if config.algo == "ppo" else "grpo", aggregation=a.aggregation, clip_low=a.clip_low,
        clip_high=a.clip_high, kl_coef=a.kl_coef, kl_estimator=a.get("kl_estimator", "k3"),
        entropy_coef=a.entropy_coef, is_correction=a.is_correction, is_cap=a.is_cap, value_coef=a.value_coef)


def pipeline_config(config: ml_collections.ConfigDict) -> PipelineConfig:
    t = config.train
    return PipelineConfig(row_len=t.row_len, num_rows=t.batch_rows, groups_per_batch=config.rollout.groups_per_step,
                          vocab_size=config.model.vocab_size, estimator=config.rl.estimator,
                          aggregation=config.rl.aggregation, merge_generations=True, seed=config.seed)


def tree_objective(config: ml_collections.ConfigDict) -> TreeObjective:
    return TreeObjective(loss=loss_config(config), critic="head" if config.algo == "ppo" else "none",
                         logprob_chunk=config.train.logprob_chunk, temperature=1.0)


def state_init(config: ml_collections.ConfigDict, model_cfg, obj: TreeObjective) -> StateInit:
    """Policy (+ value head for PPO) params and their optimizers, as functions (nothing is allocated)."""
    optimizer, _ = make_optimizer(config.optim)
    # (expert parallelism does not change the params; the init forward runs without it, as in train.state)
    init_cfg = model_cfg.replace(expert_parallel=False)
    init_fn = lambda r: Qwen3(init_cfg).init(r, *dummy_inputs())["params"]
    if obj.critic == "none":
        return StateInit(init_fn=init_fn, optimizer=optimizer)
    critic_optimizer, _ = make_optimizer(config.critic_optim)
    critic_init = lambda r: init_critic_params(model_cfg, obj, r)
    return StateInit(init_fn=init_fn, optimizer=optimizer, critic_init_fn=critic_init,
                     critic_optimizer=critic_optimizer)


def batch_axes(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    return tuple(config.train.get("batch_axes", ("data", "fsdp")))


def rl_optimizer(config: ml_collections.ConfigDict, init: StateInit):
    """The RL phase's optimizer: `config.rl_optim` when set (an SFT warm start at a high lr followed by RL
    at a much lower one, with fresh Adam moments: see Learner.start_rl), else the policy's `config.optim`."""
    if not config.get("rl_optim"):
        return init.optimizer
    return make_optimizer(config.rl_optim)[0]


def make_steps(config: ml_collections.ConfigDict, model_cfg, obj: TreeObjective, init: StateInit, mesh,
               state_shardings) -> dict:
    """{"rl": TrainStep, "sft": TrainStep} sharing the state layout; rows sharded over `batch_axes`."""
    rows = NamedSharding(mesh, PartitionSpec(batch_axes(config)))
    kw = dict(state_shardings=state_shardings, batch_shardings=rows, critic_optimizer=init.critic_optimizer,
              num_microbatches=config.train.num_microbatches)
    return {"rl": make_train_step(loss_fn=make_rl_loss_fn(model_cfg, obj), optimizer=rl_optimizer(config, init), **kw),
            "sft": make_train_step(loss_fn=make_sft_loss_fn(model_cfg, obj), optimizer=init.optimizer, **kw)}


class Learner:
    def __init__(self, config: ml_collections.ConfigDict):
        if config.algo not in ALGOS:
            raise ValueError(f"config.algo={config.algo!r}; known: {ALGOS}")
        self.config = config
        self.model_cfg = model_config(config)
        self.mesh = make_mesh(config.mesh)
        self.obj = tree_objective(config)
        self.init = state_init(config, self.model_cfg, self.obj)
        rules = self.model_cfg.logical_rules
        self.state, self.shardings = init_train_state(self.init, self.mesh, rules, jax.random.PRNGKey(config.seed))
        self.abstract = abstract_train_state(self.init, self.mesh, rules)
        if config.get("init_checkpoint"):  # start from an HF checkpoint (a resumed run restores over it)
            from research.models.hf_io import load_hf

            params, _ = load_hf(config.init_checkpoint, self.model_cfg, shardings=self.shardings.params)
            self.state = self.state.replace(params=params)
        self._steps = make_steps(config, self.model_cfg, self.obj, self.init, self.mesh, self.shardings)
        self._eval = make_eval_fn(self.model_cfg, self.obj)
        self.ref_params = None  # frozen reference policy (only when the KL penalty is on): see init_reference

    @property
    def step(self) -> int:
        return int(self.state.step)

    def start_rl(self) -> bool:
        """Entering the RL phase: with `config.rl_optim`, fresh optimizer moments for it (returns True).

        Why: Adam's second moments from SFT's last steps (tiny gradients on memorised demonstrations) would
        turn the first, much larger policy gradients into steps of several times the learning rate, and
        the SFT learning rate itself is far too high for RL (measured: a 0.78 pass-rate policy collapses to
        0 within 10 GRPO steps at the SFT lr of 4e-3)."""
        if not self.config.get("rl_optim"):
            return False
        opt = rl_optimizer(self.config, self.init)
        if jax.tree.structure(jax.eval_shape(opt.init, self.state.params)) != jax.tree.structure(self.state.opt_state):
            raise ValueError("config.rl_optim must build the same optimizer state structure as config.optim "
                             "(same chain: e.g. both with clip_norm > 0)")
        fresh = jax.jit(opt.init, out_shardings=self.shardings.opt_state)(self.state.params)
        self.state = self.state.replace(opt_state=fresh)
        return True

    # ------------------------------------------------------------------ reference policy (KL penalty)
    @property
    def uses_reference(self) -> bool:
        return self.config.algo != "sft" and self.config.rl.kl_coef > 0

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
        if self.config.rl.get("ref_checkpoint"):
            from research.models.hf_io import load_hf

            self.ref_params, _ = load_hf(self.config.rl.ref_checkpoint, self.model_cfg,
                                         shardings=self.shardings.params)
            log.info("reference policy: HF checkpoint %s", self.config.rl.ref_checkpoint)
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

    def reference_logp(self, dev: dict[str, np.ndarray]) -> np.ndarray:
        """[B, T] float32 log-probs of the batch's tokens under the reference, at the loss slots (0 elsewhere)."""
        if self.ref_params is None:
            self.init_reference()  # a Learner driven without the loop: the reference is its first RL state
        with jax.set_mesh(self.mesh):
            out = self._eval(self.ref_params, self.state.critic_params, dev)
        return scatter_slots(np.asarray(out["logp"]), dev["loss_idx"], dev["loss_valid"], dev["tokens"].shape[1])

    # ------------------------------------------------------------------ steps
    def prepare(self, batch: StepBatch) -> dict[str, np.ndarray]:
        """Reference log-probs (KL penalty on); PPO: values from a no-grad pass -> GAE on the trees -> fresh
        node statistics + old_values."""
        dev = dict(batch.device)
        if self.uses_reference:
            dev["ref_logp"] = self.reference_logp(batch.device)
        if self.config.algo != "ppo":
            return dev
        with jax.set_mesh(self.mesh):
            out = self._eval(self.state.params, self.state.critic_params, batch.device)
        T = dev["tokens"].shape[1]
        values_BxT = scatter_slots(np.asarray(out["values"]), dev["loss_idx"], dev["loss_valid"], T)
        stats = ppo_stats_from_values(batch.trees, batch.packed, values_BxT, gamma=self.config.rl.gamma,
                                      lam=self.config.rl.lam, aggregation=self.config.rl.aggregation)
        for k in ("weight", "count", "adv_pos", "adv_neg", "ret_sum", "ret_sq_sum", "old_values"):
            dev[k] = stats[k]
        return dev

    def train(self, batch: StepBatch, *, sft: bool = False) -> dict[str, float]:
        dev = batch.device if sft else self.prepare(batch)
        self.state, metrics = self._steps["sft" if sft else "rl"](self.state, dev)
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    def params_copy(self):
        """A copy of the policy params the engine may keep (the train step donates the state's buffers)."""
        return jax.tree.map(lambda x: jnp.array(np.asarray(x)), self.state.params)

    def restore(self, state) -> None:
        self.state = state
