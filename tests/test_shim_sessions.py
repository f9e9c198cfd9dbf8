"""Session state stays bounded: open-mode sessions expire (idle timeout, LRU cap, explicit close),
and parent lookup costs O(prompt) however many calls the session made (a prefix trie)."""

import asyncio
import gc
import json
import time
import weakref

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.capture import read_log
from research.models.tokenizer import load_tokenizer
from research.serving.replay import ReplayEngine
from research.shim.prefix import PrefixIndex
from research.shim.testing import raw_http, running_shim

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


def brute_parent(seqs: list[tuple[str, list[int]]], prompt: list[int]):
    best_id, best = None, 0
    for cid, seq in seqs:  # later inserts win ties
        n = 0
        while n < min(len(seq), len(prompt)) and seq[n] == prompt[n]:
            n += 1
        if n >= best and n > 0:
            best_id, best = cid, n
    return (best_id, best) if best_id else (None, None)


SEQ = st.lists(st.integers(0, 3), max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(SEQ, max_size=12), st.lists(SEQ, min_size=1, max_size=6))
def test_prefix_index_equals_brute_force(seqs, prompts):
    idx, inserted = PrefixIndex(), []
    for i, seq in enumerate(seqs):
        idx.insert(seq, f"c{i}")
        inserted.append((f"c{i}", seq))
        for p in prompts:
            assert idx.lookup(p) == brute_parent(inserted, p), (inserted, p)
    assert idx.tokens <= sum(map(len, seqs))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), SEQ), min_size=1, max_size=14), st.lists(SEQ, min_size=1, max_size=6))
def test_prefix_index_extend_last_equals_insert(steps, prompts):
    """Each new sequence is some earlier one's first k tokens + new ones (an agent session continuing,
    retrying or branching), inserted as the shim does: `extend_last` from the parent `lookup` found, else
    `insert`. Lookups then answer as brute force, as after plain inserts (the end checks the fast path itself)."""
    idx, inserted = PrefixIndex(), []
    for i, (k, new) in enumerate(steps):
        base = inserted[-1 - k % len(inserted)][1] if inserted else []
        seq = base[: len(base) - k // 2 if k % 3 else len(base)] + new
        if not seq:
            continue
        parent, n = idx.lookup(seq)
        if n is None or not idx.extend_last(f"c{i}", parent, n, seq):
            idx.insert(seq, f"c{i}")
        inserted.append((f"c{i}", seq))
        for p in prompts + [s for _, s in inserted]:
            assert idx.lookup(p) == brute_parent(inserted, p), (inserted, p)
    assert idx.tokens <= sum(len(s) for _, s in inserted)
    chain = PrefixIndex()
    chain.insert([1, 2], "a0")
    assert chain.extend_last("a1", "a0", 2, [1, 2], [3]) and chain.lookup([1, 2, 3, 4]) == ("a1", 3)
    assert not chain.extend_last("a2", "a0", 2, [1, 2, 9])  # a0 is no longer the last sequence


def test_parent_lookup_does_not_grow_with_the_session():
    """3000 calls branching off one 4000-token history (the same request retried, an agent rewriting
    its last turn): a lookup costs the same after 50 and after 3000 of them, and the trie stores the
    shared history once."""
    base = list(range(1000, 5000))
    idx = PrefixIndex()

    def lookup_s() -> float:
        prompt = base + [7, 8, 9]
        best = float("inf")
        for _ in range(30):
            t0 = time.perf_counter()
            idx.lookup(prompt)
            best = min(best, time.perf_counter() - t0)
        return best

    for i in range(3000):
        idx.insert(base + [i, i + 1, i + 2], f"c{i}")
        if i == 49:
            early = lookup_s()
    late = lookup_s()
    assert idx.lookup(base + [7, 8, 9]) == ("c7", len(base) + 3)
    assert idx.lookup(base + [-1]) == ("c2999", len(base))  # ties: the latest
    assert late < 3 * early + 50e-6, (early, late)
    assert idx.tokens == len(base) + 3 * 3000  # the shared history once
    chain, seq = PrefixIndex(), list(base)
    for i in range(200):  # an append-only session: one edge that grows, not a node per call
        seq = seq + [i, i + 1]
        chain.insert(seq, f"a{i}")
    leaf = chain._root.children[base[0]]
    assert not leaf.children and leaf.run == seq and chain.lookup(seq[:-1] + [-5]) == ("a199", len(seq) - 1)


def _chat(sid_header: str, text: str = "hi", stream: bool = False, max_tokens: int = 50) -> tuple[bytes, dict]:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "stream": stream}
    return json.dumps(body).encode(), {"x-session-id": sid_header}


def test_open_mode_sessions_expire_lru_idle_and_close(tok, tmp_path):
    async def go():
        eng = ReplayEngine(["fine"], tok, cycle=True)
        out = {}
        async with running_shim(eng, tok, tmp_path / "log.jsonl", enforce_sessions=False, open_max_sessions=3,
                                open_idle_s=0.5) as srv:
            h, p = srv.host, srv.port
            for name in ("a", "a", "b", "c", "d", "a"):  # "a" was least recently used when "d" arrived
                body, hdr = _chat(name)
                assert (await raw_http(h, p, "POST", CHAT, body, headers=hdr))[0] == 200
            out["after_lru"] = sorted(srv.sessions)
            ref = weakref.ref(srv.sessions["open-c"])
            await asyncio.sleep(0.6)
            body, hdr = _chat("e")
            await raw_http(h, p, "POST", CHAT, body, headers=hdr)
            out["after_idle"] = sorted(srv.sessions)
            gc.collect()
            out["freed"] = ref() is None
            out["delete"] = await raw_http(h, p, "DELETE", "/s/open-e")
            out["delete_again"] = await raw_http(h, p, "DELETE", "/s/open-e")
            out["left"] = sorted(srv.sessions)
            out["closed_kept"] = len(srv._closed)
        return out

    out = asyncio.run(asyncio.wait_for(go(), 60))
    assert out["after_lru"] == ["open-a", "open-c", "open-d"]  # b evicted (LRU), a came back
    assert out["after_idle"] == ["open-e"] and out["freed"]
    assert out["delete"][0] == 200 and json.loads(out["delete"][2])["calls"] == 1
    assert out["delete_again"][0] == 404 and json.loads(out["delete_again"][2])["error"]["code"] == "unknown_url"
    assert out["left"] == [] and out["closed_kept"] == 5
    recs = list(read_log(tmp_path / "log.jsonl"))
    by_session = {}
    for r in recs:
        by_session.setdefault(r.session_id, []).append(r.call_index)
    # "a" expired after two calls and came back: its numbering continues, (session, index) stays unique
    assert by_session == {"open-a": [0, 1, 2], "open-b": [0], "open-c": [0], "open-d": [0], "open-e": [0]}


def test_busy_sessions_are_not_evicted_and_many_sessions_stay_bounded(tok, tmp_path):
    async def go():
        eng = ReplayEngine(["x " * 1000, "ok"], tok, cycle=True, delay_s=0.002)
        async with running_shim(eng, tok, tmp_path / "log.jsonl", enforce_sessions=False, open_max_sessions=4,
                                open_idle_s=3600) as srv:
            h, p = srv.host, srv.port
            body, hdr = _chat("busy", stream=True, max_tokens=2000)
            busy = asyncio.create_task(raw_http(h, p, "POST", CHAT, body, headers=hdr))
            await asyncio.sleep(0.05)
            sizes, busy_checks = [], 0
            for k in range(30):
                body, hdr = _chat(f"s{k}")
                assert (await raw_http(h, p, "POST", CHAT, body, headers=hdr))[0] == 200
                sizes.append(len(srv.sessions))
                if not busy.done():  # least recently used, but mid-call: kept
                    assert "open-busy" in srv.sessions
                    busy_checks += 1
            st, _, data = await busy
        return sizes, busy_checks, st, data

    sizes, busy_checks, st, data = asyncio.run(asyncio.wait_for(go(), 60))
    assert max(sizes) <= 5 and busy_checks >= 5 and st == 200 and b"[DONE]" in data
    statuses = {r.session_id: r.status for r in read_log(tmp_path / "log.jsonl")}
    assert statuses["open-busy"] == "ok" and len(statuses) == 31


def test_serving_raises_the_young_gc_threshold_and_never_lowers_it(tok, tmp_path):
    """The shim's calls hold long token lists that every young collection walks: serving raises the
    young threshold (ShimOptions.gc_young_threshold), leaves a higher one alone, and 0 leaves it."""
    from research.shim.session import ShimOptions

    saved = gc.get_threshold()

    async def serve(opts: ShimOptions) -> None:
        async with running_shim(ReplayEngine(["ok"], tok, cycle=True), tok, tmp_path / "l.jsonl", options=opts):
            pass

    try:
        gc.set_threshold(700, *saved[1:])
        asyncio.run(serve(ShimOptions(gc_young_threshold=0)))
        assert gc.get_threshold()[0] == 700
        asyncio.run(serve(ShimOptions()))
        assert gc.get_threshold() == (ShimOptions().gc_young_threshold, *saved[1:])
        gc.set_threshold(50_000, *saved[1:])
        asyncio.run(serve(ShimOptions(gc_young_threshold=20_000)))
        assert gc.get_threshold()[0] == 50_000
    finally:
        gc.set_threshold(*saved)
