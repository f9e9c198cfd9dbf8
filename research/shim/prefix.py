"""Parent lookup for a session's calls: which earlier call shares the longest token prefix with a prompt.

A radix trie over the token sequences (prompt + completion) of the session's finished calls. Each
edge holds a run of tokens, each node the most recent call whose sequence passes through it, so a
lookup walks the prompt once: O(prompt) whatever the number of earlier calls (a scan over earlier
calls made a 2000-call session 6x slower per call by its end). Inserting costs O(sequence) and
stores only the tokens not already in the trie; a sequence extending a leaf grows that leaf's
edge, so an append-only session is a single edge (one slice compare per lookup).

Edge runs are Python lists compared slice against slice (C loops; a 20k-token prompt costs ~0.1 ms),
and the one mismatching edge of a lookup is bisected on halves, O(edge) in total.
"""

from __future__ import annotations

from collections.abc import Sequence


class _Node:
    __slots__ = ("run", "children", "latest", "latest_id")

    def __init__(self, run: list[int], latest: int, latest_id: str):
        self.run = run  # tokens on the edge from the parent to this node
        self.children: dict[int, _Node] = {}
        self.latest, self.latest_id = latest, latest_id  # newest call through this node


def common_prefix(a: Sequence[int], a0: int, b: Sequence[int], b0: int, n: int) -> int:
    """Length of the common prefix of a[a0:a0+n] and b[b0:b0+n] (both at least n long)."""
    if (a if a0 == 0 and n == len(a) else a[a0:a0 + n]) == b[b0:b0 + n]:  # whole edge: no copy of it
        return n
    lo, hi = 0, n  # a/b agree on [0, lo) and differ somewhere in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[a0 + lo:a0 + mid] == b[b0 + lo:b0 + mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixIndex:
    """Longest-common-prefix parent lookup over inserted sequences; ties go to the latest insert."""

    def __init__(self):
        self._root = _Node([], -1, "")
        self._n = 0
        self.tokens = 0  # tokens stored on edges (memory ~ 8 bytes each + the shared ints)
        self._last: tuple[str, int, list[_Node]] | None = None  # last insert if it ended a leaf: id, length, path

    def __len__(self) -> int:
        return self._n

    def extend_last(self, call_id: str, parent_id: str | None, n: int | None, prompt: Sequence[int],
                    completion: Sequence[int] = ()) -> bool:
        """Inserts prompt + completion in O(new tokens) when `prompt[:n]` is the whole parent sequence (what
        `lookup` found) and the parent is the last sequence inserted, ending a leaf: an append-only
        session's next call. False, inserting nothing, otherwise: use `insert`."""
        last = self._last
        if last is None or (last[0], last[1]) != (parent_id, n):
            return False
        tail = [*prompt[n:], *completion]
        if not tail:
            return False
        order, path = self._n, last[2]
        self._n += 1
        for node in (self._root, *path):
            node.latest, node.latest_id = order, call_id
        path[-1].run += tail
        self.tokens += len(tail)
        self._last = (call_id, n + len(tail), path)
        return True

    def insert(self, seq: Sequence[int], call_id: str) -> None:
        order = self._n
        self._n += 1
        node, i, n = self._root, 0, len(seq)
        node.latest, node.latest_id = order, call_id
        path, self._last = [], None
        while i < n:
            child = node.children.get(seq[i])
            if child is None:
                node.children[seq[i]] = leaf = _Node(list(seq[i:]), order, call_id)
                self.tokens += n - i
                self._last = (call_id, n, path + [leaf])
                return
            run = child.run
            m = common_prefix(run, 0, seq, i, min(len(run), n - i))
            if m < len(run):  # split the edge at m; the new sequence ends at or branches from there
                mid = _Node(run[:m], order, call_id)
                child.run = run[m:]
                mid.children[child.run[0]] = child
                node.children[seq[i]] = mid
                if i + m < n:
                    mid.children[seq[i + m]] = _Node(list(seq[i + m:]), order, call_id)
                    self.tokens += n - i - m
                return
            child.latest, child.latest_id = order, call_id
            node, i = child, i + m
            path.append(node)
            if i < n and not node.children and node is not self._root:
                # the new sequence extends a leaf (an append-only session): grow its edge instead of
                # chaining a node per call; the shorter sequence loses nothing, as ties go to the newer
                node.run += seq[i:]
                self.tokens += n - i
                self._last = (call_id, n, path)
                return

    def lookup(self, prompt: Sequence[int]) -> tuple[str | None, int | None]:
        """(call id, common-prefix length) of the best earlier sequence, or (None, None)."""
        node, i, n = self._root, 0, len(prompt)
        while i < n:
            child = node.children.get(prompt[i])
            if child is None:
                break
            m = common_prefix(child.run, 0, prompt, i, min(len(child.run), n - i))
            node, i = child, i + m
            if m < len(child.run):
                break
        return (node.latest_id, i) if i > 0 else (None, None)
