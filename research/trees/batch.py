"""The packed tree batch as one table: every field's dtype, shape, padding and role, owned where rows are packed.

The batch passes through five hands: packing (research/trees/packing.py) writes its rows on the host, the step
builder (research/rl/batches.py) adds the loss slots and drops host bookkeeping, the trainer
(research/rl/trainer.py) adds per-step fields (reference and old log-probs, PPO statistics), the objective
(research/rl/objective.py) reads model inputs and per-slot statistics, and AOT (research/train/aot.py) and the
benchmarks rebuild its shapes abstractly. Each used to spell its own key list; a renamed field then broke one
consumer silently. Now each derives its keys from `FIELDS` (`names(...)`), and tests/test_batch_fields.py fails
when a list of field names is spelled anywhere else.

Shapes: B rows, T = row length, K = loss slots per row, L x k = MoE layers x experts per token, N x P = the step's
image patches x patch size, a digit = that size. Every row field is sharded over its rows (dim 0, the mesh's batch
axes) and replicated along the rest: logical axes ("batch", ...), see `logical_axes`; the step's images are
replicated whole (every row may show any of them).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

# roles: which hand writes the field and who reads it
MODEL = "model"  # model inputs (the tree-attention contract), read by the forward
TREE = "tree"  # row layout the trainer needs beside the model inputs
STAT = "stat"  # per-slot loss statistics of a node (research/trees/targets.py), read at the loss slots
SLOTS = "slots"  # which slots carry loss (added by research/rl/batches.py)
HOST = "host"  # bookkeeping that maps slots back to trees; never sent to devices
STEP = "step"  # added per step by the trainer (when the objective needs it)
VISUAL = "visual"  # a vision policy's rows: 3-D positions and image rows (research/trees/packing.pack_images)
IMAGES = "images"  # the step's distinct images as the vision tower reads them: NOT rows, replicated to every device


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    dtype: str  # numpy dtype name
    shape: str  # letters of B, T, K, L, k (see module doc)
    role: str
    pad: float = 0  # value of padding slots ("arange" for subtree_end: each padding slot sees only itself)
    doc: str = ""


FIELDS: tuple[Field, ...] = (
    Field("tokens", "int32", "BT", MODEL, doc="token ids in DFS pre-order of each tree piece"),
    Field("positions", "int32", "BT", MODEL, doc="depth of the token in its tree (rotary position)"),
    Field("segment_ids", "int32", "BT", MODEL, doc="0 = padding, 1.. one per tree piece in the row"),
    Field("subtree_end", "int32", "BT", MODEL, pad="arange", doc="row index of the last token of the subtree"),
    Field("parent_index", "int32", "BT", TREE, pad=-1, doc="row-local parent; a token is predicted from it"),
    Field("behav_logp", "float32", "BT", STAT, doc="the engine's log-prob of the sampled token"),
    Field("weight", "float32", "BT", STAT, doc="sum of the occurrences' aggregation coefficients"),
    Field("count", "float32", "BT", STAT, doc="loss occurrences of the node (token-mean metrics)"),
    Field("adv_pos", "float32", "BT", STAT, doc="sum of c * A over occurrences with A > 0"),
    Field("adv_neg", "float32", "BT", STAT, doc="sum of c * A over occurrences with A <= 0"),
    Field("ret_sum", "float32", "BT", STAT, doc="sum of c * R (value targets)"),
    Field("ret_sq_sum", "float32", "BT", STAT, doc="sum of c * R^2"),
    Field("norm", "float32", "B", TREE, doc="each tree's normaliser share, on its first piece's row"),
    Field("tree_id", "int32", "BT", HOST, pad=-1, doc="index of the tree in the step"),
    Field("node_id", "int32", "BT", HOST, doc="node id in that tree"),
    Field("own", "bool", "BT", HOST, doc="False for ancestor-path copies (context only)"),
    Field("loss_idx", "int32", "BK", SLOTS, doc="row slots that carry loss (the compact LM head's gather)"),
    Field("loss_valid", "bool", "BK", SLOTS, doc="which of the K loss slots are real"),
    Field("old_values", "float32", "BT", STEP, doc="PPO: the critic's values before the update"),
    Field("ref_logp", "float32", "BT", STEP, doc="KL penalty: the reference policy's log-probs"),
    Field("old_logp", "float32", "BT", STEP, doc="pi_old from a trainer forward (rl.recompute_old_logp)"),
    Field("expert_ids", "int32", "BTLk", STEP, pad=-1, doc="MoE routing replay: the engine's routed experts"),
    Field("mrope_positions", "int32", "BT3", VISUAL, doc="Qwen3-VL: (t, h, w) RoPE position of the slot"),
    Field("visual_index", "int32", "BT", VISUAL, pad=-1, doc="the merged image token a placeholder takes; -1 text"),
    Field("pixels", "float32", "NP", IMAGES, doc="patch rows of the step's distinct images, each image once"),
    Field("patch_hw", "int32", "N2", IMAGES, doc="a patch's (row, col) in its image (the tower's 2-D RoPE)"),
    Field("patch_taps", "int32", "N4", IMAGES, doc="its taps into the learned position table"),
    Field("patch_weights", "float32", "N4", IMAGES, doc="their bilinear weights"),
    Field("patch_frame", "int32", "N", IMAGES, doc="its frame (attention stays inside one; padding: its own)"),
)
BY_NAME = {f.name: f for f in FIELDS}


def names(*roles: str) -> tuple[str, ...]:
    """Field names of the given roles, in table order."""
    return tuple(f.name for f in FIELDS if f.role in roles)


STAT_FIELDS = tuple(n for n in names(STAT) if n != "behav_logp")  # targets.node_stats' outputs
ROW_FIELDS = names(MODEL, TREE, STAT, HOST)  # what packing writes (norm is per row)
MODEL_KEYS = names(MODEL)
# read at the loss slots when present: the statistics and the per-step [B, T] fields (not expert_ids)
SLOT_FIELDS = names(STAT) + tuple(n for n in names(STEP) if BY_NAME[n].shape == "BT")
PPO_FIELDS = STAT_FIELDS + ("old_values",)  # what the trainer recomputes after its value pass
HOST_ONLY = names(HOST)
DEVICE_ROW_FIELDS = names(MODEL, TREE, STAT)  # packed rows as they go to devices


def _shape(f: Field, dims: dict[str, int]) -> tuple[int, ...]:
    missing = [c for c in f.shape if c not in dims and not c.isdigit()]  # a digit is a fixed size
    if missing:
        raise ValueError(f"field {f.name!r} [{f.shape}] needs dims {missing}")
    return tuple(int(c) if c.isdigit() else dims[c] for c in f.shape)


def empty_rows(num_rows: int, row_len: int) -> dict[str, np.ndarray]:
    """Host arrays of the packed row fields, every slot padding (packing fills the used ones)."""
    out = {}
    for n in ROW_FIELDS:
        f = BY_NAME[n]
        shape = _shape(f, {"B": num_rows, "T": row_len})
        out[n] = (np.broadcast_to(np.arange(row_len, dtype=f.dtype), shape).copy() if f.pad == "arange"
                  else np.full(shape, f.pad, f.dtype))
    return out


def logical_axes(name: str) -> tuple[str | None, ...]:
    """Rows over the batch axes, everything else replicated (the step's images entirely)."""
    f = BY_NAME[name]
    return (None if f.role == IMAGES else "batch",) + (None,) * (len(f.shape) - 1)


def sharding(name: str, mesh: jax.sharding.Mesh, batch_axes: tuple[str, ...]) -> jax.sharding.NamedSharding:
    """Field `name`'s layout on `mesh`: its logical axes with "batch" on the mesh's `batch_axes` (the train step's
    in_shardings and AOT's abstract batch both come from here)."""
    spec = [batch_axes if a == "batch" else a for a in logical_axes(name)]
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def abstract(fields: tuple[str, ...] | list[str], *, sharding=None, **dims: int) -> dict[str, jax.ShapeDtypeStruct]:
    """ShapeDtypeStructs of `fields` at `dims` (B=, T=, K=, L=, k=, N=, P=), with `sharding` (one for all, or a
    function of the field name)."""
    of = sharding if callable(sharding) else (lambda _: sharding)
    return {n: jax.ShapeDtypeStruct(_shape(BY_NAME[n], dims), np.dtype(BY_NAME[n].dtype), sharding=of(n))
            for n in fields}


def check(batch: dict) -> None:
    """Every key is a field of the table with its dtype and a consistent shape; a precise error otherwise."""
    dims: dict[str, int] = {}
    for k, v in batch.items():
        if k not in BY_NAME:
            raise KeyError(f"batch key {k!r} is not a field of research/trees/batch.py (known: {sorted(BY_NAME)})")
        f = BY_NAME[k]
        if np.dtype(v.dtype) != np.dtype(f.dtype) or len(v.shape) != len(f.shape):
            raise ValueError(f"batch[{k!r}]: {v.dtype}{list(v.shape)}, field is {f.dtype} [{f.shape}]")
        for c, s in zip(f.shape, v.shape):
            if (int(c) if c.isdigit() else dims.setdefault(c, s)) != s:
                raise ValueError(f"batch[{k!r}] dim {c} = {s}, other fields have {c} = {dims[c]}")
