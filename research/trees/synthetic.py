"""Synthetic rollout groups shaped like real harness captures (tests, bench, notebook).

A group: G sessions of one task share a system prompt + task prefix; each session makes `turns`
calls, each call's prompt = previous prompt + previous completion + a tool output (pure append),
except with probability `p_rewrite` a history rewrite (context compaction: the history after the
prefix is replaced by a short summary), which branches the tree. With `p_duplicate` a session
repeats the first completion of another session verbatim (same tokens, same or different
behaviour logprobs): merged identical generations of different reward. Truncation: with `p_trunc`
a completion ends with finish_reason "length". `fork_group` adds forked children (branches at later calls).
"""

from __future__ import annotations

import numpy as np

from research.capture import CallRecord, RolloutResult


def make_group(
    rng: np.random.Generator, *, group_id: str = "task0", harness: str = "codex", sessions: int = 4,
    turns: int = 3, prefix_len: int = 16, gen_len: tuple[int, int] = (2, 8), tool_len: tuple[int, int] = (1, 6),
    vocab: int = 50, p_rewrite: float = 0.2, p_duplicate: float = 0.3, p_trunc: float = 0.2,
    routed_shape: tuple[int, int] | None = None, rollout_prefix: str = "r",
) -> tuple[list[CallRecord], list[RolloutResult]]:
    """One group of `sessions` rollouts (one session each). Rewards are random in {0, 0.5, 1}."""
    toks = lambda n: rng.integers(1, vocab, size=int(n)).tolist()
    prefix = toks(prefix_len)
    calls, results, first = [], [], []
    for s in range(sessions):
        rid = f"{rollout_prefix}{group_id}-{harness}-{s}"
        history = toks(rng.integers(*tool_len))  # the user's task message differs slightly per session
        dup = bool(first) and rng.random() < p_duplicate
        for k in range(turns):
            if k == 0 and dup:  # same task message, same completion: merges with the source session
                history, comp, lps = first[int(rng.integers(len(first)))]
                if rng.random() < 0.3:  # same tokens, different rollout logprobs: must not merge
                    lps = [lp - 0.1 for lp in lps]
            else:
                comp = toks(rng.integers(*gen_len))
                lps = (-rng.random(len(comp)) * 2.0).astype(np.float32).tolist()
            prompt = prefix + history
            if k == 0:
                first.append((history, comp, lps))
            finish = "length" if rng.random() < p_trunc else "stop"
            routed = shape = None
            if routed_shape is not None:
                shape = (len(comp), *routed_shape)
                routed = rng.integers(0, 8, size=int(np.prod(shape))).tolist()
            calls.append(CallRecord(
                rollout_id=rid, session_id=f"{rid}-s", group_id=group_id, harness=harness, call_index=k,
                prompt_ids=prompt, completion_ids=comp, logprobs=lps, weight_version=1, finish_reason=finish,
                call_id=f"{rid}-c{k}", routed_experts=routed, routed_experts_shape=shape))
            history = history + comp + toks(rng.integers(*tool_len))
            if rng.random() < p_rewrite:
                history = toks(3) + comp + toks(rng.integers(*tool_len))
        reward = float(rng.choice([0.0, 0.5, 1.0]))
        results.append(RolloutResult(rollout_id=rid, group_id=group_id, harness=harness, status="ok",
                                     reward=reward, session_ids=[f"{rid}-s"]))
    return calls, results


def make_harness_group(rng: np.random.Generator, *, group_id: str = "task0", sessions: int = 8, turns: int = 20,
                       prefix_len: int = 2048, gen_len: tuple[int, int] = (50, 500),
                       tool_len: tuple[int, int] = (50, 500), vocab: int = 1000):
    """A realistic-shape group for the bench: long shared prefix, many append-only turns, no rewrites."""
    return make_group(rng, group_id=group_id, sessions=sessions, turns=turns, prefix_len=prefix_len,
                      gen_len=gen_len, tool_len=tool_len, vocab=vocab, p_rewrite=0.0, p_duplicate=0.0,
                      p_trunc=0.0)



def fork_group(rng: np.random.Generator, calls: list[CallRecord], results: list[RolloutResult], *, forks: int = 2,
               children: int = 2, gen_len: tuple[int, int] = (2, 8), tool_len: tuple[int, int] = (1, 6),
               vocab: int = 50) -> tuple[list[CallRecord], list[RolloutResult]]:
    """The group plus forked children, shaped like harness_env/rl/branching.py's: a child of a rollout with n >= 2
    calls replays its calls 0..k-1 exactly (tokens, logprobs, weight version; k uniform in 1..n-1), then makes
    n - k fresh calls starting from the parent's call-k prompt (the state the replay reached); its first fresh
    token differs from the parent's and its siblings', so the tree branches exactly at call k. Rewards random in
    {0, 0.5, 1}."""
    by_rid: dict[str, list[CallRecord]] = {}
    for c in calls:
        by_rid.setdefault(c.rollout_id, []).append(c)
    eligible = sorted(r for r, cs in by_rid.items() if len(cs) >= 2)
    out_c, out_r = list(calls), list(results)
    for parent in rng.permutation(eligible)[:forks].tolist():
        pcs = sorted(by_rid[parent], key=lambda c: c.call_index)
        for j in range(children):
            kid_calls, kid = _child(rng, pcs, int(rng.integers(1, len(pcs))), j, gen_len, tool_len, vocab)
            out_c += kid_calls
            out_r.append(kid)
    return out_c, out_r


def _child(rng: np.random.Generator, pcs: list[CallRecord], k: int, j: int, gen_len: tuple[int, int],
           tool_len: tuple[int, int], vocab: int) -> tuple[list[CallRecord], RolloutResult]:
    """Child j of the rollout whose calls are `pcs`, forked at call k (see `fork_group`)."""
    rid = f"{pcs[0].rollout_id}.f{k}c{j}"
    out = [_as_child(c, rid, i, c.prompt_ids, c.completion_ids, c.logprobs) for i, c in enumerate(pcs[:k])]
    prompt = list(pcs[k].prompt_ids)
    for i in range(k, len(pcs)):
        comp = rng.integers(1, vocab, size=int(rng.integers(*gen_len))).tolist()
        if i == k:
            comp[0] = (pcs[k].completion_ids[0] + j) % (vocab - 1) + 1
        lps = (-rng.random(len(comp)) * 2.0).astype(np.float32).tolist()
        out.append(_as_child(pcs[0], rid, i, prompt, comp, lps))
        prompt = prompt + comp + rng.integers(1, vocab, size=int(rng.integers(*tool_len))).tolist()
    res = RolloutResult(rollout_id=rid, group_id=pcs[0].group_id, harness=pcs[0].harness, status="ok",
                        reward=float(rng.choice([0.0, 0.5, 1.0])), session_ids=[f"{rid}-s"])
    return out, res


def _as_child(src: CallRecord, rid: str, i: int, prompt: list[int], comp: list[int], lps: list[float]) -> CallRecord:
    return CallRecord(rollout_id=rid, session_id=f"{rid}-s", group_id=src.group_id, harness=src.harness,
                      call_index=i, prompt_ids=list(prompt), completion_ids=list(comp), logprobs=list(lps),
                      weight_version=src.weight_version, finish_reason="stop", call_id=f"{rid}-c{i}")
