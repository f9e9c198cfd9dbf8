"""The typed run config: ONE validated, frozen view of a `configs/*.py` ConfigDict for the RL loop.

Why: configs are ml_collections (command-line overridable), but the components want typed, hashable
configs (`LossConfig`, `PipelineConfig`, `BatchConfig`, `Objective`, `EngineConfig`, the runner's). Translating by hand
at each use silently dropped fields (`value_clip` could never be set) and hid typos behind
`.get(key, default)`. Here every section maps onto a dataclass: an unknown key is an error naming it,
a missing key takes the dataclass default, and the cross-section invariants are checked once, at start:

- the trainer's temperature IS the sampling temperature (one field: `rollout.temperature`), and the
  behaviour log-probs must be those of softmax(logits / T): top_p < 1 (a truncated sampler) is rejected
  for RL, as is T <= 0;
- a packed row holds the longest path a rollout can produce (`train.row_len >= engine.max_len`);
- the mesh fits the devices and the rows split over the batch axes, microbatches and minibatches;
- names (algo, estimator, aggregation, KL estimator, IS correction, sync kind) are known.
Harness names and task sources are checked by the rollout side, which owns those registries.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

import ml_collections

from research import advantages, losses
from research.capture import ROLLOUT_STATUSES
from research.data.pipeline import PipelineConfig
from research.models import ModelConfig
from research.models.config import tiny_dense
from research.models.image_processor import ImageProcessorConfig
from research.models.sharding import mesh_shape
from research.models.vision import VisionConfig
from research.rl.batches import BatchConfig
from research.rl.objective import Objective
from research.serving.scheduler import EngineConfig
from research.train.state import model_config

ALGOS = ("grpo", "ppo", "sft")
IMAGE_PAD_ID = 151655  # Qwen3's (and Qwen3-VL's) `<|image_pad|>`: the tokenizer the shim renders with


class RunConfigError(ValueError):
    """The run config is inconsistent; the message names the field(s) and says what would be valid."""


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """`config.optim` / `rl_optim` / `critic_optim` (see research/train/optim.py for the meaning)."""

    learning_rate: float = 1e-6
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1000
    init_lr_ratio: float = 0.0
    end_lr_ratio: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    mu_dtype: str = ""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 100  # RL steps (after any SFT phase)
    batch_rows: int = 8
    row_len: int = 512
    num_microbatches: int = 1  # gradient accumulation inside one optimizer step
    logprob_chunk: int = 1024
    loss_slots: int = 128  # LM-head slots per row (doubled until every row fits)
    batch_axes: tuple[str, ...] = ("data", "fsdp")
    # The RL update on one batch: `epochs` passes, each split into `minibatches` optimizer steps over
    # disjoint row slices (shuffled per epoch). With 1 x 1 the PPO ratio is always 1 and clipping never acts.
    minibatches: int = 1
    epochs: int = 1
    skip_empty: bool = True  # no optimizer update when no loss token carries an advantage (Adam would still move)
    diagnostics: bool = True  # a post-update forward: dlogp of A>0 / A<0 tokens, KL(old || new) on the batch


@dataclasses.dataclass(frozen=True)
class RLConfig:
    estimator: str = "grpo"
    aggregation: str = "token_mean"
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    is_correction: str = "none"
    is_cap: float = 2.0
    mis_low: float = 0.5
    mis_high: float = 2.0
    value_coef: float = 0.5
    value_clip: float = 0.0  # 0: unclipped value loss
    gamma: float = 1.0
    lam: float = 1.0
    ref_checkpoint: str = ""  # KL reference: "" = the policy as RL starts, else an HF dir
    filter_groups: bool = False  # drop groups whose rollouts all got the same reward (DAPO dynamic sampling)
    # rollouts ending with these statuses (the policy's doing) are trained on with `failure_reward`
    scored_failures: tuple[str, ...] = ("timeout", "disk_limit")
    # ... and failed rollouts attributed to these causes (harness_env/attribution.py: "policy", "infra", "task");
    # the default trains on every failure the policy caused and on none the infrastructure or the task did
    scored_causes: tuple[str, ...] = ("policy",)
    failure_reward: float = 0.0
    # an `ok` rollout that tampered with its inputs (meta["tampered"], harness_env/tamper.py) gets this reward
    # instead of its grade; None: `failure_reward`
    tamper_reward: float | None = None
    recompute_old_logp: bool = False  # pi_old from a trainer forward (bf16 / SGLang mismatch) instead of behaviour


@dataclasses.dataclass(frozen=True)
class TasksConfig:
    source: str = "make_file"  # make_file | library | web | dir | a ClawGym task folder (harness_env/tasks/select.py)
    seed: int = 0
    train_dir: str = ""  # source "dir": the train / held-out folders as given
    eval_dir: str = ""
    heldout_fraction: float = 0.1  # a ClawGym folder: the seeded hash split's held-out share
    limit: int = 0  # > 0: a seeded sample of that many tasks per split
    exclude_flags: tuple[str, ...] = ()  # leave out tasks whose checker raises these (harness_env/tasks/audit.py)
    # which input changes are tampering where a task declares no `editable_inputs` (harness_env/tamper.py)
    undeclared_inputs: str = "destructive"
    # grade every task's untouched workspace when the source loads and leave out those whose checker errs there
    # or pays for doing nothing (harness_env/tasks/validate.py `keep_valid`; cached per task content)
    validate: bool = False


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    mode: str = "sync"  # sync | async
    max_off_policy_steps: int = 1
    lookahead: int = 1
    harnesses: str = "reference"  # "name:weight,..."
    groups_per_step: int = 4
    group_size: int = 4
    # DAPO dynamic sampling: with rl.filter_groups, run up to this many extra rounds of `groups_per_step`
    # groups while fewer than `groups_per_step` groups carry a reward signal (0: no extra rounds).
    max_extra_rounds: int = 0
    backend: str = "bwrap"
    concurrency: int = 4
    timeout_s: float = 120.0
    reward_timeout_s: float = 30.0
    infra_retries: int = 2
    max_turns: int = 3
    sandbox_cpus: float = 1.0
    sandbox_memory_mb: int = 1024
    workspace_mb: int = 1024  # disk caps of the agent's workspace and HOME (status disk_limit when exceeded)
    home_mb: int = 512
    progress: bool = False
    fsync: bool = True
    enable_thinking: bool = False
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    # Forking by replay (harness_env/rl/branching.py): after a step's rollouts, children of some of them re-run the
    # harness with the shim answering their first k calls from the parent's records, then sample fresh.
    branch: str = ""  # which rollouts get children: "" (off) | failed | tool_error | all
    branch_at: str = "first_tool_error"  # the fork call: first_tool_error | after_tool_error (else uniform) | uniform
    branch_children: int = 1  # children per fork
    branch_max_per_step: int = 0  # children per step at most (0: no cap)


BRANCH_WHICH = ("", "failed", "tool_error", "all")  # harness_env/rl/branching.py (research never imports it)
BRANCH_AT = ("first_tool_error", "after_tool_error", "uniform")


@dataclasses.dataclass(frozen=True)
class SyncConfig:
    kind: str = "jax"  # jax | sglang
    sglang_url: str = ""
    export_dtype: str = "bfloat16"


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    steps: int = 0
    groups_per_step: int = 16
    num_demos: int = -1
    expert: str = "make_file"
    min_reward: float = 1.0  # demonstrations below this reward are dropped (0: keep every demonstration)
    # LM-head slots per SFT row (0: train.loss_slots); SFT rows hold whole demonstrations, whose loss
    # tokens a tighter start fits without doubling past them (the head is most of a tiny model's step)
    loss_slots: int = 0
    # one prefix tree per SFT step (per harness) instead of one per demonstration: a real CLI's ~9k-token prompt,
    # identical across demonstrations up to the task's line, is then trained once per step, not once per demo
    merge_demos: bool = False


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = 0
    sft_every: int = 0
    num_tasks: int = -1
    at_start: bool = True
    after_sft: bool = True
    # rollouts per held-out task and harness, sampled at `temperature` (pass@1 = their mean pass rate); the
    # default, one greedy rollout, is a step function of the policy where the right answer is not its mode
    samples: int = 1
    temperature: float = 0.0


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 10
    keep: int = 3


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    tensorboard: bool = True
    plot_every: int = 10
    # per-token log-prob change of each RL update for the run viewer (research/rl/dlogp.py: RUN/dlogp/), written
    # when the update's batch has at most this many loss tokens (4 bytes each; 0: never); needs train.diagnostics
    dlogp_tokens: int = 1 << 20


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    enabled: bool = False
    coordinator_address: str = ""  # "" / 0 / -1: from the environment or JAX's auto-detection
    num_processes: int = 0
    process_id: int = -1
    initialization_timeout: int = 300


@dataclasses.dataclass(frozen=True)
class DeviceConfig:
    """The target accelerator (research/train/aot.py checks the compiled step's per-device memory against it)."""

    kind: str = "cpu"
    memory_gb: float = 0.0  # 0: unchecked


_SECTIONS: dict[str, type] = {
    "optim": OptimConfig, "critic_optim": OptimConfig, "rl_optim": OptimConfig, "train": TrainConfig,
    "rl": RLConfig, "tasks": TasksConfig, "rollout": RolloutConfig, "engine": EngineConfig, "sync": SyncConfig,
    "sft": SFTConfig, "eval": EvalConfig, "checkpoint": CheckpointConfig, "metrics": MetricsConfig,
    "distributed": DistributedConfig, "device": DeviceConfig, "vision": VisionConfig,
    "image_processor": ImageProcessorConfig,
}
_TOP = ("name", "seed", "algo", "tokenizer_dir", "init_checkpoint", "model", "mesh", *_SECTIONS)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every section typed; `RunConfig.of(config_dict)` builds and validates it (see the module doc)."""

    model: ModelConfig
    name: str = "run"
    seed: int = 0
    algo: str = "grpo"
    tokenizer_dir: str = ""
    init_checkpoint: str = ""
    mesh: dict = dataclasses.field(default_factory=lambda: dict(data=-1, fsdp=1, expert=1, tensor=1))
    optim: OptimConfig = OptimConfig()
    rl_optim: OptimConfig | None = None  # the RL phase's optimizer (fresh moments at RL start); None: `optim`
    critic_optim: OptimConfig = OptimConfig(learning_rate=1e-2)
    train: TrainConfig = TrainConfig()
    rl: RLConfig = RLConfig()
    tasks: TasksConfig = TasksConfig()
    rollout: RolloutConfig = RolloutConfig()
    engine: EngineConfig = EngineConfig()
    sync: SyncConfig = SyncConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()
    distributed: DistributedConfig = DistributedConfig()
    device: DeviceConfig = DeviceConfig()
    # a Qwen3-VL policy: its vision tower (`model` is then its text model: mrope_section, deepstack_layers) and
    # the image processor the shim and the learner both preprocess with (None: the tower's patch/merge sizes
    # with Qwen3-VL's default pixel bounds)
    vision: VisionConfig | None = None
    image_processor: ImageProcessorConfig | None = None

    @classmethod
    def of(cls, config: RunConfig | ml_collections.ConfigDict | dict, *, num_devices: int | None = None,
           check: bool = True) -> RunConfig:
        """Typed sections always; `check=False` skips the cross-section invariants (model-only configs, e.g.
        configs/tiny.py, whose loop sections are all defaults, for AOT compiles and tests).

        A config checked against `num_devices` is stamped with it, so the next hand that asks for the same
        count (the loop validates at start, then its Learner asks again) gets it back unchecked: one
        validation per run, with the real device count, not one per layer it passes through."""
        if isinstance(config, RunConfig):  # typed already; the device count may be known only now
            if check and num_devices is not None and config.validated_devices != num_devices:
                validate(config, num_devices=num_devices)
                config._stamp(num_devices)
            return config
        d = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
        unknown = sorted(set(d) - set(_TOP))
        if unknown:
            raise RunConfigError(f"config: unknown top-level field(s) {unknown}; known: {sorted(_TOP)}")
        if "model" not in d:
            raise RunConfigError("config.model is required (every ModelConfig field)")
        kw: dict[str, Any] = {k: d[k] for k in ("name", "seed", "algo", "tokenizer_dir", "init_checkpoint") if k in d}
        kw["model"] = _model(d["model"])
        if "mesh" in d:
            kw["mesh"] = _mesh(d["mesh"])
        for key, sec in _SECTIONS.items():
            if d.get(key) is not None:
                kw[key] = _section(sec, d[key], f"config.{key}")
        run = cls(**kw)
        if check:
            validate(run, num_devices=num_devices)
            if num_devices is not None:
                run._stamp(num_devices)
        return run

    @property
    def validated_devices(self) -> int | None:
        """The device count `of` validated this very object against (None: never against devices)."""
        return getattr(self, "_validated_devices", None)

    def _stamp(self, num_devices: int) -> None:
        # not a dataclass field: to_dict() (config.json) must not carry it, and dataclasses.replace() must
        # drop it (a changed config is a new one that has not been validated)
        object.__setattr__(self, "_validated_devices", num_devices)

    # --------------------------------------------------------------- component configs
    @property
    def temperature(self) -> float:
        """The one temperature: rollouts sample at it and the trainer's log-probs are taken at it."""
        return self.rollout.temperature

    def loss(self) -> losses.LossConfig:
        r = self.rl
        return losses.LossConfig(
            algo="ppo" if self.algo == "ppo" else "grpo", aggregation=r.aggregation, clip_low=r.clip_low,
            clip_high=r.clip_high, kl_coef=r.kl_coef, kl_estimator=r.kl_estimator, entropy_coef=r.entropy_coef,
            is_correction=r.is_correction, is_cap=r.is_cap, mis_low=r.mis_low, mis_high=r.mis_high,
            value_coef=r.value_coef, value_clip=r.value_clip if r.value_clip > 0 else None)

    @property
    def sft_loss_slots(self) -> int:
        """LM-head slots an SFT row starts from: `sft.loss_slots`, else `train.loss_slots`."""
        return self.sft.loss_slots or self.train.loss_slots

    def batching(self) -> BatchConfig:
        t, r = self.train, self.rl
        return BatchConfig(row_len=t.row_len, num_rows=t.batch_rows, estimator=r.estimator, aggregation=r.aggregation,
                           filter_groups=r.filter_groups and self.algo != "ppo")

    def pipeline(self) -> PipelineConfig:
        # a clipped value loss needs one occurrence per slot: identical generations are then not merged
        merge = not (self.algo == "ppo" and self.rl.value_clip > 0)
        return PipelineConfig(vocab_size=self.model.vocab_size, merge_generations=merge, seed=self.seed,
                              scored_failures=self.rl.scored_failures, failure_reward=self.rl.failure_reward,
                              scored_causes=self.rl.scored_causes,
                              tamper_reward=(self.rl.failure_reward if self.rl.tamper_reward is None
                                             else self.rl.tamper_reward),
                              image_pad_id=self.image_pad_id, merge_size=self.processor().merge_size if self.vision
                              else 2)

    def objective(self):

        return Objective(loss=self.loss(), critic="head" if self.algo == "ppo" else "none",
                         logprob_chunk=self.train.logprob_chunk, temperature=self.temperature, vision=self.vision)

    @property
    def image_pad_id(self) -> int | None:
        """A vision policy's placeholder token: `<|image_pad|>` of Qwen3's tokenizer (research/shim/images.py)."""
        return None if self.vision is None else IMAGE_PAD_ID

    def processor(self) -> ImageProcessorConfig | None:
        """The image processor of a vision policy (None for a text policy)."""
        if self.vision is None:
            return None
        v = self.vision
        return self.image_processor or ImageProcessorConfig(
            patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size)

    @property
    def uses_reference(self) -> bool:
        return self.algo != "sft" and self.rl.kl_coef > 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def override(config: ml_collections.ConfigDict, values: dict[str, Any]) -> ml_collections.ConfigDict:
    """Sets dotted keys in place (`{"sft.steps": 800}`), as `--config.sft.steps=800` would; returns `config`."""
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config


# ------------------------------------------------------------------------------------------- building


def _model(node) -> ModelConfig:

    try:
        return model_config({"model": node})
    except ValueError as e:
        raise RunConfigError(str(e)) from e


def _mesh(node) -> dict:
    d = node.to_dict() if isinstance(node, ml_collections.ConfigDict) else dict(node)
    axes = ("data", "fsdp", "expert", "tensor")
    if set(d) != set(axes):
        raise RunConfigError(f"config.mesh needs exactly the axes {axes}, got {sorted(d)}")
    return {a: int(d[a]) for a in axes}


def _coerce(value, tp, where: str):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # Optional[X]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _coerce(value, args[0], where)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise RunConfigError(f"{where}={value!r}: expected a sequence")
        return tuple(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if tp in (int, float, str, bool) and (not isinstance(value, tp) or (tp is not bool and isinstance(value, bool))):
        raise RunConfigError(f"{where}={value!r}: expected {tp.__name__}")
    return value


def _section(cls: type, node, where: str):
    d = node.to_dict() if isinstance(node, ml_collections.ConfigDict) else dict(node)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise RunConfigError(f"{where}: unknown field(s) {unknown}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(v, hints[k], f"{where}.{k}") for k, v in d.items()})


# ------------------------------------------------------------------------------------------- invariants


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise RunConfigError(msg)


def _one_of(value: str, known, where: str) -> None:
    _check(value in known, f"{where}={value!r}; known: {sorted(known)}")


def mesh_sizes(mesh: dict, num_devices: int) -> dict[str, int]:
    """The mesh with its -1 axis resolved (research/models/sharding.mesh_shape); errors name config.mesh."""

    try:
        sizes = mesh_shape(mesh, num_devices)
    except ValueError as e:
        raise RunConfigError(f"config.mesh {mesh}: {e}") from None
    _check(math.prod(sizes.values()) <= num_devices,
           f"config.mesh {mesh} needs {math.prod(sizes.values())} devices, have {num_devices}")
    return sizes


def validate(run: RunConfig, *, num_devices: int | None = None) -> None:
    """Raises RunConfigError on the first broken invariant (see the module docstring)."""
    _one_of(run.algo, ALGOS, "config.algo")
    r, t, ro = run.rl, run.train, run.rollout
    _one_of(r.estimator, advantages.ESTIMATORS, "config.rl.estimator")
    _one_of(r.aggregation, losses.AGGREGATIONS, "config.rl.aggregation")
    _one_of(r.kl_estimator, ("k1", "k3"), "config.rl.kl_estimator")
    _one_of(r.is_correction, ("none", "tis", "mis"), "config.rl.is_correction")
    _one_of(run.sync.kind, ("jax", "sglang"), "config.sync.kind")
    _one_of(ro.mode, ("sync", "async"), "config.rollout.mode")
    _one_of(ro.branch, BRANCH_WHICH, "config.rollout.branch")
    _one_of(ro.branch_at, BRANCH_AT, "config.rollout.branch_at")
    _check(ro.branch_children >= 1 and ro.branch_max_per_step >= 0, f"config.rollout.branch_children="
           f"{ro.branch_children} must be >= 1 and branch_max_per_step={ro.branch_max_per_step} >= 0 (0: no cap)")

    bad = [s for s in r.scored_failures if s not in ROLLOUT_STATUSES or s == "ok"]
    _check(not bad, f"config.rl.scored_failures: {bad} are not failure statuses; known: {ROLLOUT_STATUSES[1:]}")
    bad = [c for c in r.scored_causes if c not in ("policy", "infra", "task")]
    _check(not bad, f"config.rl.scored_causes: {bad} not in ('policy', 'infra', 'task')")
    _one_of(run.tasks.undeclared_inputs, ("destructive", "frozen", "editable"), "config.tasks.undeclared_inputs")
    _check(0 <= r.clip_low < 1 and r.clip_high >= 0, f"config.rl.clip_low/clip_high={r.clip_low}/{r.clip_high}")
    _check(r.kl_coef >= 0 and r.entropy_coef >= 0 and r.value_clip >= 0, "config.rl: kl_coef, entropy_coef and "
           "value_clip must be >= 0")
    if run.algo != "sft":
        _check(ro.temperature > 0, f"config.rollout.temperature={ro.temperature}: RL needs T > 0 (the trainer "
               "computes log-probs of softmax(logits / T); greedy rollouts have no behaviour distribution)")
        _check(ro.top_p == 1.0, f"config.rollout.top_p={ro.top_p}: engines report log-probs of the untruncated "
               "softmax(logits / T), so with top-p sampling the PPO ratio and the TIS weights would be wrong; "
               "use top_p=1.0 for RL")
        _check(ro.group_size >= 2 or run.algo == "ppo", f"config.rollout.group_size={ro.group_size}: group "
               "advantages need >= 2 rollouts per group")
    _check(run.eval.samples >= 1 and run.eval.temperature >= 0, f"config.eval.samples={run.eval.samples} must be "
           f">= 1 and config.eval.temperature={run.eval.temperature} >= 0")
    _check(run.eval.samples == 1 or run.eval.temperature > 0, f"config.eval.samples={run.eval.samples} greedy "
           "(temperature 0) rollouts of a task are copies of one: sample at a temperature > 0")
    _check(ro.groups_per_step >= 1 and ro.max_extra_rounds >= 0, "config.rollout.groups_per_step must be >= 1 and "
           "max_extra_rounds >= 0")
    _check(t.epochs >= 1 and t.minibatches >= 1 and t.num_microbatches >= 1,
           f"config.train: epochs={t.epochs}, minibatches={t.minibatches}, num_microbatches={t.num_microbatches} "
           "must be >= 1")
    _check(t.row_len >= run.engine.max_len, f"config.train.row_len={t.row_len} < config.engine.max_len="
           f"{run.engine.max_len}: a rollout path (prompt + completion, up to the serving context) must fit one "
           "packed row; raise row_len or lower engine.max_len")
    if run.sync.kind == "sglang":
        _check(bool(run.sync.sglang_url), "config.sync.kind='sglang' needs config.sync.sglang_url")
    if run.rl_optim is not None:
        _check((run.rl_optim.clip_norm > 0) == (run.optim.clip_norm > 0), "config.rl_optim and config.optim must "
               "build the same optimizer state structure: both with clip_norm > 0 or both without")
    if run.sft.steps > 0:
        _check(run.sft.groups_per_step >= 1, "config.sft.groups_per_step must be >= 1")
        _check(run.sft.loss_slots >= 0, "config.sft.loss_slots must be >= 0 (0: config.train.loss_slots)")
    if run.vision is not None or run.image_processor is not None:
        _check_vision(run)
    if num_devices is not None:
        _check_rows(run, mesh_sizes(run.mesh, num_devices))


def _check_vision(run: RunConfig) -> None:
    """The tower, the processor and the text model of a Qwen3-VL policy must agree (else the placeholder
    counts, the patch rows or the merged features' width would not match)."""
    v, m, p = run.vision, run.model, run.image_processor
    _check(v is not None, "config.image_processor is set but config.vision is not: a text policy has no images")
    _check(v.out_hidden_size == m.hidden_size, f"config.vision.out_hidden_size={v.out_hidden_size} != "
           f"config.model.hidden_size={m.hidden_size} (the merger feeds the text model)")
    _check(bool(m.mrope_section) and m.deepstack_layers == len(v.deepstack_indexes),
           f"config.model: a Qwen3-VL text model needs mrope_section (has {m.mrope_section}) and deepstack_layers "
           f"== len(config.vision.deepstack_indexes) = {len(v.deepstack_indexes)} (has {m.deepstack_layers})")
    if p is not None:
        ours = (v.patch_size, v.temporal_patch_size, v.spatial_merge_size)
        theirs = (p.patch_size, p.temporal_patch_size, p.merge_size)
        _check(ours == theirs, f"config.image_processor (patch, temporal, merge) = {theirs} != config.vision's "
               f"{ours}")


def _check_rows(run: RunConfig, sizes: dict[str, int]) -> None:
    t = run.train
    unknown = [a for a in t.batch_axes if a not in sizes]
    _check(not unknown, f"config.train.batch_axes={t.batch_axes}: unknown mesh axes {unknown}")
    shards = math.prod(sizes[a] for a in t.batch_axes)
    for name, div in (("the batch axes", shards), ("num_microbatches x batch axes", shards * t.num_microbatches),
                      ("minibatches x num_microbatches x batch axes", shards * t.num_microbatches * t.minibatches)):
        _check(t.batch_rows % div == 0, f"config.train.batch_rows={t.batch_rows} is not divisible by {name} "
               f"({div}; mesh {sizes}, batch_axes {t.batch_axes}, num_microbatches {t.num_microbatches}, "
               f"minibatches {t.minibatches})")


def defaults() -> ml_collections.ConfigDict:
    """A ConfigDict holding every field of every section at its default (model, mesh and `rl_optim` left to
    the config file), so that config files only state what they change and every field can be overridden
    on the command line (`--config.train.minibatches=4`: ml_collections only overrides existing fields)."""

    base = RunConfig(model=tiny_dense())  # (the model is not part of the result)
    c = ml_collections.ConfigDict()
    for key in ("name", "seed", "algo", "tokenizer_dir", "init_checkpoint"):
        c[key] = getattr(base, key)
    c.mesh = dict(base.mesh)
    for key in _SECTIONS:
        sec = getattr(base, key)
        if sec is not None:
            c[key] = ml_collections.ConfigDict(dataclasses.asdict(sec))
    return c
