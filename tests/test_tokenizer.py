"""Qwen3 tokenizer + chat template loading: parity with transformers, precise load errors."""

import gzip
import json
import shutil

import pytest

from research.models.tokenizer import Tokenizer, TokenizerLoadError, load_tokenizer

TOOLS = [{"type": "function", "function": {"name": "read", "description": "read a file",
                                           "parameters": {"type": "object", "properties": {"p": {"type": "string"}}}}}]
CONVERSATIONS = [
    ([{"role": "user", "content": "hi"}], None),
    ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2? <b>&'</b> ü"}], None),
    ([{"role": "system", "content": "sys"}, {"role": "user", "content": "read a"},
      {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "read", "arguments": {"p": "a"}}}]},
      {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"},
      {"role": "assistant", "content": "<think>\nok\n</think>\n\nDone"}, {"role": "user", "content": "again"}], TOOLS),
]


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


@pytest.fixture(scope="module")
def plain_dir(qwen3_tokenizer_dir, tmp_path_factory):
    """The packaged files in the layout HF ships them (tokenizer.json uncompressed), for transformers and for
    the tests that remove or break one file."""
    d = tmp_path_factory.mktemp("qwen3_plain")
    (d / "tokenizer.json").write_bytes(gzip.decompress((qwen3_tokenizer_dir / "tokenizer.json.gz").read_bytes()))
    for name in ("tokenizer_config.json", "generation_config.json"):
        shutil.copy(qwen3_tokenizer_dir / name, d / name)
    return d


@pytest.fixture(scope="module")
def hf(plain_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(plain_dir))


def test_plain_and_packaged_layouts_load_the_same(tok, plain_dir):
    other = load_tokenizer(plain_dir)
    text = "<|im_start|>user\nhéllo 🙂 world<|im_end|>\n"
    assert other.encode(text) == tok.encode(text) and other.vocab_size == tok.vocab_size


def test_special_ids_and_roundtrip(tok):
    assert tok.stop_token_ids == (151645, 151643)
    assert tok.eos_token_id == 151645 and tok.vocab_size == 151669
    assert tok.token_to_id("<tool_call>") == 151657 and tok.token_to_id("<think>") == 151667
    text = "<|im_start|>user\nhéllo 🙂 world<|im_end|>\n"
    ids = tok.encode(text)
    assert ids[0] == 151644 and tok.decode(ids) == text


@pytest.mark.parametrize("k", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("thinking", [True, False])
def test_chat_template_matches_transformers(tok, hf, k, thinking):
    msgs, tools = CONVERSATIONS[k]
    ours = tok.apply_chat_template(msgs, tools, add_generation_prompt=True, enable_thinking=thinking)
    theirs = hf.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, enable_thinking=thinking,
                                    tokenize=False)
    assert ours == theirs
    assert tok.encode(ours) == hf.encode(theirs, add_special_tokens=False)


def _copy(src, dst, drop=()):
    dst.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if name not in drop:
            shutil.copy(src / name, dst / name)
    return dst


def test_missing_chat_template_names_file_and_key(plain_dir, tmp_path):
    d = _copy(plain_dir, tmp_path / "tok")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(TokenizerLoadError, match=r"tokenizer_config\.json.*'chat_template'"):
        load_tokenizer(d)
    (d / "chat_template.jinja").write_text("{{ messages[0].content }}")  # newer HF layout is accepted
    assert load_tokenizer(d).apply_chat_template([{"role": "user", "content": "x"}]) == "x"


def test_missing_or_broken_files(plain_dir, tmp_path):
    d = _copy(plain_dir, tmp_path / "a", drop=("tokenizer.json",))
    with pytest.raises(TokenizerLoadError, match=r"a/tokenizer\.json: file missing"):
        Tokenizer.from_dir(d)
    d = _copy(plain_dir, tmp_path / "b")
    (d / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match=r"b/tokenizer_config\.json: not valid JSON"):
        load_tokenizer(d)
    with pytest.raises(TokenizerLoadError, match="not a local directory and the hub download failed"):
        load_tokenizer("no-such-org/no-such-model-xyz")
