"""JAX engine acceptance: engine tokens/logprobs/experts == the model's full forward + the trainer's logprobs.

Tiny fp32 Qwen3-MoE; chunk 16 so prompts cross chunk boundaries; 4 slots so 6 requests queue.
"""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.models import Qwen3, head_weight, init_params, tiny_dense, tiny_moe
from research.models.logprobs import token_logprobs
from research.serving.api import ContextLengthExceeded, EngineUnavailable, GenerateRequest, SamplingParams
from research.serving.jax_engine import EngineConfig, JaxEngine
from research.serving.qwen3_runner import Qwen3Runner

CFG = tiny_moe()
ECFG = EngineConfig(num_slots=4, max_len=96, prefill_chunk=16, decode_buckets=(2, 4))


REF_LEN = 128  # every reference forward is padded to this length: one compilation per model config


_trainer_logprobs = jax.jit(token_logprobs, static_argnames=("chunk_size", "return_entropy", "compute_dtype",
                                                              "temperature"))


def reference(params, cfg, prompt, completion, temperature=1.0):
    """(greedy next tokens, trainer logprobs of `completion`, routed experts) from ONE full forward.

    The trainer's function (`token_logprobs` with the sampling temperature) on the full forward's hidden
    states. Sequences are padded to REF_LEN: padding after a causal sequence cannot change its outputs."""
    seq = prompt + completion
    P, n = len(prompt), len(seq)
    padded = jnp.asarray([seq + [0] * (REF_LEN - n)], jnp.int32)
    hidden, aux = _FORWARDS.setdefault(cfg, jax.jit(
        lambda p, s: Qwen3(cfg).apply({"params": p}, s, jnp.arange(REF_LEN)[None], jnp.ones_like(s),
                                      jnp.full_like(s, REF_LEN - 1), return_routing=True)))(params, padded)
    head = head_weight(params, cfg)
    T = temperature if temperature > 0 else 1.0
    lp, _ = _trainer_logprobs(hidden[:, :-1], head, padded[:, 1:], temperature=T)
    greedy = jnp.argmax(hidden[0] @ head, -1)
    greedy, lp, experts = jax.device_get((greedy, lp[0], aux["routed_experts"][0]))
    return greedy[P - 1 : n - 1], lp[P - 1 : n - 1], experts[P - 1 : n - 1]


_FORWARDS: dict = {}


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def params():
    return jax.jit(lambda k: init_params(CFG, k))(jax.random.PRNGKey(0))


@pytest.fixture(scope="module", params=[True, False], ids=["cpu_kernels", "xla"])
def runner(request):
    """Both decode paths: the CPU kernels CI serves on, and XLA's ops, the path TPUs and GPUs run."""
    if request.param and jax.default_backend() != "cpu":
        pytest.skip("the CPU kernels serve the CPU backend only")
    return Qwen3Runner(CFG, kernels=request.param)


def make_engine(runner, params, **kw):
    return JaxEngine(runner, params, config=EngineConfig(**{**ECFG.__dict__, **kw}))


def prompt_of(n, seed):
    return np.random.default_rng(seed).integers(0, CFG.vocab_size, n).tolist()


def greedy_req(prompt, n=10, **kw):
    return GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=n), return_routed_experts=True, **kw)


def check_against_reference(params, req, res, cfg=CFG):
    greedy, lp, experts = reference(params, cfg, req.prompt_ids, res.token_ids, req.sampling.temperature)
    np.testing.assert_allclose(res.logprobs, lp, atol=1e-5, rtol=0)
    if req.sampling.temperature <= 0:
        np.testing.assert_array_equal(res.token_ids, greedy)
    if res.routed_experts is not None:
        np.testing.assert_array_equal(res.routed_experts, experts)


def test_greedy_logprobs_experts_match_full_forward_alone(runner, params):
    async def go():
        eng = make_engine(runner, params)
        try:
            req = greedy_req(prompt_of(21, 1), n=12)
            chunks, res = [], None
            async for item in eng.stream(req):
                chunks.append(item)
            res = chunks.pop()
            assert [t for c in chunks for t in c.token_ids] == res.token_ids
            assert all(len(c.token_ids) == len(c.logprobs) == 1 for c in chunks)  # streamed token by token
            return req, res
        finally:
            await eng.close()

    req, res = run(go())
    assert res.finish_reason == "length" and len(res.token_ids) == 12 and res.weight_version == 0
    assert res.routed_experts.shape == (12, CFG.num_layers, CFG.num_experts_per_tok)
    assert res.prompt_tokens == 21
    check_against_reference(params, req, res)


def test_batched_requests_match_full_forward_and_solo_runs(runner, params):
    """6 concurrent requests on 4 slots (queueing, joins/leaves mid-batch), greedy and sampled."""
    reqs = [greedy_req(prompt_of(n, 10 + i), n=8 + i) for i, n in enumerate((3, 17, 33, 40))]
    reqs += [GenerateRequest(prompt_of(n, 20 + i), SamplingParams(temperature=t, top_p=p, top_k=k, seed=100 + i,
                                                                   max_new_tokens=9))
             for i, (n, t, p, k) in enumerate(((5, 0.7, 0.9, -1), (26, 1.3, 1.0, 7)))]

    async def go():
        eng = make_engine(runner, params)
        try:
            batched = await asyncio.gather(*(eng.generate(r) for r in reqs))
            solo = [await eng.generate(r) for r in (reqs[1], reqs[4])]
            return batched, solo, eng
        finally:
            await eng.close()

    batched, solo, eng = run(go())
    for req, res in zip(reqs, batched):
        check_against_reference(params, req, res)
    assert solo[0].token_ids == batched[1].token_ids and solo[0].logprobs == pytest.approx(batched[1].logprobs,
                                                                                             abs=1e-5)
    assert solo[1].token_ids == batched[4].token_ids  # same seed -> same sample, whatever the batch
    # Compiled once per shape, whatever joined or left.
    assert eng._fns.decode._cache_size() == 2 and eng._fns.prefill._cache_size() == 1


def test_stop_token_is_included_and_ends_generation(runner, params):
    prompt = prompt_of(9, 3)
    greedy, _, _ = reference(params, CFG, prompt, [0] * 0 + [], 0.0)

    async def go():
        eng = make_engine(runner, params)
        try:
            free = await eng.generate(greedy_req(prompt, n=6))
            stop_tok = free.token_ids[3]
            req = GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(stop_tok,)))
            return free, await eng.generate(req), stop_tok
        finally:
            await eng.close()

    free, res, stop_tok = run(go())
    first = free.token_ids.index(stop_tok)
    assert res.finish_reason == "stop" and res.token_ids == free.token_ids[: first + 1]
    assert res.token_ids[-1] == stop_tok and len(res.logprobs) == len(res.token_ids)


def test_prefix_reuse_across_turns_and_between_slots(runner, params):
    async def go():
        eng = make_engine(runner, params)
        try:
            p1 = prompt_of(30, 5)
            r1 = await eng.generate(greedy_req(p1, n=6, session_id="a"))
            turn2 = greedy_req(p1 + r1.token_ids + prompt_of(7, 6), n=6, session_id="a")
            before = eng.stats["reused_tokens"]
            r2 = await eng.generate(turn2)
            reused_turn2 = eng.stats["reused_tokens"] - before
            # Two prompts sharing a 40-token prefix arrive together: b copies a's row, after a's prefill (b
            # waits for it) or while a decodes its 20 tokens (streaming a first and only then sending b raced
            # a's end on a fast machine: b then reused a's parked slot, no copy).
            shared = prompt_of(40, 7)
            a = greedy_req(shared + [1, 2], n=20)
            b = greedy_req(shared + [3], n=5)
            ra, rb = await asyncio.gather(eng.generate(a), eng.generate(b))
            return turn2, r2, reused_turn2, (a, ra), (b, rb), eng.stats
        finally:
            await eng.close()

    turn2, r2, reused, (a, ra), (b, rb), stats = run(go())
    assert reused == 30 + 6 - 1  # prompt + completion minus the never-fed last token
    assert stats["slot_copies"] >= 1
    for req, res in ((turn2, r2), (a, ra), (b, rb)):
        check_against_reference(params, req, res)


def test_weight_update_drain_abort_and_versions(runner, params):
    new_params = jax.jit(lambda k: init_params(CFG, k))(jax.random.PRNGKey(1))
    prompt = prompt_of(12, 8)

    async def go():
        eng = make_engine(runner, params)
        try:
            old = await eng.generate(greedy_req(prompt, n=8))
            # drain: the in-flight request finishes on version 0, queued work then runs on version 1
            inflight = asyncio.ensure_future(eng.generate(greedy_req(prompt, n=30)))
            await asyncio.sleep(0.05)
            await eng.update_weights(new_params, 1)
            r_old = await inflight
            new = await eng.generate(greedy_req(prompt, n=8))
            # abort: an in-flight decode ends at once with what it has, tagged with its version
            stream = eng.stream(greedy_req(prompt, n=60))
            await stream.__anext__()
            await eng.update_weights(params, 2, on_update="abort")
            r_abort = [x async for x in stream][-1]
            back = await eng.generate(greedy_req(prompt, n=8))
            # weight swaps never recompile the step functions
            assert eng._fns.decode._cache_size() == 2 and eng._fns.prefill._cache_size() == 1
            return old, r_old, new, r_abort, back, eng.weight_version
        finally:
            await eng.close()

    old, r_old, new, r_abort, back, version = run(go())
    assert (old.weight_version, r_old.weight_version, new.weight_version, back.weight_version) == (0, 0, 1, 2)
    assert r_old.finish_reason == "length" and len(r_old.token_ids) == 30
    assert new.token_ids != old.token_ids
    assert back.token_ids == old.token_ids  # version 2 has the version-0 weights again
    assert r_abort.finish_reason == "abort" and r_abort.weight_version == 1 and 1 <= len(r_abort.token_ids) < 60
    assert version == 2
    check_against_reference(new_params, greedy_req(prompt, n=8), new)
    check_against_reference(params, greedy_req(prompt, n=30), r_old)


def test_pause_resume_cancel_and_context_errors(runner, params):
    async def go():
        eng = make_engine(runner, params)
        try:
            await eng.pause()
            with pytest.raises(EngineUnavailable):
                await eng.generate(greedy_req([1, 2, 3]))
            await eng.resume()
            assert (await eng.generate(greedy_req([1, 2, 3], n=2))).finish_reason == "length"
            # a consumer that goes away frees its slot
            stream = eng.stream(greedy_req(prompt_of(5, 9), n=80))
            await stream.__anext__()
            await stream.aclose()
            for _ in range(100):
                if not eng._active:
                    break
                await asyncio.sleep(0.01)
            assert not eng._active
            with pytest.raises(ContextLengthExceeded):
                await eng.generate(greedy_req(prompt_of(96, 1)))
            with pytest.raises(ValueError, match="outside vocab"):
                await eng.generate(greedy_req([CFG.vocab_size]))
            with pytest.raises(ValueError, match="top_p"):
                await eng.generate(GenerateRequest([1], SamplingParams(top_p=0.0)))
            clamped = await eng.generate(greedy_req(prompt_of(90, 2), n=50))
            return clamped
        finally:
            await eng.close()

    clamped = run(go())
    assert clamped.finish_reason == "length" and len(clamped.token_ids) == 96 - 90


def test_dense_tied_model_matches_full_forward():
    cfg = tiny_dense()
    params = jax.jit(lambda k: init_params(cfg, k))(jax.random.PRNGKey(2))
    req = GenerateRequest(prompt_of(19, 4), SamplingParams(temperature=0.9, seed=1, max_new_tokens=10),
                          return_routed_experts=True)

    async def go():
        eng = JaxEngine(Qwen3Runner(cfg), params, config=ECFG)
        try:
            return await eng.generate(req)
        finally:
            await eng.close()

    res = run(go())
    assert res.routed_experts is None
    check_against_reference(params, req, res, cfg)


def test_group_sharing_a_long_prompt_prefills_it_once(runner, params):
    """GRPO-style: 3 samples of one 40-token prompt arrive together; later ones wait and copy the slot."""
    shared = prompt_of(40, 11)
    reqs = [greedy_req(shared + [7 + i], n=5) for i in range(3)]

    async def go():
        eng = make_engine(runner, params)
        try:
            await eng.flush_cache()
            before = dict(eng.stats)
            results = await asyncio.gather(*(eng.generate(r) for r in reqs))
            return results, {k: eng.stats[k] - before.get(k, 0) for k in eng.stats}
        finally:
            await eng.close()

    results, stats = run(go())
    assert stats["slot_copies"] == 2
    assert stats["prefill_tokens"] == 41 + 2 * 1  # the prompt once, then one suffix token per copy
    for req, res in zip(reqs, results):
        check_against_reference(params, req, res)


def test_length_buckets_block_edges_host_stops_and_no_recompiles(params):
    """Sequences crossing a length bucket mid-generation, 3-step blocks, a stop id only the host checks
    (max_stop_tokens=1), T=0.7 sampling: all == the full forward / the trainer's logprobs at T=0.7. With
    warmup_all every shape is compiled at start (one per batch x length bucket): serving compiles nothing."""
    cfg = dict(length_buckets=(32, 96), decode_steps=3, prefill_decode_steps=1, max_stop_tokens=1, warmup_all=True)
    prompt = prompt_of(5, 31)

    async def go():
        eng = make_engine(Qwen3Runner(CFG), params, **cfg)  # its own runner: its own compilation caches
        try:
            free = await eng.generate(greedy_req(prompt, n=12))
            sizes = {k: getattr(eng._fns, k)._cache_size() for k in ("prepare", "prefill", "decode", "copy_slot")}
            stop = free.token_ids[7]
            first = [
                greedy_req(prompt_of(20, 32), n=30),  # decodes from bucket 32 into bucket 96
                GenerateRequest(prompt_of(40, 33), SamplingParams(temperature=0.7, seed=5, max_new_tokens=13),
                                return_routed_experts=True),  # prefill chunks at starts 0 and 16 (bucket 32), 32 (96)
                GenerateRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=12,
                                                       stop_token_ids=(CFG.vocab_size - 1, stop))),
            ]
            r1 = await asyncio.gather(*(eng.generate(r) for r in first))
            shared = prompt_of(40, 34)  # two requests sharing a prefix: the second reuses the first's cache
            second = [greedy_req(prompt_of(n, 40 + n), n=m) for n, m in ((3, 40), (29, 9), (50, 20), (11, 2))]
            second += [greedy_req(shared + [1], n=4), greedy_req(shared + [2], n=4)]
            r2 = await asyncio.gather(*(eng.generate(r) for r in second))
            return free, stop, first + second, r1 + r2, sizes, eng._fns.compiled(), eng.stats["reused_tokens"]
        finally:
            await eng.close()

    free, stop, reqs, results, sizes, compiled_after, reused = run(go())
    assert sizes == {"prepare": 1, "prefill": 2, "decode": 4, "copy_slot": 1}  # 2 length x 2 batch buckets
    assert compiled_after == sum(sizes.values()) and reused >= 40
    for req, res in zip(reqs, results):
        check_against_reference(params, req, res)
    stopped = results[2]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: free.token_ids.index(stop) + 1]
    assert results[0].finish_reason == results[1].finish_reason == "length"
