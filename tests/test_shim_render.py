"""Qwen3 rendering (== the jinja template), segment-wise tokenization (== full), output parsing."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from research.models.tokenizer import load_tokenizer
from research.shim.parse import OutputParser, collect
from research.shim.render import GeneratedTurn, Message, SessionRenderer, ToolCall, generation_prompt, render_segments

SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run <cmd> & see", "parameters": SCHEMA}}]


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


def as_hf(m: Message) -> dict:
    d = {"role": m.role, "content": m.content}
    if m.reasoning is not None:
        d["reasoning_content"] = m.reasoning
    if m.tool_calls:
        d["tool_calls"] = [{"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                           for t in m.tool_calls]
    return d


CONVS = [
    [Message("user", "hi")],
    [Message("system", "sys"), Message("user", "do it")],
    [Message("system", "sys"), Message("user", "ls"),
     Message("assistant", "Sure.", "I should list", [ToolCall("c1", "bash", '{"cmd": "ls"}')]),
     Message("tool", "a\nb"), Message("tool", "c"),
     Message("assistant", "", None, [ToolCall("c2", "bash", {"cmd": "cat a"}), ToolCall("c3", "bash", {"cmd": "x"})]),
     Message("tool", "<tool_response>x</tool_response>"),
     Message("assistant", "<think>\nmm\n</think>\n\nall done"),
     Message("user", "thanks"), Message("assistant", "np"), Message("system", "late system note"),
     Message("user", "bye")],
    [Message("user", "q"), Message("assistant", "a1", "r1"), Message("user", "<tool_response>t</tool_response>"),
     Message("assistant", "a2", "r2")],
]


@pytest.mark.parametrize("k", range(len(CONVS)))
@pytest.mark.parametrize("tools", [[], TOOLS])
@pytest.mark.parametrize("thinking", [True, False])
def test_segments_equal_chat_template(tok, k, tools, thinking):
    msgs = CONVS[k]
    text = "".join(s for s, _ in render_segments(msgs, tools)) + generation_prompt(thinking)
    ref = tok.apply_chat_template([as_hf(m) for m in msgs], tools or None, add_generation_prompt=True,
                                  enable_thinking=thinking)
    assert text == ref
    r = SessionRenderer(tok)
    p = r.build(msgs, tools, enable_thinking=thinking)
    assert p.ids == tok.encode(ref)  # segment-wise tokenization == whole-string tokenization
    assert p.tokenized_tokens == len(p.ids)
    again = r.build(msgs, tools, enable_thinking=thinking)
    assert again.ids == p.ids and again.tokenized_tokens == 0  # fully cached: cost ~ new tokens only


TEXT = st.lists(st.sampled_from(list("ab \n<>{}\"'é🙂/|_") + ["<|im_end|>", "<think>", " the"]),
                max_size=12).map("".join)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool", "system"]), TEXT, TEXT), min_size=1,
                max_size=6))
def test_segment_tokenization_is_exact_fuzz(tok, turns):
    msgs = [Message(role, c, (r or None) if role == "assistant" else None) for role, c, r in turns]
    text = "".join(s for s, _ in render_segments(msgs, TOOLS)) + generation_prompt(True)
    assert SessionRenderer(tok).build(msgs, TOOLS, enable_thinking=True).ids == tok.encode(text)


MSG = st.tuples(st.sampled_from(["user", "assistant", "tool", "system", "wrapped"]), TEXT)
OP = st.one_of(st.tuples(st.just("append"), st.lists(MSG, min_size=1, max_size=3)),
               st.tuples(st.just("replace"), st.integers(0, 12), MSG),
               st.tuples(st.just("copy"), st.integers(0, 12)),  # same content, a new object
               st.tuples(st.just("truncate"), st.integers(0, 12)),
               st.tuples(st.just("tools"), st.booleans()))


def _msg(role, text):
    if role == "wrapped":  # a user turn that is a tool response: moves the template's last-query point
        return Message("user", f"<tool_response>{text}</tool_response>")
    return Message(role, text, (text[::-1] or None) if role == "assistant" else None)


@settings(max_examples=60, deadline=None)
@given(st.lists(MSG, min_size=1, max_size=5), st.lists(OP, min_size=1, max_size=8))
def test_incremental_prompt_equals_a_fresh_build(tok, first, ops):
    """A session renderer reusing its previous prompt (append, rewrite, copies, truncation, tool
    changes, last-query moves) builds exactly what a fresh build of the same request builds."""
    r, msgs, tools = SessionRenderer(tok), [_msg(*m) for m in first], TOOLS
    for op in [("noop",)] + ops:
        if op[0] == "append":
            msgs = msgs + [_msg(*m) for m in op[1]]
        elif op[0] == "replace" and msgs:
            msgs = msgs[:op[1] % len(msgs)] + [_msg(*op[2])] + msgs[op[1] % len(msgs) + 1:]
        elif op[0] == "copy" and msgs:
            i = op[1] % len(msgs)
            m = msgs[i]
            msgs = msgs[:i] + [Message(m.role, m.content, m.reasoning)] + msgs[i + 1:]
        elif op[0] == "truncate":
            msgs = msgs[:max(1, op[1])]
        elif op[0] == "tools":
            tools = TOOLS if op[1] else []
        got = r.build(msgs, tools, enable_thinking=True)
        fresh = SessionRenderer(tok).build(msgs, tools, enable_thinking=True)
        text = "".join(s for s, _ in render_segments(msgs, tools)) + generation_prompt(True)
        assert got.ids == fresh.ids == tok.encode(text)
        assert got.retokenized_turns == fresh.retokenized_turns and got.head_ids == fresh.head_ids


U, T = Message("user", "q"), Message("tool", "out")
A_R, A = Message("assistant", "ans", "why"), Message("assistant", "ans")


@pytest.mark.parametrize("before, added", [
    ([U, A_R, T], [Message("user", "next q")]),  # the last query moves past a turn with reasoning
    ([U, A], [T]),  # the last assistant turn is no longer last (its empty think block goes)
    ([U, A, T], [Message("tool", "more")]),  # the tool-response group grows
    ([Message("system", "s"), U, A_R], [Message("user", "<tool_response>x</tool_response>")]),
    ([U, A_R, Message("user", "<tool_response>x</tool_response>"), A_R], [Message("user", "real")]),
])
def test_incremental_prompt_context_changes(tok, before, added):
    r = SessionRenderer(tok)
    r.build(before, TOOLS, enable_thinking=True)
    got = r.build(before + added, TOOLS, enable_thinking=True)
    assert got.ids == SessionRenderer(tok).build(before + added, TOOLS, enable_thinking=True).ids
    assert r.build(before + added, [], enable_thinking=True).ids == SessionRenderer(tok).build(
        before + added, [], enable_thinking=True).ids  # tools changed: nothing of the header is reused


def test_incremental_prompt_keeps_generated_turns_and_costs_new_messages(tok):
    """An agent loop: each request resends the history (same Message objects) plus the reply and a
    tool result; the prompt extends the previous one token for token and only new text is tokenized."""
    r = SessionRenderer(tok)
    msgs = [Message("system", "sys"), Message("user", "go")]
    prev = r.build(msgs, TOOLS, enable_thinking=True)
    for k in range(4):
        completion = tok.encode(f"step {k}") + [151645]
        r.remember(((f"step {k}", "", ()), (f"step {k}", None, ())), GeneratedTurn(f"c{k}", prev.head_ids, completion))
        new = [Message("assistant", f"step {k}"), Message("tool", f"out {k}")]
        msgs = msgs + new
        p = r.build(msgs, TOOLS, enable_thinking=True)
        assert p.ids[:len(prev.ids) + len(completion)] == prev.ids + completion
        assert p.exact_turns == k + 1 and p.exact_call_ids == [f"c{i}" for i in range(k + 1)]
        tool_seg = f"<|im_start|>user\n<tool_response>\nout {k}\n</tool_response><|im_end|>\n"
        assert p.tokenized_tokens == len(tok.encode(tool_seg))  # the cached generation prompt is free
        assert r._memo.segs[-1].end == len(msgs) - 1
        prev = p


def test_generated_turn_is_put_back_as_exact_ids(tok):
    r = SessionRenderer(tok)
    msgs = [Message("user", "hi")]
    p0 = r.build(msgs, TOOLS, enable_thinking=True)
    # ids a tokenizer would never produce from the text: "Hel"+"lo" instead of "Hello"
    completion = tok.encode("<think>\nx\n</think>\n\n") + tok.encode("Hel") + tok.encode("lo") + [151645]
    r.remember((("Hello", "x", ()), ("Hello", None, ())), GeneratedTurn("c0", p0.head_ids, completion))
    p1 = r.build(msgs + [Message("assistant", "Hello", "x"), Message("user", "more")], TOOLS, enable_thinking=True)
    assert p1.ids[:len(p0.ids) + len(completion)] == p0.ids + completion
    assert p1.exact_turns == 1 and p1.retokenized_turns == 0 and p1.exact_call_ids == ["c0"]
    # the harness dropped the reasoning: still recognised (reasoning-agnostic key)
    p2 = r.build(msgs + [Message("assistant", "Hello"), Message("user", "more")], TOOLS, enable_thinking=True)
    assert p2.ids == p1.ids
    # the harness edited the text: rendered from the template and counted as re-tokenized
    p3 = r.build(msgs + [Message("assistant", "Hello!"), Message("user", "more")], TOOLS, enable_thinking=True)
    assert p3.exact_turns == 0 and p3.retokenized_turns == 1


def _parse(tok, ids, one_by_one):
    p = OutputParser(tok)
    evs = []
    if one_by_one:
        for t in ids:
            evs += p.feed([t])
    else:
        evs += p.feed(ids)
    return collect(evs + p.finish())


@pytest.mark.parametrize("one_by_one", [True, False])
def test_parser_text_reasoning_tools(tok, one_by_one):
    out = ('<think>\nI will run ü🙂\n</think>\n\nRunning.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}'
           '\n</tool_call>\n<tool_call>\n{"name": "bash", "arguments": "{\\"cmd\\": \\"pwd\\"}"}\n</tool_call>'
           '\n<tool_call>\n{"name": bash}\n</tool_call><|im_end|>')
    res = _parse(tok, tok.encode(out), one_by_one)
    assert res.reasoning == "I will run ü🙂"
    assert res.content == 'Running.<tool_call>\n{"name": bash}\n</tool_call>'  # malformed call stays text
    assert [(c.name, c.arguments) for c in res.tool_calls] == [("bash", {"cmd": "ls"}), ("bash", {"cmd": "pwd"})]


def test_parser_truncated_tool_call_is_text(tok):
    res = _parse(tok, tok.encode('ok\n<tool_call>\n{"name": "bash", "argu'), True)
    assert res.content == 'ok<tool_call>\n{"name": "bash", "argu' and res.tool_calls == []
    p = OutputParser(tok, parse_tools=False)  # tool_choice "none": tags are plain text
    evs = p.feed(tok.encode('<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>')) + p.finish()
    assert collect(evs).tool_calls == [] and json.loads(collect(evs).content.split("\n")[1]) == {
        "name": "bash", "arguments": {}}
