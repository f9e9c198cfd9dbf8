"""HF safetensors <-> our params, tensor by tensor, straight into (sharded) device arrays.

Load: each of our leaves is assembled with ``jax.make_array_from_callback``; the callback of a device shard
reads (``safetensors.safe_open``, lazily) only the HF tensors that shard covers (one layer / one expert at a
time), transposes them into our layout and slices. No host ever holds the whole model. Both transformers
expert layouts are accepted: per-expert keys ``mlp.experts.{e}.gate_proj.weight`` (what
``save_pretrained`` writes, and every released Qwen3-MoE checkpoint) and the fused in-memory layout of
transformers 5.x (``mlp.experts.gate_up_proj`` [E, 2I, D], ``mlp.experts.down_proj`` [E, D, I]).
Every key is checked before any data is read: a missing, extra or mis-shaped tensor raises ``CheckpointError``
naming the file and the key. bf16 and fp32 checkpoints load into ``cfg.param_dtype``.

Export: ``save_hf`` writes config.json + safetensors in the per-expert layout (which the installed
transformers loads), sharded by size with a ``model.safetensors.index.json`` when larger than one shard.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
from collections.abc import Callable

import jax
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from research.models.config import ModelConfig

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that does not match the config; the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One of our param leaves as a stack (over ``stack`` leading dims: layers, experts) of HF tensors."""

    path: tuple[str, ...]
    shape: tuple[int, ...]
    stack: tuple[int, ...]  # leading dims that index HF tensors: (layers,) or (layers, experts) or ()
    key: Callable[..., str]  # key(*stack_index) -> HF key
    hf_shape: tuple[int, ...]
    to_ours: Callable[[np.ndarray], np.ndarray]  # HF tensor -> our per-unit block
    to_hf: Callable[[np.ndarray], np.ndarray]  # our per-unit block -> HF tensor


def _t(a):
    return a.T


def _swap12(a):
    return a.transpose(0, 2, 1)


def _run_leaves(cfg: ModelConfig, r: int, moe: bool, first: int, n: int, fused: bool) -> list[Leaf]:
    """Leaves of one scanned layer run (layers first..first+n-1), leading dim = layer within the run."""
    D, H, K, Dh, F = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    E, I = cfg.num_experts, cfg.moe_intermediate_size
    pre = f"layers_{r}"

    def lk(suffix):
        return lambda j, *e: f"model.layers.{first + j}." + suffix.format(*e)

    def proj(name, h):
        return Leaf((pre, "attn", name), (n, D, h, Dh), (n,), lk(f"self_attn.{name}.weight"), (h * Dh, D),
                    lambda a: a.reshape(h, Dh, D).transpose(2, 0, 1), lambda a: a.transpose(1, 2, 0).reshape(h * Dh, D))

    out = [proj("q_proj", H), proj("k_proj", K), proj("v_proj", K),
           Leaf((pre, "attn", "o_proj"), (n, H, Dh, D), (n,), lk("self_attn.o_proj.weight"), (D, H * Dh),
                lambda a: a.reshape(D, H, Dh).transpose(1, 2, 0), lambda a: a.transpose(2, 0, 1).reshape(D, -1))]
    for ours, theirs, size in (((pre, "attn", "q_norm"), "self_attn.q_norm", Dh),
                               ((pre, "attn", "k_norm"), "self_attn.k_norm", Dh),
                               ((pre, "input_norm"), "input_layernorm", D),
                               ((pre, "post_attn_norm"), "post_attention_layernorm", D)):
        out.append(Leaf(ours + ("scale",), (n, size), (n,), lk(f"{theirs}.weight"), (size,), np.asarray, np.asarray))
    if not moe:
        return out + [
            Leaf((pre, "mlp", "gate_proj"), (n, D, F), (n,), lk("mlp.gate_proj.weight"), (F, D), _t, _t),
            Leaf((pre, "mlp", "up_proj"), (n, D, F), (n,), lk("mlp.up_proj.weight"), (F, D), _t, _t),
            Leaf((pre, "mlp", "down_proj"), (n, F, D), (n,), lk("mlp.down_proj.weight"), (D, F), _t, _t),
        ]
    out.append(Leaf((pre, "moe", "router"), (n, D, E), (n,), lk("mlp.gate.weight"), (E, D), _t, _t))
    if fused:  # transformers 5.x in-memory layout (load only; save_pretrained writes per-expert keys)
        gu = lk("mlp.experts.gate_up_proj")
        return out + [
            Leaf((pre, "moe", "wi_gate"), (n, E, D, I), (n,), gu, (E, 2 * I, D), lambda a: _swap12(a[:, :I]), None),
            Leaf((pre, "moe", "wi_up"), (n, E, D, I), (n,), gu, (E, 2 * I, D), lambda a: _swap12(a[:, I:]), None),
            Leaf((pre, "moe", "wo"), (n, E, I, D), (n,), lk("mlp.experts.down_proj"), (E, D, I), _swap12, None),
        ]
    per_expert = (("wi_gate", "gate_proj", (D, I)), ("wi_up", "up_proj", (D, I)), ("wo", "down_proj", (I, D)))
    return out + [Leaf((pre, "moe", ours), (n, E) + shp, (n, E), lk("mlp.experts.{}." + theirs + ".weight"),
                       shp[::-1], _t, _t) for ours, theirs, shp in per_expert]


def leaves(cfg: ModelConfig, fused_experts: bool = False) -> list[Leaf]:
    """The full param layout of ``cfg`` with its HF counterpart (the single source of the mapping)."""
    D, V = cfg.hidden_size, cfg.vocab_size
    out = [Leaf(("embedding",), (V, D), (), lambda: "model.embed_tokens.weight", (V, D), np.asarray, np.asarray),
           Leaf(("final_norm", "scale"), (D,), (), lambda: "model.norm.weight", (D,), np.asarray, np.asarray)]
    if not cfg.tie_word_embeddings:
        out.append(Leaf(("lm_head",), (D, V), (), lambda: "lm_head.weight", (V, D), _t, _t))
    for r, (moe, first, n) in enumerate(cfg.layer_runs()):
        out += _run_leaves(cfg, r, moe, first, n, fused_experts)
    return out


def _key_files(path: pathlib.Path) -> dict[str, str]:
    """key -> file name, from the index (sharded) or the single file."""
    if (path / INDEX).exists():
        try:
            return dict(json.loads((path / INDEX).read_text())["weight_map"])
        except (KeyError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path / INDEX}: unreadable index, key 'weight_map' ({e})") from e
    if (path / SINGLE).exists():
        with safe_open(str(path / SINGLE), "np") as f:
            return {k: SINGLE for k in f.keys()}
    raise CheckpointError(f"{path}: neither {INDEX} nor {SINGLE} found")


class _Reader:
    """Lazily opened safetensors handles; reads one named tensor at a time."""

    def __init__(self, root: pathlib.Path, key_files: dict[str, str]):
        self.root, self.key_files, self._open = root, key_files, {}

    def file(self, key: str) -> pathlib.Path:
        return self.root / self.key_files[key]

    def _handle(self, key):
        fn = self.key_files[key]
        if fn not in self._open:
            self._open[fn] = safe_open(str(self.root / fn), "np")
        return self._open[fn]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle(key).get_slice(key).get_shape())

    def get(self, key: str, index: tuple[slice, ...] | None = None) -> np.ndarray:
        """The tensor, or only ``index`` of it (a partial read: a shard never reads what it does not hold)."""
        if index is None:
            return self._handle(key).get_tensor(key)
        return self._handle(key).get_slice(key)[index]


def _validate(root, reader: _Reader, specs: list[Leaf], cfg: ModelConfig):
    expected: dict[str, tuple[int, ...]] = {}
    for leaf in specs:
        for idx in itertools.product(*(range(s) for s in leaf.stack)):
            expected[leaf.key(*idx)] = leaf.hf_shape
    present = set(reader.key_files)
    where = INDEX if (root / INDEX).exists() else SINGLE
    for key in sorted(expected):
        if key not in present:
            arch = cfg.to_hf_config()["architectures"][0]
            raise CheckpointError(f"{root / where}: missing tensor {key!r} (needed by {arch})")
    ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    for key in sorted(present - set(expected) - ignorable):
        raise CheckpointError(f"{reader.file(key)}: unexpected tensor {key!r} (not part of this config)")
    for key, shape in expected.items():
        got = reader.shape(key)
        if got != shape:
            raise CheckpointError(f"{reader.file(key)}: tensor {key!r} has shape {list(got)}, expected {list(shape)}")


def _callback(leaf: Leaf, reader: _Reader, dtype):
    def cb(index: tuple[slice, ...]) -> np.ndarray:
        index = tuple(index) + (slice(None),) * (len(leaf.shape) - len(index))
        nlead = len(leaf.stack)
        ranges = [range(*index[d].indices(leaf.shape[d])) for d in range(nlead)]
        rest = index[nlead:]

        def block(key):
            if leaf.to_ours is np.asarray:  # same layout: read just our slice
                return reader.get(key, rest)
            if leaf.to_ours is _t:  # transposed 2-D: read the transposed slice
                return reader.get(key, rest[::-1]).T
            return np.asarray(leaf.to_ours(reader.get(key)))[rest]

        blocks = [np.asarray(block(leaf.key(*i))).astype(dtype) for i in itertools.product(*ranges)]
        lead_shape = tuple(len(r) for r in ranges)
        return np.stack(blocks).reshape(lead_shape + blocks[0].shape) if nlead else blocks[0]

    return cb


def _set(tree: dict, path: tuple[str, ...], value):
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


def params_from_state(specs: list[Leaf], get: Callable[[str], np.ndarray], dtype: str = "float32") -> dict:
    """Params for the leaves `specs` from an HF state in memory (`get(key)`: a state_dict's numpy arrays, a
    safetensors handle's get_tensor); a tensor of the wrong shape is a CheckpointError naming its key."""
    params: dict = {}
    for leaf in specs:
        blocks = []
        for idx in itertools.product(*(range(s) for s in leaf.stack)):
            arr = np.asarray(get(leaf.key(*idx)))
            if arr.shape != leaf.hf_shape:
                raise CheckpointError(f"{leaf.key(*idx)}: shape {arr.shape}, the config needs {leaf.hf_shape}")
            blocks.append(leaf.to_ours(arr))
        value = np.stack(blocks).reshape(leaf.shape) if leaf.stack else blocks[0]
        _set(params, leaf.path, jax.numpy.asarray(value, np.dtype(dtype)))
    return params


def load_hf(path: str | pathlib.Path, cfg: ModelConfig | None = None, *, shardings=None) -> tuple[dict, ModelConfig]:
    """Load an HF Qwen3/Qwen3-MoE dir into params (placed per ``shardings``, a matching pytree of Shardings,
    else on the default device). Returns (params, cfg); cfg defaults to the dir's config.json."""
    root = pathlib.Path(path)
    cfg = cfg or ModelConfig.from_hf_config(root / "config.json")
    key_files = _key_files(root)
    fused = any(k.endswith("mlp.experts.gate_up_proj") for k in key_files)
    specs = leaves(cfg, fused_experts=fused)
    reader = _Reader(root, key_files)
    _validate(root, reader, specs, cfg)
    dtype = np.dtype(cfg.param_dtype)
    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params: dict = {}
    for leaf in specs:
        sharding = default
        if shardings is not None:
            sharding = shardings
            for p in leaf.path:
                sharding = sharding[p]
        _set(params, leaf.path, jax.make_array_from_callback(leaf.shape, sharding, _callback(leaf, reader, dtype)))
    return params, cfg


def hf_state(params: dict, cfg: ModelConfig):
    """Yield (HF key, numpy array) in checkpoint order, one tensor at a time (per-expert layout)."""
    yield from leaf_state(params, leaves(cfg, fused_experts=False))


def state_reader(path: str | pathlib.Path) -> Callable[[str], np.ndarray]:
    """`get(key)` over a checkpoint dir's safetensors (sharded with an index, or one file)."""
    root = pathlib.Path(path)
    return _Reader(root, _key_files(root)).get


def leaf_state(params: dict, specs: list[Leaf]):
    """Yield (HF key, numpy array) of `specs` from `params`, one tensor at a time."""
    for leaf in specs:
        if leaf.to_hf is None:
            raise CheckpointError(f"{leaf.key(*([0] * len(leaf.stack)))}: this layout is load-only (no export)")
        arr = params
        for p in leaf.path:
            arr = arr[p]
        arr = np.asarray(jax.device_get(arr))
        for idx in itertools.product(*(range(s) for s in leaf.stack)):
            yield leaf.key(*idx), np.ascontiguousarray(leaf.to_hf(arr[idx]))


def save_hf(params: dict, cfg: ModelConfig, path: str | pathlib.Path, *, max_shard_bytes: int = 5 << 30,
            dtype: str = "float32") -> pathlib.Path:
    """Write config.json + safetensors (sharded by size, with an index when > 1 shard) that transformers loads."""
    return write_checkpoint(path, cfg.to_hf_config(), hf_state(params, cfg), max_shard_bytes=max_shard_bytes,
                            dtype=dtype)


def write_checkpoint(path: str | pathlib.Path, hf_cfg: dict, state, *, max_shard_bytes: int = 5 << 30,
                     dtype: str = "float32") -> pathlib.Path:
    """config.json (`hf_cfg`) + the (key, array) pairs of `state` as safetensors, sharded by size."""
    root = pathlib.Path(path)
    root.mkdir(parents=True, exist_ok=True)
    hf_cfg = hf_cfg | {"torch_dtype": dtype}
    (root / "config.json").write_text(json.dumps(hf_cfg, indent=2))
    np_dtype = np.dtype(jax.numpy.bfloat16 if dtype == "bfloat16" else dtype)
    written: list[tuple[pathlib.Path, list[str]]] = []
    shard: dict[str, np.ndarray] = {}
    total = 0

    def flush():
        tmp = root / f".shard-{len(written):05d}.safetensors"
        save_file(shard, str(tmp), metadata={"format": "pt"})
        written.append((tmp, list(shard)))
        shard.clear()

    for key, arr in state:  # at most one shard is held in host memory
        arr = arr.astype(np_dtype)
        if shard and sum(a.nbytes for a in shard.values()) + arr.nbytes > max_shard_bytes:
            flush()
        shard[key] = arr
        total += arr.nbytes
    flush()
    if len(written) == 1:
        written[0][0].rename(root / SINGLE)
        return root
    weight_map = {}
    for i, (tmp, keys) in enumerate(written):
        name = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
        tmp.rename(root / name)
        weight_map |= {k: name for k in keys}
    (root / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return root
