"""Token prefix tree (trie) of all model calls of one rollout group.

Why: each call's prompt repeats everything before it, so training on calls as flat sequences costs
O(turns^2) tokens. Merging the calls of a group into a trie computes every shared token once; the
loss stays exactly the flat per-call loss because every *loss occurrence* (a completion token of
one call) is kept, attached to the trie node that holds its token.

Definitions (the flat view the tree must reproduce):
  * call c: the sequence `prompt_ids + completion_ids`; a root-to-node path of the trie.
  * loss occurrence: (call c, completion position k). Its node is the trie node of that token; its
    log-prob is log p(token | path to the node's parent), a function of the path only, so every
    occurrence of a node shares the model's log-prob, value and entropy.
  * context tokens (prompts, tool outputs) only condition; a node may be context for one call and
    generated for another (call 2's prompt repeats call 1's completion): that is fine.

Merging rule: a generated occurrence joins an existing child node only if that node's behaviour
log-prob is unset or bit-identical (the PPO ratio uses the behaviour log-prob as pi_old, so two
occurrences with different rollout log-probs must stay separate nodes: same token, sibling copies).
With `merge_generations=False` every loss occurrence gets its own node (needed only by losses that
are not linear per sign of the advantage, i.e. the clipped value loss). Context occurrences follow
any child with the right token: the hidden states along sibling copies are identical, so this is exact.

Images (a vision policy's calls: `image_pad_id` given, each record naming its images in `meta["images"]`): an
image's placeholder tokens are all the same id, so "the right token" of a placeholder is (id, image, index within
the image): two calls merge through an image only if it is the same image (sha256), never merely one of the same
size. The tree then lists its distinct images once (`images`), says which image and row each placeholder node
takes (`node_image`, `node_image_row`), and holds each node's 3-D RoPE position (`mrope_positions`, from the
path: research/models/mrope.rope_index), so the vision tower runs once per distinct image of the tree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from research.capture import CallRecord, RolloutResult
from research.models.mrope import IMAGE, rope_index


@dataclasses.dataclass
class CallInfo:
    """One call of the flat view, in the order the tree builder saw it."""

    rollout_id: str
    session_id: str
    call_index: int
    call_id: str
    prompt_len: int
    completion_len: int
    reward: float
    end_node: int  # trie node of the call's last token


@dataclasses.dataclass
class GroupTree:
    """A trie in DFS pre-order. Node arrays have length N; occurrence arrays length O."""

    group_id: str
    harness: str
    tokens: np.ndarray  # [N] int32
    parent: np.ndarray  # [N] int32, -1 for roots
    depth: np.ndarray  # [N] int32: index along the root path (= RoPE position)
    subtree_end: np.ndarray  # [N] int32: last node of the subtree (DFS pre-order)
    behav_logp: np.ndarray  # [N] float32: behaviour log-prob of generated nodes (0 for context)
    weight_version: np.ndarray  # [N] int32, -1 for context
    routed_experts: np.ndarray | None  # [N, L, K] int32 (-1 where unknown) or None
    occ_node: np.ndarray  # [O] int32: node of each loss occurrence
    occ_call: np.ndarray  # [O] int32: index into `calls`
    occ_pos: np.ndarray  # [O] int32: position within the call's completion
    calls: list[CallInfo]
    images: list[str] = dataclasses.field(default_factory=list)  # distinct "SHA:TxHxW" of the placeholder nodes
    node_image: np.ndarray | None = None  # [N] int32: index into `images` of a placeholder node, else -1
    node_image_row: np.ndarray | None = None  # [N] int32: its row among that image's merged tokens, else -1
    mrope_positions: np.ndarray | None = None  # [3, N] int32: 3-D RoPE positions (None: 1-D, `depth`)

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])

    def is_generated(self) -> np.ndarray:
        """[N] bool: nodes carrying at least one loss occurrence (trainable)."""
        out = np.zeros(self.num_nodes, bool)
        out[self.occ_node] = True
        return out

    def path(self, node: int) -> list[int]:
        """Nodes from the root to `node` inclusive."""
        out = []
        while node >= 0:
            out.append(node)
            node = int(self.parent[node])
        return out[::-1]

    def node_rollouts(self) -> list[set[str]]:
        """For each node, the rollouts whose calls pass through it (O(N * calls) host-side helper)."""
        out: list[set[str]] = [set() for _ in range(self.num_nodes)]
        for c in self.calls:
            for n in self.path(c.end_node):
                out[n].add(c.rollout_id)
        return out

    def node_rewards(self) -> list[list[float]]:
        """For each node, the rewards of the rollouts passing through it."""
        reward = {c.rollout_id: c.reward for c in self.calls}
        return [sorted(reward[r] for r in rs) for rs in self.node_rollouts()]


class _Trie:
    """Insertion-order trie; `finish` renumbers to DFS pre-order."""

    def __init__(self, routed_shape: tuple[int, int] | None):
        self.tokens: list[int] = []
        self.parent: list[int] = []
        self.behav: list[float | None] = []
        self.version: list[int] = []
        self.routed: list[np.ndarray | None] = []
        self.children: dict[tuple[int, object], list[int]] = {}
        self.routed_shape = routed_shape
        self.image: list[tuple[int, int]] = []  # (image index, row) of placeholder nodes, (-1, -1) otherwise
        self.pos3: list[tuple[int, int, int] | None] = []

    def _new(self, parent: int, tok: int, key: object = None, image: tuple[int, int] = (-1, -1)) -> int:
        n = len(self.tokens)
        self.tokens.append(tok)
        self.parent.append(parent)
        self.behav.append(None)
        self.version.append(-1)
        self.routed.append(None)
        self.image.append(image)
        self.pos3.append(None)
        self.children.setdefault((parent, tok if key is None else key), []).append(n)
        return n

    def step_context(self, parent: int, tok: int, key: object = None, image: tuple[int, int] = (-1, -1)) -> int:
        kids = self.children.get((parent, tok if key is None else key))
        return kids[0] if kids else self._new(parent, tok, key, image)

    def step_generated(self, parent: int, tok: int, logp: float, merge: bool) -> int:
        for n in self.children.get((parent, tok), ()):
            if self.behav[n] is None or (merge and self.behav[n] == logp):
                return n
        return self._new(parent, tok)


def _dfs_order(parent: np.ndarray) -> np.ndarray:
    """Pre-order of a forest given parents (children visited in insertion order)."""
    kids: list[list[int]] = [[] for _ in range(len(parent))]
    roots = []
    for n, p in enumerate(parent):
        (kids[p] if p >= 0 else roots).append(n)
    order, stack = [], roots[::-1]
    while stack:
        n = stack.pop()
        order.append(n)
        stack.extend(kids[n][::-1])
    return np.asarray(order, np.int64)


def _subtree_end(parent: np.ndarray) -> np.ndarray:
    """For a DFS pre-order forest: last index of each node's subtree."""
    end = np.arange(len(parent), dtype=np.int32)
    for n in range(len(parent) - 1, -1, -1):
        p = parent[n]
        if p >= 0 and end[n] > end[p]:
            end[p] = end[n]
    return end


def build_tree(
    calls: Sequence[CallRecord],
    results: Sequence[RolloutResult],
    *,
    merge_generations: bool = True,
    image_pad_id: int | None = None,
    merge_size: int = 2,
) -> GroupTree:
    """Merges the calls of one group (sorted by rollout, session, call index) into a GroupTree.

    Calls must already be validated; every call's rollout needs a result with a reward. `image_pad_id`: the
    policy's image placeholder token (a vision policy; `merge_size` its spatial merge), see the module docstring.
    """
    if not calls:
        raise ValueError("build_tree: no calls")
    reward = {r.rollout_id: r.reward for r in results}
    calls = sorted(calls, key=lambda c: (c.rollout_id, c.session_id, c.call_index))
    shape = next((c.routed_experts_shape[1:] for c in calls if c.routed_experts_shape), None)
    trie = _Trie(shape)
    infos, occ = [], []
    images: dict[str, int] = {}
    for ci, c in enumerate(calls):
        if reward.get(c.rollout_id) is None:
            raise ValueError(f"{c.where()}: rollout has no reward")
        keys, where, pos3 = _image_keys(c, image_pad_id, merge_size, images)
        node = -1
        for i, tok in enumerate(c.prompt_ids):
            node = trie.step_context(node, tok, None if keys is None else keys[i],
                                     (-1, -1) if where is None else where[i])
            if pos3 is not None and trie.pos3[node] is None:
                trie.pos3[node] = tuple(pos3[:, i])
        routed = None
        if c.routed_experts is not None and shape is not None:
            routed = np.asarray(c.routed_experts, np.int32).reshape(c.routed_experts_shape)
        for k, (tok, lp) in enumerate(zip(c.completion_ids, c.logprobs)):
            lp = float(np.float32(lp))
            node = trie.step_generated(node, tok, lp, merge_generations)
            if trie.behav[node] is None:
                trie.behav[node], trie.version[node] = lp, c.weight_version
                trie.routed[node] = None if routed is None else routed[k]
            if pos3 is not None and trie.pos3[node] is None:
                trie.pos3[node] = tuple(pos3[:, len(c.prompt_ids) + k])
            occ.append((node, ci, k))
        infos.append(CallInfo(c.rollout_id, c.session_id, c.call_index, c.call_id, len(c.prompt_ids),
                              len(c.completion_ids), float(reward[c.rollout_id]), node))
    return _finish(trie, infos, occ, calls[0].group_id, calls[0].harness, list(images) if image_pad_id else None)


def _image_keys(c: CallRecord, pad: int | None, merge: int, images: dict[str, int]):
    """(trie key per prompt token, (image index, row) per prompt token, 3-D positions of prompt + completion) of
    a vision call; (None, None, None) for a text policy. `images` collects the group's distinct images."""
    if pad is None:
        return None, None, None
    names = list(c.meta.get("images", ()))
    toks = np.asarray(c.prompt_ids)
    runs = np.flatnonzero(toks == pad)
    grids = [tuple(int(v) for v in n.split(":")[1].split("x")) for n in names]
    need = sum(t * h * w // merge**2 for t, h, w in grids)
    if len(runs) != need:
        raise ValueError(f"{c.where()}: {len(runs)} image placeholder tokens, its images {names} need {need}")
    keys: list[object] = list(c.prompt_ids)
    where = [(-1, -1)] * len(keys)
    at = 0
    for name, (t, h, w) in zip(names, grids):
        j = images.setdefault(name, len(images))
        for row in range(t * h * w // merge**2):
            i = int(runs[at])
            keys[i], where[i] = (pad, name, row), (j, row)
            at += 1
    types = np.zeros(len(c.prompt_ids) + len(c.completion_ids), np.int32)
    types[runs] = IMAGE
    pos3, _ = rope_index(types, grids, merge=merge)
    return keys, where, pos3


def _finish(trie: _Trie, infos: list[CallInfo], occ: list[tuple[int, int, int]], group: str,
            harness: str, images: list[str] | None = None) -> GroupTree:
    parent0 = np.asarray(trie.parent, np.int64)
    order = _dfs_order(parent0)
    new_of_old = np.empty_like(order)
    new_of_old[order] = np.arange(len(order))
    parent = np.where(parent0[order] >= 0, new_of_old[np.maximum(parent0[order], 0)], -1).astype(np.int32)
    depth = np.zeros(len(order), np.int32)
    for n in range(len(order)):
        if parent[n] >= 0:
            depth[n] = depth[parent[n]] + 1
    behav = np.asarray([0.0 if b is None else b for b in trie.behav], np.float32)[order]
    routed = None
    if trie.routed_shape is not None:
        fill = np.full(trie.routed_shape, -1, np.int32)
        routed = np.stack([fill if r is None else r for r in trie.routed])[order]
    occ_a = np.asarray(occ, np.int64).reshape(-1, 3)
    for info in infos:
        info.end_node = int(new_of_old[info.end_node])
    return GroupTree(
        group_id=group, harness=harness,
        tokens=np.asarray(trie.tokens, np.int32)[order], parent=parent, depth=depth,
        subtree_end=_subtree_end(parent), behav_logp=behav,
        weight_version=np.asarray(trie.version, np.int32)[order], routed_experts=routed,
        occ_node=new_of_old[occ_a[:, 0]].astype(np.int32), occ_call=occ_a[:, 1].astype(np.int32),
        occ_pos=occ_a[:, 2].astype(np.int32), calls=infos,
        **({} if images is None else _image_fields(trie, order, images)),
    )


def _image_fields(trie: _Trie, order: np.ndarray, images: list[str]) -> dict:
    img = np.asarray(trie.image, np.int32).reshape(-1, 2)[order]
    return {"images": images, "node_image": img[:, 0], "node_image_row": img[:, 1],
            "mrope_positions": np.asarray(trie.pos3, np.int32)[order].T.copy()}
