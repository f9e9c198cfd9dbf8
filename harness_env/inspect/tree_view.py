"""A group's prefix tree as the trainer built it, for the viewer: segments (calls as nodes), advantages, tokens.

Why rebuild it with the trainer's own code (research.trees.builder.build_tree, research.trees.targets): the page
must show what the update pushed, node for node, not a re-tokenised approximation. The tree holds one node per
token; the page draws *segments*: maximal single-child chains that start at a root, after a branch, after a
call's last token, or where context turns into generated tokens (so a call's completion is one segment and the
prompts' shared prefix is merged into one). Segments are contiguous node ranges of the DFS pre-order.

Δlogprob (after the step): the update that trained the group (ledger.jsonl) wrote new_logp - behav_logp of its
tokens per call (research/rl/dlogp.py); `attach_dlogp` maps them onto this tree's nodes through its calls.
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
from research.rl import dlogp
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
    node_dlogp: np.ndarray | None = None  # [N] new_logp - behav_logp after the update that trained it (nan: none)
    dlogp_note: str = "no update has trained this group yet (ledger.jsonl)"  # what the Δlogprob colouring shows

    @property
    def num_segments(self) -> int:
        return int(self.seg_start.shape[0])


def bucket(n: int) -> int:
    """The padded reward count of a group of n rollouts: a power of two, at least 8."""
    return max(8, 1 << max(0, n - 1).bit_length())


def occurrence_advantages(tree: GroupTree, estimator: str) -> np.ndarray:
    """[O] what research.trees.targets.rollout_advantages gives the lone tree, with the rewards padded to
    `bucket(n)` by a second, dummy group (the estimators normalise within each group, so the real one's values
    are unchanged). Why: JAX compiles the estimator for every new reward count, 0.34 s per group size measured;
    padded, once per bucket (which the server warms at start)."""
    from research import advantages as adv_lib

    if estimator in adv_lib.TREE_ESTIMATORS:  # per node, host-side numpy: nothing to compile
        from research.trees.credit import occurrence_advantages as tree_estimator

        return tree_estimator(tree, estimator=estimator)
    rids = list(dict.fromkeys(c.rollout_id for c in tree.calls))
    reward = {c.rollout_id: c.reward for c in tree.calls}
    n, size = len(rids), bucket(len(rids))
    r, g = np.zeros(size, np.float32), np.ones(size, np.int32)
    r[:n], g[:n] = [reward[x] for x in rids], 0
    adv = np.asarray(adv_lib.group_advantages(estimator, rewards_N=r, group_ids_N=g, num_groups=2))[:n]
    at = {x: i for i, x in enumerate(rids)}
    return adv[[at[tree.calls[ci].rollout_id] for ci in tree.occ_call.tolist()]].astype(np.float32)


def warm_estimator(estimator: str, sizes: set[int]) -> None:
    """Compiles the estimator for every bucket up to the largest of these group sizes (the server's start; a
    group's ok rollouts, which its tree holds, may be fewer than its rollouts)."""
    from research import advantages as adv_lib

    top = bucket(max(sizes, default=0))
    for size in (b for b in (1 << k for k in range(3, 31)) if b <= top):
        adv_lib.group_advantages(estimator, rewards_N=np.zeros(size, np.float32),
                                 group_ids_N=np.ones(size, np.int32), num_groups=2)


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
    from research.advantages import ESTIMATORS
    from research.trees.targets import node_stats

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
    shown = estimator if estimator in ESTIMATORS else "grpo"
    occ_adv = occurrence_advantages(tree, shown)
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


def attach_dlogp(view: TreeView, per_call: dict[dlogp.CallKey, np.ndarray], step: int) -> None:
    """The Δlogprob of update `step` on the view's nodes (from that update's file: the group's calls)."""
    d = dlogp.on_tree(view.tree, per_call)
    gen = view.tree.is_generated()
    known = int(np.isfinite(d[gen]).sum())
    if not known:
        view.dlogp_note = f"the file of update {step} holds none of this group's calls"
        return
    view.node_dlogp = d
    view.dlogp_note = (f"update {step}: new - behaviour log-prob of {known} of {int(gen.sum())} generated tokens "
                       f"(colour scale ±{dlogp_scale(view):.3g})")


def dlogp_scale(view: TreeView) -> float:
    d = view.node_dlogp
    return float(np.nanmax(np.abs(d))) if d is not None and np.isfinite(d).any() else 0.0


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
            dl=_f(np.nanmean(view.node_dlogp[a:b][g])) if g.any() and view.node_dlogp is not None
            and np.isfinite(view.node_dlogp[a:b][g]).any() else None,
            page=a // TOKENS_PER_PAGE, text=preview))
    doc = {"segments": segs, "nodes": t.num_nodes, "labels": {v: k for k, v in view.labels.items()}}
    return json.dumps(doc).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _lp_colour(lp: float) -> str:
    return f"hsl({120 * math.exp(min(lp, 0.0)):.0f},75%,80%)"


def _adv_colour(a: float, scale: float = 2.0) -> str:
    """Green up, red down, the strength |a| / scale (advantages: / 2; Δlogprob: / the tree's largest |Δ|)."""
    if not math.isfinite(a) or a == 0 or scale <= 0:
        return "transparent"
    alpha = min(1.0, abs(a) / scale) * 0.8 + 0.1
    return f"rgba(40,160,60,{alpha:.2f})" if a > 0 else f"rgba(220,60,50,{alpha:.2f})"


def token_html(view: TreeView, text: TokenText, page: int) -> str:
    """The nodes of one page (TOKENS_PER_PAGE nodes, DFS order) as spans, grouped by segment; one span per node."""
    t = view.tree
    gen = t.is_generated()
    lo, hi = page * TOKENS_PER_PAGE, min(t.num_nodes, (page + 1) * TOKENS_PER_PAGE)
    out, cur, scale = [], -1, dlogp_scale(view)
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
            d = float(view.node_dlogp[n]) if view.node_dlogp is not None else math.nan
            title = (f"node {n} · id {int(t.tokens[n])} · logp {lp:.3f} · adv {a:+.3f} · push {push:+.4f} · "
                     f"v{int(t.weight_version[n])}" + (f" · Δlogp {d:+.4f}" if math.isfinite(d) else ""))
            dl = f' data-dl="{d:.7g}"' if math.isfinite(d) else ""
            out.append(f'<span class="tok gen" style="--lp:{_lp_colour(lp)};--ad:{_adv_colour(a)};'
                       f'--dl:{_adv_colour(d, scale)}"{dl} title="{html.escape(title)}">{tok}</span>')
        else:
            out.append(f'<span class="tok ctx" title="node {n} · id {int(t.tokens[n])} · context">{tok}</span>')
    if cur >= 0:
        out.append("</div>")
    return "".join(out)


def token_pages(view: TreeView) -> int:
    return max(1, -(-view.tree.num_nodes // TOKENS_PER_PAGE))
