"""Pack prefix trees into fixed-length rows for the model's tree-attention contract.

Row layout (per the model contract): tokens in DFS pre-order, `positions` = depth, `segment_ids`
(0 = padding, 1.. one piece per segment), `subtree_end` (row index of the last token of each token's
subtree). Key j is visible to query i iff seg[i] == seg[j] != 0 and j <= i <= subtree_end[j].

Several targets per token: a token with several children predicts each of them. We therefore put
the prediction of token t *at t's own slot*: logp[t] = log_softmax(head(hidden[parent_index[t]]))[tokens[t]]
(`parent_index` is row-local; -1 for a root, whose slot never carries loss). The trainer gathers
hidden states by `parent_index` and then runs the fused chunked log-prob function on (gathered
hidden, tokens). Values of a critic use the same gather: V of action t is predicted from its parent.

Splitting a tree larger than a row: the DFS order is cut into pieces [a, b); the ancestors of every
token of the piece that lie before `a` all lie on the root path of `a`, so each piece is prefixed by
a copy of that path as context (loss statistics zero; each copy keeps its own subtree range, so a token
sees only its true ancestors) and stays exact. Pieces (and whole trees) are
placed with best-fit decreasing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from research.models.mrope import vision_grid
from research.trees.batch import IMAGES, STAT_FIELDS, empty_rows, names
from research.trees.builder import GroupTree


@dataclasses.dataclass
class Piece:
    tree: int
    ctx: np.ndarray  # global node ids of the ancestor-path copy (context only)
    start: int  # own nodes are [start, stop) of the tree's DFS order
    stop: int

    @property
    def size(self) -> int:
        return len(self.ctx) + self.stop - self.start


def split_tree(tree: GroupTree, tree_idx: int, row_len: int) -> list[Piece]:
    """Greedy cut of the DFS order so every piece (ancestor copy + own nodes) fits in a row."""
    pieces, a, n = [], 0, tree.num_nodes
    while a < n:
        ctx_len = int(tree.depth[a])
        if ctx_len >= row_len:
            raise ValueError(f"tree {tree.group_id!r}: node {a} needs its root path of {ctx_len + 1} tokens "
                             f"in one row, longer than row length {row_len}")
        b = min(n, a + row_len - ctx_len)
        ctx = np.asarray(tree.path(int(tree.parent[a])) if ctx_len else [], np.int64)
        pieces.append(Piece(tree_idx, ctx, a, b))
        a = b
    return pieces


def best_fit(sizes: list[int], row_len: int) -> list[list[int]]:
    """Best-fit decreasing: each item goes to the fullest row that still has room."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        fits = [r for r in range(len(rows)) if free[r] >= sizes[i]]
        if fits:
            r = min(fits, key=lambda r: free[r])
        else:
            rows.append([])
            free.append(row_len)
            r = len(rows) - 1
        rows[r].append(i)
        free[r] -= sizes[i]
    return rows


def _write_piece(out: dict[str, np.ndarray], r: int, off: int, seg: int, p: Piece, tree: GroupTree,
                 stats: dict[str, np.ndarray]) -> None:
    own = np.arange(p.start, p.stop)
    nodes = np.concatenate([p.ctx, own])
    n_ctx, sl = len(p.ctx), slice(off, off + p.size)
    local = lambda g: np.where(g >= p.start, off + n_ctx + g - p.start, off + tree.depth[np.maximum(g, 0)])
    par = tree.parent[nodes]
    out["tokens"][r, sl] = tree.tokens[nodes]
    out["positions"][r, sl] = tree.depth[nodes]
    out["segment_ids"][r, sl] = seg
    # an ancestor u of `start` covers the piece's own nodes up to its subtree end (DFS: contiguous)
    out["subtree_end"][r, sl] = off + n_ctx + np.minimum(tree.subtree_end[nodes], p.stop - 1) - p.start
    out["parent_index"][r, sl] = np.where(par >= 0, local(par), -1)
    out["tree_id"][r, sl] = p.tree
    out["node_id"][r, sl] = nodes
    is_own = np.arange(p.size) >= n_ctx
    out["own"][r, sl] = is_own
    out["behav_logp"][r, sl] = np.where(is_own, tree.behav_logp[nodes], 0.0)
    for k in STAT_FIELDS:
        out[k][r, sl] = np.where(is_own, stats[k][nodes], 0.0)


def pack_trees(trees: list[GroupTree], stats: list[dict[str, np.ndarray]], norms: list[float], *,
               row_len: int, num_rows: int | None = None) -> dict[str, np.ndarray]:
    """Packs trees (with their per-node loss stats) into [B, row_len] arrays; pads to `num_rows` rows.

    `norm` [B]: each tree's normaliser share is put on the row of its first piece; the batch
    denominator is `norm.sum()`.
    """
    pieces = [p for i, t in enumerate(trees) for p in split_tree(t, i, row_len)]
    rows = best_fit([p.size for p in pieces], row_len)
    B = len(rows) if num_rows is None else num_rows
    if len(rows) > B:
        raise ValueError(f"{len(pieces)} pieces need {len(rows)} rows of {row_len}, batch has {B}")
    out = empty_rows(B, row_len)  # padding per research/trees/batch.py (subtree_end: each slot sees itself)
    for r, items in enumerate(rows):
        off = 0
        for seg, i in enumerate(items, start=1):
            p = pieces[i]
            _write_piece(out, r, off, seg, p, trees[p.tree], stats[p.tree])
            if p.start == 0:
                out["norm"][r] += norms[p.tree]
            off += p.size
    return out


def pack_routed_experts(trees: list[GroupTree], packed: dict[str, np.ndarray]) -> np.ndarray | None:
    """[B, T, L, K] routed experts of generated slots (-1 for context/padding: router decides)."""
    if not trees or trees[0].routed_experts is None:
        return None
    L, K = trees[0].routed_experts.shape[1:]
    out = np.full(packed["tokens"].shape + (L, K), -1, np.int32)
    for t, tree in enumerate(trees):
        sel = packed["tree_id"] == t
        out[sel] = tree.routed_experts[packed["node_id"][sel]]
    return out


def pack_images(trees: list[GroupTree], packed: dict[str, np.ndarray], *, merge: int = 2
                ) -> tuple[dict[str, np.ndarray], list[str]] | None:
    """A vision policy's row fields (`mrope_positions` [B, T, 3], `visual_index` [B, T]) and the step's distinct
    images ("SHA:TxHxW", first appearance first), or None when no tree has an image.

    Each distinct image is listed once however many trees, calls and row pieces show it, so the tower runs once
    per image per step; `visual_index` is the placeholder's row among the concatenated merged tokens of that
    list (-1 for text and padding). A text tree of the step keeps 1-D positions on all three axes."""
    if not any(t.images for t in trees):
        return None
    step: dict[str, int] = {}
    for t in trees:
        for name in t.images:
            step.setdefault(name, len(step))
    sizes = [np.prod([int(v) for v in name.rsplit(":", 1)[1].split("x")]) // merge**2 for name in step]
    start = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    visual = np.full(packed["tokens"].shape, -1, np.int32)
    pos3 = np.repeat(packed["positions"][..., None], 3, axis=-1).astype(np.int32)
    for i, tree in enumerate(trees):
        sel = (packed["tree_id"] == i) & (packed["segment_ids"] > 0)
        nodes = packed["node_id"][sel]
        if tree.mrope_positions is not None:
            pos3[sel] = tree.mrope_positions[:, nodes].T
        if tree.images:
            first = start[[step[name] for name in tree.images]]
            img = tree.node_image[nodes]
            visual[sel] = np.where(img >= 0, first[np.maximum(img, 0)] + tree.node_image_row[nodes], -1)
    return {"mrope_positions": pos3, "visual_index": visual}, list(step)


def image_fields(pixels: list[np.ndarray], grids: list[tuple[int, int, int]], *, merge: int, side: int,
                 min_patches: int = 64) -> dict[str, np.ndarray]:
    """The step's images (in `pack_images`' order) as the batch's IMAGES fields: patches concatenated, padded to a
    power of two (a few compilations, not one per set of images); the padding is a frame of its own, never
    attended to by a real patch, and its merged tokens are never indexed."""
    g = vision_grid(grids, merge=merge, side=side)
    n = g.num_patches
    total = max(min_patches, 1 << (n - 1).bit_length())
    pad = lambda a, v=0: np.concatenate([a, np.full((total - n,) + a.shape[1:], v, a.dtype)])  # noqa: E731
    px = np.concatenate(pixels).astype(np.float32)
    if px.shape[0] != n:
        raise ValueError(f"pixels have {px.shape[0]} patch rows, the grids {grids} {n}")
    cols = (pad(px), pad(g.hw_Nx2), pad(g.taps_Nx4), pad(g.weights_Nx4), pad(g.frame_N, int(g.frame_N.max()) + 1))
    return dict(zip(names(IMAGES), cols, strict=True))
