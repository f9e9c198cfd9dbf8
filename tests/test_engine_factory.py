"""research/serving/factory.py: every spec kind builds its engine; replay and the tiny JAX engine really
generate; bad specs and bad replay files fail with precise errors. Remote clients are only constructed
(no server is contacted until the first request)."""

import asyncio
import json

import jax
import pytest

from harness_env.eval.run import build_engine as eval_build_engine
from research.models import init_params, tiny_moe
from research.models.hf_io import save_hf
from research.models.tokenizer import load_tokenizer
from research.serving.api import GenerateRequest, SamplingParams
from research.serving.factory import build_engine, known_specs
from research.serving.jax_engine import JaxEngine
from research.serving.openai_client import OpenAICompletionsEngine
from research.serving.replay import ReplayEngine
from research.serving.sglang_client import SGLangClient


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


def _generate(engine, prompt_ids, n, max_new_tokens=8):
    async def go():
        out = [await engine.generate(GenerateRequest(list(prompt_ids), SamplingParams(
            max_new_tokens=max_new_tokens, temperature=1.0, seed=0))) for _ in range(n)]
        await engine.close()
        return out

    return asyncio.run(asyncio.wait_for(go(), 120))


def test_replay_cycles_the_file_through_generate(tok, tmp_path):
    f = tmp_path / "script.json"
    ids = tok.encode("raw ids") + [tok.stop_token_ids[0]]
    f.write_text(json.dumps(["first answer", ids]))
    engine = build_engine(f"replay:{f}", tok, max_context=999)
    assert isinstance(engine, ReplayEngine) and engine.max_context == 999
    outs = _generate(engine, tok.encode("hi"), 3)
    assert [tok.decode(r.token_ids) for r in outs] == ["first answer<|im_end|>", "raw ids<|im_end|>",
                                                       "first answer<|im_end|>"]
    assert outs[1].token_ids == ids and all(r.finish_reason == "stop" for r in outs)
    plain = build_engine("replay", tok)  # no file: one fixed completion, cycled
    assert [tok.decode(r.token_ids) for r in _generate(plain, [1, 2], 2)] == ["(replay engine) ok<|im_end|>"] * 2


@pytest.mark.parametrize("content,needle", [
    (None, "cannot read it"),
    ("[1, 2", "not JSON (Expecting"),
    ("[]", "expected a non-empty JSON list of completions, got list (empty)"),
    ('{"a": 1}', "expected a non-empty JSON list of completions, got dict"),
    ('["ok", 3]', "completion 1 is '3'; expected a string or a list of token ids"),
    ('[["x"]]', "completion 0 is \"['x']\""),
])
def test_bad_replay_files_say_what_is_wrong(tok, tmp_path, content, needle):
    f = tmp_path / "bad.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(ValueError, match="replay file .*bad.json") as e:
        build_engine(f"replay:{f}", tok)
    assert needle in str(e.value)


def test_scripted_engine_sees_the_decoded_prompt(tok):
    engine = build_engine("upper", tok, scripts={"upper": lambda text: text.upper()})
    assert isinstance(engine, ReplayEngine)
    (out,) = _generate(engine, tok.encode("make it loud"), 1)
    assert tok.decode(out.token_ids) == "MAKE IT LOUD<|im_end|>"
    with pytest.raises(ValueError, match="scripted engine 'upper' takes no argument"):
        build_engine("upper:x", tok, scripts={"upper": str.upper})


def test_eval_build_engine_registers_oracle(tok):
    assert isinstance(eval_build_engine("oracle", tok), ReplayEngine)
    with pytest.raises(ValueError, match=r"unknown kind 'nope'.*\| oracle$"):
        eval_build_engine("nope", tok)


@pytest.mark.parametrize("spec,cls", [("sglang:http://127.0.0.1:1", SGLangClient),
                                      ("openai:https://example.invalid/v1", OpenAICompletionsEngine)])
def test_remote_clients_are_built_without_a_server(tok, spec, cls):
    engine = build_engine(spec, tok, max_context=4321)
    assert type(engine) is cls and engine.max_context == 4321
    assert engine.base_url == spec.partition(":")[2].removesuffix("/v1")
    asyncio.run(engine.close())


@pytest.mark.parametrize("spec,needle", [
    ("", "unknown kind ''"),
    ("vllm:http://x", "unknown kind 'vllm'"),
    ("sglang", "sglang:URL needs an http(s) URL, got ''"),
    ("openai:localhost:8000", "openai:URL needs an http(s) URL, got 'localhost:8000'"),
    ("jax:/does/not/exist", "jax:/does/not/exist: neither a preset (tiny_moe, tiny_dense) nor an HF dir"),
])
def test_bad_specs_are_precise(tok, spec, needle):
    with pytest.raises(ValueError) as e:
        build_engine(spec, tok)
    assert needle in str(e.value)
    if "unknown kind" in needle:
        assert str(e.value).endswith(known_specs())
        assert known_specs() == "replay[:FILE] | jax[:HF_DIR|tiny_moe|tiny_dense] | sglang:URL | openai:URL"


def test_jax_checkpoint_with_a_smaller_vocab_is_refused(tok, tmp_path):
    cfg = tiny_moe()  # vocab 128 < Qwen3's
    save_hf(init_params(cfg, jax.random.PRNGKey(0)), cfg, tmp_path / "hf")
    with pytest.raises(ValueError, match=f"model vocab 128 < tokenizer vocab {tok.vocab_size}"):
        build_engine(f"jax:{tmp_path / 'hf'}", tok)


@pytest.mark.timeout(120)
def test_tiny_jax_engine_generates(tok):
    engine = build_engine("jax", tok, max_len=32, num_slots=1)
    assert isinstance(engine, JaxEngine) and engine.runner.cfg.vocab_size == tok.vocab_size
    (out,) = _generate(engine, tok.encode("hello there"), 1, max_new_tokens=4)
    assert len(out.token_ids) == len(out.logprobs) and 1 <= len(out.token_ids) <= 4
    assert all(0 <= t < tok.vocab_size for t in out.token_ids) and all(lp <= 0 for lp in out.logprobs)
