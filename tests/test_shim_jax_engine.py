"""Shim + the built-in JAX engine (tiny random Qwen3-MoE with the real Qwen3 vocabulary) + real tokenizer."""

import asyncio

import anthropic
import jax
import openai
import pytest

from research.capture import read_log
from research.models import init_params, tiny_moe
from research.models.tokenizer import load_tokenizer
from research.serving.jax_engine import EngineConfig, JaxEngine
from research.serving.qwen3_runner import Qwen3Runner
from research.shim.session import ShimOptions
from research.shim.testing import running_shim

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_sdk_clients_against_jax_engine(qwen3_tokenizer_dir, tmp_path):
    tok = load_tokenizer(qwen3_tokenizer_dir)
    cfg = tiny_moe(vocab_size=151936)
    engine = JaxEngine(Qwen3Runner(cfg), init_params(cfg, jax.random.PRNGKey(0)),
                       config=EngineConfig(num_slots=2, max_len=384, prefill_chunk=64))
    opts = ShimOptions(sampling_override={"temperature": 1.0, "seed": 0}, default_max_tokens=6)

    async def go():
        async with running_shim(engine, tok, tmp_path / "log.jsonl", options=opts) as srv:
            s = await srv.open_session("r", "g", "opencode")
            c = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key=s.api_key, max_retries=0)
            msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
            for turn in range(3):
                if turn == 1:  # streamed turn
                    content, reasoning = "", ""
                    async for ch in await c.chat.completions.create(model="m", messages=msgs, stream=True):
                        if ch.choices:
                            content += ch.choices[0].delta.content or ""
                            reasoning += getattr(ch.choices[0].delta, "reasoning_content", None) or ""
                    msg = {"role": "assistant", "content": content}
                    if reasoning:
                        msg["reasoning_content"] = reasoning
                else:
                    m = (await c.chat.completions.create(model="m", messages=msgs)).choices[0].message
                    msg = {"role": "assistant", "content": m.content or ""}
                    if getattr(m, "reasoning_content", None):
                        msg["reasoning_content"] = m.reasoning_content
                msgs += [msg, {"role": "user", "content": f"next {turn}"}]
            a = anthropic.AsyncAnthropic(base_url=s.base_url, api_key=s.api_key, max_retries=0)
            async with a.messages.stream(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}]) as st:
                final = await st.get_final_message()
            recs = await srv.close_session(s.session_id)
        await engine.close()
        return recs, final

    recs, final = asyncio.run(asyncio.wait_for(go(), 500))
    assert len(recs) == 4 and final.stop_reason in ("max_tokens", "end_turn")
    for a, b in zip(recs[:2], recs[1:3]):  # append-only turns: token-in, token-out
        full = a.prompt_ids + a.completion_ids
        assert b.prompt_ids[: len(full)] == full and b.parent_call_id == a.call_id
    for r in recs:
        r.validate(vocab_size=151936)
        assert r.routed_experts_shape == (len(r.completion_ids), cfg.num_layers, cfg.num_experts_per_tok)
        assert all(lp <= 0 for lp in r.logprobs)
    assert [r.call_id for r in read_log(tmp_path / "log.jsonl")] == [r.call_id for r in recs]
