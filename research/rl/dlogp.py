"""The per-token log-prob change of one RL update, saved for the run viewer: RUN/dlogp/step{V:05d}.npz.

`update_effect` (research/rl/diagnostics.py) logs only means (dlogp of A > 0 / A < 0 tokens). To see *which*
tokens an update moved, the trainer keeps, after the update, new_logp - behav_logp of every trained token (the
post-update forward of `train.diagnostics` computes new_logp anyway), and the loop writes it next to the ledger
under the policy version V the update produced (ledger.jsonl's `step`, the metrics' step).

Why per call, not per tree node: the viewer rebuilds a group's tree from the capture log with its *ok* rollouts
only, while the trainer's tree may hold more (scored failures: a timeout trained at `failure_reward`), so node
numbers differ between the two; a call's completion tokens are the same in both. A node's log-prob is a
function of its root path only, so every loss occurrence of a node carries the node's value.

File arrays (numpy only, no pickles): `group`, `harness` [G] str; per call `call_tree` [C] (index into group),
`call_rollout`, `call_session` [C] str, `call_index`, `call_len` [C] int32; `dlogp` [sum call_len] float32, the
calls' completion tokens in order (NaN where a token had no loss slot).
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from research.trees.builder import GroupTree

CallKey = tuple[str, str, int]  # (rollout id, session id, call index)


def path_of(workdir: str | os.PathLike, version: int) -> pathlib.Path:
    return pathlib.Path(workdir) / "dlogp" / f"step{version:05d}.npz"


def node_dlogp(packed: dict[str, np.ndarray], trees: list[GroupTree], new_logp: np.ndarray) -> list[np.ndarray]:
    """[N] float32 per tree: new_logp - behav_logp at each node trained in `packed` (NaN elsewhere). Each own
    slot with loss (count > 0) is one node of one tree; ancestor-path copies (own False) carry no loss."""
    sel = packed["own"] & (packed["count"] > 0)
    d = (np.asarray(new_logp, np.float32) - packed["behav_logp"])[sel]
    tid, nid = packed["tree_id"][sel], packed["node_id"][sel]
    out = []
    for i, t in enumerate(trees):
        arr = np.full(t.num_nodes, np.nan, np.float32)
        m = tid == i
        arr[nid[m]] = d[m]
        out.append(arr)
    return out


def save(path: str | os.PathLike, trees: list[GroupTree], node_d: list[np.ndarray]) -> pathlib.Path:
    """Writes the file (tmp + rename: a live viewer never reads half of it); returns its path."""
    cols: dict[str, list] = {k: [] for k in ("call_tree", "call_rollout", "call_session", "call_index", "call_len")}
    vals = []
    for i, (t, d) in enumerate(zip(trees, node_d)):
        order = np.lexsort((t.occ_pos, t.occ_call))  # by call, then completion position
        vals.append(d[t.occ_node[order]])
        lens = np.bincount(t.occ_call, minlength=len(t.calls))
        for c, n in zip(t.calls, lens.tolist()):
            for k, v in zip(cols, (i, c.rollout_id, c.session_id, c.call_index, n)):
                cols[k].append(v)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, group=np.asarray([t.group_id for t in trees], str), harness=np.asarray([t.harness for t in trees],
                 str), dlogp=np.concatenate(vals).astype(np.float32) if vals else np.zeros(0, np.float32),
                 **{k: np.asarray(v, str if k in ("call_rollout", "call_session") else np.int32)
                    for k, v in cols.items()})
    os.replace(tmp, path)
    return path


def load(path: str | os.PathLike) -> dict[tuple[str, str], dict[CallKey, np.ndarray]]:
    """(group id, harness) -> {(rollout id, session id, call index): dlogp of the call's completion tokens}.
    OSError / ValueError (a file that is not one of these) propagate to the caller."""
    with np.load(path, allow_pickle=False) as z:
        group, harness, tree = z["group"].tolist(), z["harness"].tolist(), z["call_tree"]
        rollout, session, index, lens = (z["call_rollout"].tolist(), z["call_session"].tolist(),
                                         z["call_index"].tolist(), z["call_len"])
        d = z["dlogp"]
    if int(lens.sum()) != d.shape[0]:
        raise ValueError(f"{path}: {d.shape[0]} dlogp values for calls of {int(lens.sum())} tokens")
    out: dict[tuple[str, str], dict[CallKey, np.ndarray]] = {}
    ends = np.cumsum(lens)
    for c, (t, end, n) in enumerate(zip(tree.tolist(), ends.tolist(), lens.tolist())):
        out.setdefault((group[t], harness[t]), {})[(rollout[c], session[c], index[c])] = d[end - n:end]
    return out


def on_tree(tree: GroupTree, per_call: dict[CallKey, np.ndarray]) -> np.ndarray:
    """[N] dlogp of `tree`'s nodes from a group's calls in a file (NaN for nodes of calls the file lacks)."""
    out = np.full(tree.num_nodes, np.nan, np.float32)
    for ci, c in enumerate(tree.calls):
        vals = per_call.get((c.rollout_id, c.session_id, c.call_index))
        if vals is None:
            continue
        occ = np.flatnonzero(tree.occ_call == ci)
        pos = tree.occ_pos[occ]
        ok = pos < vals.shape[0]
        out[tree.occ_node[occ[ok]]] = vals[pos[ok]]
    return out
