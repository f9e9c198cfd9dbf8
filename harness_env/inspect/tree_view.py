"""A group's prefix tree as the trainer built it, for the viewer: segments (calls as nodes), advantages, tokens.

Why rebuild it with the trainer's own code (research.trees.builder.build_tree, research.trees.targets): the page
must show what the update pushed, node for node, not a re-tokenised approximation. The tree holds one node per
token; the page draws *segments*: maximal single-child chains that start at a root, after a branch, after a
call's last token, or where context turns into generated tokens (so a call's completion is one segment and the
prompts' shared prefix is merged into one). Segments are contiguous node ranges of the DFS pre-order.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import pathlib
from collections.abc import Callable

import numpy as np

from harness_env.inspect.index import CallRef
from research.capture import CallRecord, PromptResolver, RolloutResult
from research.trees.builder import GroupTree, build_tree

TOKENS_PER_PAGE = 4000


def read_calls(capture: pathlib.Path, refs: list[CallRef], by_id: Callable[[str], CallRef | None]) -> list[CallRecord]:
    """Decodes the calls at `refs` (in file order), first feeding the calls their prompts continue (prompt_ref)."""
    resolver, fed, out = PromptResolver(), set(), []
    with open(capture, "rb") as f:
        def feed(ref: CallRef) -> CallRecord:
            if ref.ref and ref.ref not in fed and (parent := by_id(ref.ref)) is not None:
                feed(parent)
            f.seek(ref.offset)
            rec = resolver.decode(f.read(ref.length))
            fed.add(ref.call_id)
            return rec

        for ref in sorted(refs, key=lambda r: r.offset):
            out.append(feed(ref))
    return out


@dataclasses.dataclass
class TreeView:
    tree: GroupTree
    estimator: str
    excluded: dict[str, str]  # rollout id -> why it is not in the tree
    flat_tokens: int
    seg_start: np.ndarray  # [S] first node of each segment
    seg_len: np.ndarray  # [S]
    seg_parent: np.ndarray  # [S] parent segment, -1 for roots
    seg_of: np.ndarray  # [N] segment of each node
    node_adv: np.ndarray  # [N] mean advantage of the node's loss occurrences (nan: context)
    node_push: np.ndarray  # [N] sum of coef * advantage: what the loss pushes on the node
    labels: dict[str, str]  # rollout id -> short label (r0, r1, ...)

    @property
    def num_segments(self) -> int:
        return int(self.seg_start.shape[0])


def segment(tree: GroupTree) -> tuple[np.ndarray, np.ndarray]:
    """(start flags [N], segment of each node [N]) per the module's definition."""
    parent = tree.parent
    kids = np.bincount(parent[parent >= 0], minlength=tree.num_nodes)
    gen = tree.is_generated()
    ends = np.zeros(tree.num_nodes, bool)
    ends[[c.end_node for c in tree.calls]] = True
    start = np.ones(tree.num_nodes, bool)
    has = parent >= 0
    p = parent[has]
    start[has] = (kids[p] != 1) | ends[p] | (gen[has] != gen[p])
    return start, np.cumsum(start) - 1


def build_view(calls: list[CallRecord], results: list[RolloutResult], *, estimator: str = "grpo",
               aggregation: str = "token_mean") -> TreeView:
    """The tree of the group's ok calls of ok rollouts (what the trainer may train on), with GRPO-family
    advantages; ValueError when no rollout of the group can be in a tree."""
    from research.advantages import GROUP_ESTIMATORS
    from research.trees.targets import node_stats, rollout_advantages

    excluded = {r.rollout_id: f"status {r.status}" for r in results if r.status != "ok" or r.reward is None}
    ok = [r for r in results if r.rollout_id not in excluded]
    keep = {r.rollout_id for r in ok}
    use = [c for c in calls if c.rollout_id in keep and c.status == "ok" and c.completion_ids]
    for r in ok:
        if not any(c.rollout_id == r.rollout_id for c in use):
            excluded[r.rollout_id] = "no model call captured"
    if not use:
        raise ValueError("no rollout of this group finished ok with a captured call: nothing to build a tree of")
    tree = build_tree(use, ok)
    shown = estimator if estimator in GROUP_ESTIMATORS else "grpo"
    (occ_adv,) = rollout_advantages([tree], estimator=shown)
    stats = node_stats(tree, occ_adv=occ_adv, agg_name=aggregation)
    n = tree.num_nodes
    adv_sum, cnt = np.zeros(n), np.zeros(n)
    np.add.at(adv_sum, tree.occ_node, occ_adv)
    np.add.at(cnt, tree.occ_node, 1.0)
    start, seg_of = segment(tree)
    starts = np.flatnonzero(start)
    lens = np.diff(np.append(starts, n))
    seg_parent = np.where(tree.parent[starts] >= 0, seg_of[np.maximum(tree.parent[starts], 0)], -1)
    rids = sorted({c.rollout_id for c in tree.calls})
    return TreeView(tree=tree, estimator=shown if shown == estimator else f"grpo (the run uses {estimator})",
                    excluded=excluded, flat_tokens=sum(len(c.prompt_ids) + len(c.completion_ids) for c in use),
                    seg_start=starts, seg_len=lens, seg_parent=seg_parent, seg_of=seg_of,
                    node_adv=np.where(cnt > 0, adv_sum / np.maximum(cnt, 1), np.nan),
                    node_push=(stats["adv_pos"] + stats["adv_neg"]).astype(np.float64),
                    labels={r: f"r{i}" for i, r in enumerate(rids)})


class TokenText:
    """Token id -> its text (cached; a missing tokenizer shows ids)."""

    def __init__(self, tok):  # noqa: ANN001 - research.models.tokenizer.Tokenizer | None
        self.tok, self._cache = tok, {}

    def __call__(self, t: int) -> str:
        s = self._cache.get(t)
        if s is None:
            s = self._cache[t] = self.tok.decode([t]) if self.tok is not None else f"[{t}]"
        return s

    def text(self, ids) -> str:  # noqa: ANN001
        return "".join(self(int(t)) for t in ids)


def _f(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 4)


def tree_json(view: TreeView, text: TokenText) -> str:
    """The segments as JSON for the page's script (which draws the tree), safe inside a <script> element."""
    t, segs = view.tree, []
    gen = t.is_generated()
    ends = np.asarray([c.end_node for c in t.calls])
    for s in range(view.num_segments):
        a, n = int(view.seg_start[s]), int(view.seg_len[s])
        b = a + n
        through = [c for c, e in zip(t.calls, ends) if a <= e <= t.subtree_end[a]]
        rewards = {c.rollout_id: c.reward for c in through}
        g = gen[a:b]
        ids = t.tokens[a:b]
        preview = text.text(ids) if n <= 80 else text.text(ids[:50]) + " … " + text.text(ids[-24:])
        segs.append(dict(
            id=s, parent=int(view.seg_parent[s]), start=a, len=n, gen=bool(g.any()),
            calls=len(through), ends=[f"{view.labels[c.rollout_id]}.c{c.call_index}" for c, e in zip(t.calls, ends)
                                      if e == b - 1],
            rollouts=sorted(view.labels[r] for r in rewards), reward=_f(np.mean(list(rewards.values()))),
            adv=_f(np.nanmean(view.node_adv[a:b])) if g.any() else None,
            push=_f(view.node_push[a:b].sum()) if g.any() else None,
            lp=_f(t.behav_logp[a:b][g].mean()) if g.any() else None,
            page=a // TOKENS_PER_PAGE, text=preview))
    doc = {"segments": segs, "nodes": t.num_nodes, "labels": {v: k for k, v in view.labels.items()}}
    return json.dumps(doc).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _lp_colour(lp: float) -> str:
    return f"hsl({120 * math.exp(min(lp, 0.0)):.0f},75%,80%)"


def _adv_colour(a: float) -> str:
    if not math.isfinite(a) or a == 0:
        return "transparent"
    alpha = min(1.0, abs(a) / 2) * 0.8 + 0.1
    return f"rgba(40,160,60,{alpha:.2f})" if a > 0 else f"rgba(220,60,50,{alpha:.2f})"


def token_html(view: TreeView, text: TokenText, page: int) -> str:
    """The nodes of one page (TOKENS_PER_PAGE nodes, DFS order) as spans, grouped by segment; one span per node."""
    t = view.tree
    gen = t.is_generated()
    lo, hi = page * TOKENS_PER_PAGE, min(t.num_nodes, (page + 1) * TOKENS_PER_PAGE)
    out, cur = [], -1
    for n in range(lo, hi):
        s = int(view.seg_of[n])
        if s != cur:
            if cur >= 0:
                out.append("</div>")
            cur = s
            kind = "generated" if gen[n] else "context"
            out.append(f'<div class="seg" id="seg-{s}"><div class="seghead">segment {s} · {kind} · '
                       f'{int(view.seg_len[s])} tokens · depth {int(t.depth[n])}</div>')
        tok = html.escape(text(int(t.tokens[n])))
        if gen[n]:
            lp, a, push = float(t.behav_logp[n]), float(view.node_adv[n]), float(view.node_push[n])
            title = (f"node {n} · id {int(t.tokens[n])} · logp {lp:.3f} · adv {a:+.3f} · push {push:+.4f} · "
                     f"v{int(t.weight_version[n])}")
            out.append(f'<span class="tok gen" style="--lp:{_lp_colour(lp)};--ad:{_adv_colour(a)}" '
                       f'title="{html.escape(title)}">{tok}</span>')
        else:
            out.append(f'<span class="tok ctx" title="node {n} · id {int(t.tokens[n])} · context">{tok}</span>')
    if cur >= 0:
        out.append("</div>")
    return "".join(out)


def token_pages(view: TreeView) -> int:
    return max(1, -(-view.tree.num_nodes // TOKENS_PER_PAGE))
