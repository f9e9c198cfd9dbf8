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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from research.capture import CallRecord, RolloutResult


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
        self.children: dict[tuple[int, int], list[int]] = {}
        self.routed_shape = routed_shape

    def _new(self, parent: int, tok: int) -> int:
        n = len(self.tokens)
        self.tokens.append(tok)
        self.parent.append(parent)
        self.behav.append(None)
        self.version.append(-1)
        self.routed.append(None)
        self.children.setdefault((parent, tok), []).append(n)
        return n

    def step_context(self, parent: int, tok: int) -> int:
        kids = self.children.get((parent, tok))
        return kids[0] if kids else self._new(parent, tok)

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
) -> GroupTree:
    """Merges the calls of one group (sorted by rollout, session, call index) into a GroupTree.

    Calls must already be validated; every call's rollout needs a result with a reward.
    """
    if not calls:
        raise ValueError("build_tree: no calls")
    reward = {r.rollout_id: r.reward for r in results}
    calls = sorted(calls, key=lambda c: (c.rollout_id, c.session_id, c.call_index))
    shape = next((c.routed_experts_shape[1:] for c in calls if c.routed_experts_shape), None)
    trie = _Trie(shape)
    infos, occ = [], []
    for ci, c in enumerate(calls):
        if reward.get(c.rollout_id) is None:
            raise ValueError(f"{c.where()}: rollout has no reward")
        node = -1
        for tok in c.prompt_ids:
            node = trie.step_context(node, tok)
        routed = None
        if c.routed_experts is not None and shape is not None:
            routed = np.asarray(c.routed_experts, np.int32).reshape(c.routed_experts_shape)
        for k, (tok, lp) in enumerate(zip(c.completion_ids, c.logprobs)):
            lp = float(np.float32(lp))
            node = trie.step_generated(node, tok, lp, merge_generations)
            if trie.behav[node] is None:
                trie.behav[node], trie.version[node] = lp, c.weight_version
                trie.routed[node] = None if routed is None else routed[k]
            occ.append((node, ci, k))
        infos.append(CallInfo(c.rollout_id, c.session_id, c.call_index, c.call_id, len(c.prompt_ids),
                              len(c.completion_ids), float(reward[c.rollout_id]), node))
    return _finish(trie, infos, occ, calls[0].group_id, calls[0].harness)


def _finish(trie: _Trie, infos: list[CallInfo], occ: list[tuple[int, int, int]], group: str,
            harness: str) -> GroupTree:
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
    )
