"""Shim end to end with the official openai / anthropic SDKs as clients and the scripted replay engine."""

import asyncio
import json
import time

import aiohttp
import anthropic
import openai
import pytest

from research.capture import read_log, to_json_bytes
from research.models.tokenizer import load_tokenizer
from research.serving.replay import ReplayEngine, replay_logprob
from research.shim.testing import running_shim

SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
OA_TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command", "parameters": SCHEMA}}]
AN_TOOLS = [{"name": "bash", "description": "run a command", "input_schema": SCHEMA, "cache_control": {"type": "x"}}]
CALL = ('<think>\nlist first\n</think>\n\nLet me look.\n'
        '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>')
CALL2 = ('<tool_call>\n{"name": "bash", "arguments": {"cmd": "pwd"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "bash", "arguments": {"cmd": "id"}}\n</tool_call>')
DONE = "<think>\nok\n</think>\n\nThere are 2 files."


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def prompt_refs(path):
    """Each line's `prompt_ref` (None: the record is written whole)."""
    return [json.loads(ln).get("prompt_ref") for ln in open(path, "rb").read().split(b"\n") if ln]


def calls(path):
    """The records of a log, checking each line is exactly what `to_json_bytes` writes for it: whole, or
    (a call continuing the session's previous one) a reference to that call plus the new tokens."""
    recs = list(read_log(path))
    lines = [ln for ln in open(path, "rb").read().split(b"\n") if ln]
    refs = [None if r is None else tuple(r) for r in prompt_refs(path)]
    assert [to_json_bytes(r, prompt_ref=ref) for r, ref in zip(recs, refs, strict=True)] == lines
    return recs


def assert_append_only(recs):
    """Prompt of call k+1 starts with prompt+completion of call k, token for token."""
    for a, b in zip(recs, recs[1:]):
        full = a.prompt_ids + a.completion_ids
        assert b.prompt_ids[:len(full)] == full
        assert b.parent_call_id == a.call_id and b.prefix_match_len == len(full)
        assert b.meta["retokenized_turns"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_multiturn_tools(tok, tmp_path, stream):
    async def go():
        eng = ReplayEngine([CALL, CALL2, DONE], tok)
        async with running_shim(eng, tok, tmp_path / "log.jsonl") as srv:
            s = await srv.open_session("r1", "g1", "opencode")
            c = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key=s.api_key, max_retries=0)
            msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "what is here?"}]
            finals = []
            for _ in range(3):
                if stream:
                    content, tcs, fr = "", {}, None
                    async for ch in await c.chat.completions.create(model="p", messages=msgs, tools=OA_TOOLS,
                                                                    stream=True):
                        d = ch.choices[0].delta
                        content += d.content or ""
                        for tc in d.tool_calls or []:
                            tcs[tc.index] = {"id": tc.id, "type": "function",
                                             "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
                        fr = ch.choices[0].finish_reason or fr
                    msg = {"role": "assistant", "content": content, "tool_calls": [tcs[i] for i in sorted(tcs)]}
                else:
                    r = await c.chat.completions.create(model="p", messages=msgs, tools=OA_TOOLS)
                    m, fr = r.choices[0].message, r.choices[0].finish_reason
                    msg = {"role": "assistant", "content": m.content or "",
                           "tool_calls": [t.model_dump() for t in m.tool_calls or []]}
                finals.append((fr, msg))
                if not msg["tool_calls"]:
                    del msg["tool_calls"]
                msgs.append(msg)
                for t in msg.get("tool_calls", []):
                    msgs.append({"role": "tool", "tool_call_id": t["id"], "content": "a.txt b.txt"})
            recs = await srv.close_session(s.session_id)
        return finals, recs

    finals, recs = run(go())
    assert [f for f, _ in finals] == ["tool_calls", "tool_calls", "stop"]
    assert finals[0][1]["content"] == "Let me look."
    assert json.loads(finals[0][1]["tool_calls"][0]["function"]["arguments"]) == {"cmd": "ls"}
    assert [json.loads(t["function"]["arguments"])["cmd"] for t in finals[1][1]["tool_calls"]] == ["pwd", "id"]
    assert finals[2][1]["content"] == "There are 2 files."
    on_disk = calls(tmp_path / "log.jsonl")
    assert on_disk == recs and len(recs) == 3
    assert_append_only(recs)
    # an append-only session's later calls are written as the previous call + their new tokens
    assert prompt_refs(tmp_path / "log.jsonl") == [None] + [[a.call_id, b.prefix_match_len]
                                                           for a, b in zip(recs, recs[1:])]
    for r in recs:
        r.validate(vocab_size=tok.vocab_size)
        assert r.logprobs == [replay_logprob(t, i) for i, t in enumerate(r.completion_ids)]
        assert r.completion_ids[-1] == 151645 and r.api == "openai_chat" and r.harness == "opencode"
    assert [r.finish_reason for r in recs] == ["tool_calls", "tool_calls", "stop"]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_messages_multiturn_tools(tok, tmp_path, stream):
    async def go():
        eng = ReplayEngine([CALL, DONE], tok)
        async with running_shim(eng, tok, tmp_path / "log.jsonl") as srv:
            s = await srv.open_session("r1", "g1", "claude-code")
            c = anthropic.AsyncAnthropic(base_url=s.base_url, api_key=s.api_key, max_retries=0)
            system = [{"type": "text", "text": "You are Claude Code."},
                      {"type": "text", "text": "Be careful.", "cache_control": {"type": "ephemeral"}}]
            msgs = [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                                 {"type": "text", "text": "what is here?"}]}]
            extra = {"thinking": {"type": "enabled", "budget_tokens": 1000}, "metadata": {"user_id": "{}"},
                     "extra_body": {"output_config": {"effort": "high"}, "context_management": {"edits": []}}}
            out = []
            for _ in range(2):
                kw = dict(model="claude-x", max_tokens=512, system=system, messages=msgs, tools=AN_TOOLS, **extra)
                if stream:
                    async with c.beta.messages.stream(**kw) as st:
                        kinds = [ev.type async for ev in st]
                        m = await st.get_final_message()
                    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
                else:
                    m = await c.beta.messages.create(**kw)
                out.append(m)
                msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
                tool_ids = [b.id for b in m.content if b.type == "tool_use"]
                if tool_ids:
                    msgs.append({"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": tool_ids[0], "content": [{"type": "text", "text": "a"}]},
                        {"type": "text", "text": "<system-reminder>y</system-reminder>"}]})
            recs = await srv.close_session(s.session_id)
        return out, recs

    out, recs = run(go())
    assert [b.type for b in out[0].content] == ["thinking", "text", "tool_use"]
    assert out[0].content[0].thinking == "list first" and out[0].content[2].input == {"cmd": "ls"}
    assert out[0].stop_reason == "tool_use" and out[1].stop_reason == "end_turn"
    assert out[1].content[-1].text == "There are 2 files."
    assert out[0].usage.input_tokens == len(recs[0].prompt_ids)
    assert_append_only(recs)
    assert recs[1].meta["exact_turns"] == 1 and all(r.api == "anthropic_messages" for r in recs)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses_multiturn(tok, tmp_path, stream):
    async def go():
        eng = ReplayEngine([CALL, DONE], tok)
        async with running_shim(eng, tok, tmp_path / "log.jsonl") as srv:
            s = await srv.open_session("r1", "g1", "codex")
            c = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key=s.api_key, max_retries=0)
            tools = [{"type": "function", "name": "bash", "description": "run", "parameters": SCHEMA, "strict": False},
                     {"type": "web_search"}]
            items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
                     {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "what?"}]}]
            outs, events = [], []
            for _ in range(2):
                kw = dict(model="gpt-x", instructions="You are Codex.", input=items, tools=tools,
                          extra_body={"prompt_cache_key": "abc"})
                if stream:
                    final = None
                    async for ev in await c.responses.create(stream=True, **kw):
                        events.append(ev.type)
                        final = ev.response if ev.type == "response.completed" else final
                    out = final.output
                else:
                    out = (await c.responses.create(**kw)).output
                outs.append(out)
                items += [o.model_dump(exclude_none=True) for o in out]
                items += [{"type": "function_call_output", "call_id": o.call_id, "output": "a b"}
                          for o in out if o.type == "function_call"]
            recs = await srv.close_session(s.session_id)
        return outs, events, recs

    outs, events, recs = run(go())
    assert [o.type for o in outs[0]] == ["reasoning", "message", "function_call"]
    assert outs[0][2].name == "bash" and json.loads(outs[0][2].arguments) == {"cmd": "ls"}
    assert outs[1][-1].content[0].text == "There are 2 files."
    if stream:
        assert events[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                              "response.reasoning_text.delta"]
        for k in ("response.content_part.added", "response.output_text.delta", "response.output_text.done",
                  "response.function_call_arguments.delta", "response.function_call_arguments.done",
                  "response.output_item.done"):
            assert k in events
        assert events[-1] == "response.completed"
    assert_append_only(recs)


def test_sessions_enforced_401_shapes_and_open_mode(tok, tmp_path):
    async def go():
        eng = ReplayEngine(["hi"], tok, cycle=True)
        out = {}
        async with running_shim(eng, tok, tmp_path / "a.jsonl") as srv, aiohttp.ClientSession() as http:
            s = await srv.open_session("r", "g", "h")
            body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
            r = await http.post(f"{s.base_url}/v1/messages", json=body, headers={"x-api-key": "wrong"})
            out["bad_key"] = (r.status, await r.json())
            r = await http.post(f"{srv.url}/s/nope/v1/chat/completions", json=body,
                                headers={"Authorization": "Bearer x"})
            out["unknown"] = (r.status, await r.json())
            r = await http.post(f"{s.base_url}/v1/messages?beta=true", json=body, headers={"x-api-key": s.api_key})
            out["ok"] = r.status
            await srv.close_session(s.session_id)
            r = await http.post(f"{s.base_url}/v1/messages", json=body, headers={"x-api-key": s.api_key})
            out["closed"] = (r.status, await r.json())
            r = await http.head(f"{srv.url}/")
            out["head"] = r.status
            r = await http.get(f"{srv.url}/s/x/v1/models")
            out["models"] = (await r.json())["data"][0]["id"]
            r = await http.get(f"{srv.url}/s/x/v1/models/claude-x")
            out["model"] = (await r.json())["id"]
            r = await http.head(f"{srv.url}/s/x")
            out["head"] = (out["head"], r.status)
        async with running_shim(eng, tok, tmp_path / "b.jsonl", enforce_sessions=False) as srv:
            c = anthropic.AsyncAnthropic(base_url=srv.url, api_key="anything", max_retries=0)
            for sid in ("s1", "s1", "s2"):
                await c.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}],
                                        extra_headers={"X-Claude-Code-Session-Id": sid})
            o = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="k", max_retries=0)
            await o.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            out["open"] = sorted((sid, s.n_calls) for sid, s in srv.sessions.items())
        return out

    out = run(go())
    assert out["bad_key"][0] == 401 and out["bad_key"][1]["type"] == "error"
    assert out["bad_key"][1]["error"]["type"] == "authentication_error"
    assert out["unknown"][0] == 401 and out["unknown"][1]["error"]["code"] == "invalid_api_key"
    assert "unknown" in out["unknown"][1]["error"]["message"]
    assert out["ok"] == 200 and out["closed"][0] == 401 and "closed" in out["closed"][1]["error"]["message"]
    assert out["head"] == (200, 200) and out["models"] == "policy" and out["model"] == "claude-x"
    assert out["open"] == [("open-default", 1), ("open-s1", 2), ("open-s2", 1)]


def test_errors_context_unavailable_malformed(tok, tmp_path):
    async def go():
        eng = ReplayEngine(["ok"], tok, cycle=True, max_context=64)
        out = {}
        async with running_shim(eng, tok, tmp_path / "a.jsonl") as srv, aiohttp.ClientSession() as http:
            s = await srv.open_session("r", "g", "h")
            oa = {"Authorization": f"Bearer {s.api_key}"}
            an = {"x-api-key": s.api_key}
            long = [{"role": "user", "content": "word " * 200}]
            r = await http.post(f"{s.base_url}/v1/chat/completions", json={"messages": long}, headers=oa)
            out["ctx_oa"] = (r.status, (await r.json())["error"])
            r = await http.post(f"{s.base_url}/v1/messages", json={"messages": long, "max_tokens": 9}, headers=an)
            out["ctx_an"] = (r.status, (await r.json())["error"])
            await eng.pause()
            short = [{"role": "user", "content": "x"}]
            r = await http.post(f"{s.base_url}/v1/chat/completions", json={"messages": short}, headers=oa)
            out["busy_oa"] = (r.status, r.headers.get("Retry-After"))
            r = await http.post(f"{s.base_url}/v1/messages", json={"messages": short, "max_tokens": 9}, headers=an)
            out["busy_an"] = (r.status, r.headers.get("Retry-After"), (await r.json())["error"]["type"])
            await eng.resume()
            r = await http.post(f"{s.base_url}/v1/chat/completions", data=b"{oops", headers=oa)
            out["json"] = (r.status, (await r.json())["error"])
            bad = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"x": 1}]}]}
            r = await http.post(f"{s.base_url}/v1/chat/completions", json=bad, headers=oa)
            out["schema"] = (r.status, (await r.json())["error"])
            r = await http.post(f"{s.base_url}/v1/messages", json={"max_tokens": 3}, headers=an)
            out["missing"] = (r.status, (await r.json())["error"]["message"])
            out["records"] = len(srv.sessions[s.session_id].records)
        return out

    out = run(go())
    assert out["ctx_oa"][0] == 400 and out["ctx_oa"][1]["code"] == "context_length_exceeded"
    assert out["ctx_an"][0] == 400 and "prompt is too long" in out["ctx_an"][1]["message"]
    assert out["busy_oa"] == (503, "1") and out["busy_an"] == (529, "1", "overloaded_error")
    assert out["json"][0] == 400 and out["json"][1]["param"] == "body"
    assert out["schema"][0] == 400 and out["schema"][1]["param"] == "messages[1].tool_calls[0].function"
    assert out["missing"] == (400, "messages: required field missing")
    assert out["records"] == 0


@pytest.mark.parametrize("api", ["chat", "anthropic", "responses_nonstream"])
def test_client_disconnect_aborts_and_records(tok, tmp_path, api):
    async def go():
        eng = ReplayEngine(["one two three four five six seven eight nine ten " * 20], tok, delay_s=0.01)
        async with running_shim(eng, tok, tmp_path / "a.jsonl") as srv:
            s = await srv.open_session("r", "g", "h")
            msgs = [{"role": "user", "content": "count"}]
            async with aiohttp.ClientSession() as http:
                if api == "responses_nonstream":  # the client gives up while waiting for the JSON answer
                    post = http.post(f"{s.base_url}/v1/responses", json={"input": "count"},
                                     headers={"Authorization": f"Bearer {s.api_key}"})
                    with pytest.raises(asyncio.TimeoutError):
                        await asyncio.wait_for(post, 0.3)
                    r = None
                elif api == "chat":
                    r = await http.post(f"{s.base_url}/v1/chat/completions", json={"messages": msgs, "stream": True},
                                        headers={"Authorization": f"Bearer {s.api_key}"})
                else:
                    r = await http.post(f"{s.base_url}/v1/messages", headers={"x-api-key": s.api_key},
                                        json={"messages": msgs, "stream": True, "max_tokens": 999})
                if r is not None:
                    await r.content.readany()
                    await asyncio.sleep(0.1)
                    r.close()  # client goes away mid-stream
            sess = srv.sessions[s.session_id]
            for _ in range(100):
                if sess.records:
                    break
                await asyncio.sleep(0.02)
        return sess.records, eng

    recs, eng = run(go())
    assert len(recs) == 1 and recs[0].status == "aborted" and recs[0].finish_reason == "abort"
    assert 0 < len(recs[0].completion_ids) < 200 and eng.aborted == 1
    assert len(recs[0].logprobs) == len(recs[0].completion_ids)
    assert [r.status for r in calls(tmp_path / "a.jsonl")] == ["aborted"]


def test_branch_when_history_rewritten(tok, tmp_path):
    """OpenClaw moves an internal-context message: the call branches off the longest common prefix."""
    async def go():
        eng = ReplayEngine(["A", "B", "C"], tok)
        async with running_shim(eng, tok, tmp_path / "a.jsonl") as srv:
            s = await srv.open_session("r", "g", "openclaw")
            c = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key=s.api_key, max_retries=0)
            sys_, ctx = {"role": "system", "content": "S"}, {"role": "user", "content": "internal context"}
            await c.chat.completions.create(model="m", messages=[sys_, {"role": "user", "content": "q1"}, ctx])
            m2 = [sys_, {"role": "user", "content": "q1"}, {"role": "assistant", "content": "A"},
                  {"role": "user", "content": "q2"}, ctx]
            await c.chat.completions.create(model="m", messages=m2)
            m3 = [sys_, {"role": "user", "content": "q1"}, {"role": "assistant", "content": "A"},
                  {"role": "user", "content": "q2"}, {"role": "assistant", "content": "B"}, ctx]
            await c.chat.completions.create(model="m", messages=m3)
            return srv.sessions[s.session_id].records

    r0, r1, r2 = run(go())
    assert r1.parent_call_id == r0.call_id
    lcp = r1.prefix_match_len
    assert 0 < lcp < len(r0.prompt_ids) and r1.prompt_ids[:lcp] == r0.prompt_ids[:lcp]
    assert r1.prompt_ids[lcp] != (r0.prompt_ids + r0.completion_ids)[lcp]
    # the exact ids of "A" are reused although the context message moved after it
    assert r1.meta["exact_turns"] == 1 and r2.meta["exact_turns"] == 2
    assert r2.parent_call_id == r1.call_id


def test_unix_socket_count_tokens_and_close_inflight(tok, tmp_path):
    """The sandbox path (Unix socket), Anthropic count_tokens, and close_session aborting an in-flight call."""
    sock = str(tmp_path / "shim.sock")

    async def go():
        eng = ReplayEngine(["x " * 400, "hello"], tok, delay_s=0.01)
        async with running_shim(eng, tok, tmp_path / "a.jsonl", unix_socket=sock) as srv:
            s = await srv.open_session("r", "g", "h")
            hdr = {"x-api-key": s.api_key}
            body = {"model": "m", "max_tokens": 999, "messages": [{"role": "user", "content": "hi"}]}
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as http:
                path = f"http://sandbox/s/{s.session_id}/v1/messages"
                async with http.post(path + "/count_tokens", json=body, headers=hdr) as r:
                    counted = (await r.json())["input_tokens"]
                r = await http.post(path, json={**body, "stream": True}, headers=hdr)
                await r.content.readany()
                recs = await srv.close_session(s.session_id)  # the harness is still streaming
                r.close()
        return counted, recs

    counted, recs = run(go())
    assert [r.status for r in recs] == ["aborted"] and counted == len(recs[0].prompt_ids)
    assert [r.status for r in calls(tmp_path / "a.jsonl")] == ["aborted"]


def test_capture_before_final_event_and_malformed_tool_json(tok, tmp_path):
    """The record is on disk when the final stream event arrives; bad tool JSON from the model is text, not a 500."""
    bad = 'Trying.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"\n</tool_call>'

    async def go():
        eng = ReplayEngine([bad, bad], tok)
        async with running_shim(eng, tok, tmp_path / "a.jsonl") as srv:
            s = await srv.open_session("r", "g", "h")
            c = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key=s.api_key, max_retries=0)
            msgs = [{"role": "user", "content": "go"}]
            on_disk_at_finish, content = None, ""
            async for ch in await c.chat.completions.create(model="m", messages=msgs, tools=OA_TOOLS, stream=True):
                content += ch.choices[0].delta.content or ""
                if ch.choices[0].finish_reason:
                    on_disk_at_finish = len(calls(tmp_path / "a.jsonl"))
            a = anthropic.AsyncAnthropic(base_url=s.base_url, api_key=s.api_key, max_retries=0)
            m = await a.messages.create(model="m", max_tokens=99, messages=msgs, tools=AN_TOOLS)
        return on_disk_at_finish, content, m

    on_disk, content, m = run(go())
    assert on_disk == 1
    assert content == 'Trying.<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"\n</tool_call>'
    assert [b.type for b in m.content] == ["text"] and m.stop_reason == "end_turn"


def test_responses_custom_tool_roundtrip(tok, tmp_path):
    """Codex's freeform tools (type "custom", e.g. apply_patch) come back as custom_tool_call items, and the
    turn sent back as custom_tool_call + custom_tool_call_output is reused token for token."""
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    out = '<tool_call>\n{"name": "apply_patch", "arguments": {"input": ' + json.dumps(patch) + '}}\n</tool_call>'

    async def go():
        eng = ReplayEngine([out, "Patched."], tok)
        async with running_shim(eng, tok, tmp_path / "a.jsonl") as srv:
            s = await srv.open_session("r", "g", "codex")
            c = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key=s.api_key, max_retries=0)
            tools = [{"type": "custom", "name": "apply_patch", "description": "edit files",
                      "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}]
            items = [{"role": "user", "content": "add a.txt"}]
            events = []
            async for ev in await c.responses.create(model="m", input=items, tools=tools, stream=True):
                events.append(ev.type)
                if ev.type == "response.completed":
                    first = ev.response.output
            items += [o.model_dump(exclude_none=True) for o in first]
            items.append({"type": "custom_tool_call_output", "call_id": first[0].call_id, "output": "Done!"})
            second = (await c.responses.create(model="m", input=items, tools=tools)).output
            return first, second, events, await srv.close_session(s.session_id)

    first, second, events, recs = run(go())
    assert [o.type for o in first] == ["custom_tool_call"] and first[0].input == patch
    assert "response.custom_tool_call_input.delta" in events
    assert second[0].content[0].text == "Patched."
    assert_append_only(recs)


@pytest.mark.parametrize("delay_s", [0.0, 0.03])
def test_stream_writes_what_the_engine_produced_together_at_once(tok, tmp_path, monkeypatch, delay_s):
    """Token chunks the engine has ready together go out in one write (each write is a syscall and a
    wake-up of the harness); chunks the engine produces apart stream as they come, each before the next."""
    from research.shim import common

    writes = []
    real = common._EventStream.write

    async def counting(self, data):
        writes.append((time.perf_counter(), bytes(data)))
        return await real(self, data)

    monkeypatch.setattr(common._EventStream, "write", counting)

    async def go():
        eng = ReplayEngine(["one two three four five six seven"], tok, chunk_size=1, delay_s=delay_s)
        async with running_shim(eng, tok, tmp_path / "log.jsonl") as srv:
            s = await srv.open_session("r1", "g1", "opencode")
            c = openai.AsyncOpenAI(base_url=s.base_url + "/v1", api_key=s.api_key, max_retries=0)
            text, seen = "", []
            async for ch in await c.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}],
                                                            stream=True):
                text += ch.choices[0].delta.content or "" if ch.choices else ""
                seen.append(time.perf_counter())
            recs = await srv.close_session(s.session_id)
        return text, recs

    text, recs = run(go())
    assert text == "one two three four five six seven" and len(recs) == 1
    n_chunks = len(recs[0].completion_ids)  # the words and the end-of-turn token
    if delay_s == 0:
        assert len(writes) <= 1, len(writes)  # everything but the tail went out in one write (the tail with the eof)
    else:
        # streamed: about a write per engine chunk (a loop stalled past the engine's delay may merge two)
        assert len(writes) >= n_chunks // 2, (len(writes), n_chunks)
        gaps = [b[0] - a[0] for a, b in zip(writes, writes[1:])]
        assert sorted(gaps)[len(gaps) // 2] >= delay_s * 0.5  # and at the engine's pace, not at the end
