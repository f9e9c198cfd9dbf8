"""The policy's tokenizer and chat template (Qwen3): the packaged copy, a local dir, or a hub name.

The real Qwen3 tokenizer ships with the package (`assets/qwen3/`, Apache-2.0; tokenizer.json gzipped), so
`load_tokenizer()` works offline anywhere: the demo and the tests never depend on a download.

Why not `transformers.AutoTokenizer`: the shim tokenizes on the serving hot path and needs only the
fast `tokenizers` core plus the jinja chat template; importing transformers costs seconds and pulls
torch. The jinja environment mirrors the one transformers uses for chat templates (`tojson` without
HTML escaping or key sorting, `raise_exception`, `strftime_now`) so rendered prompts are byte-equal
to `AutoTokenizer.apply_chat_template`.

Every load failure names the file and the key that is missing or broken.
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import jinja2
import jinja2.sandbox
import tokenizers

TOKENIZER_FILE = "tokenizer.json"
PACKAGED_QWEN3 = pathlib.Path(__file__).resolve().parent / "assets" / "qwen3"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"


class TokenizerLoadError(ValueError):
    """A tokenizer directory is incomplete or broken; the message names the file and the key."""


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _read_json(path: pathlib.Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TokenizerLoadError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _find_template(directory: pathlib.Path, config: dict) -> str:
    tmpl = config.get("chat_template")
    if isinstance(tmpl, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
        tmpl = named.get("default")
        if tmpl is None:
            raise TokenizerLoadError(f"{directory / CONFIG_FILE}: key 'chat_template' is a list without a "
                                     f"'default' entry (names: {sorted(map(str, named))})")
    if isinstance(tmpl, str) and tmpl.strip():
        return tmpl
    if (directory / TEMPLATE_FILE).exists():
        return (directory / TEMPLATE_FILE).read_text()
    raise TokenizerLoadError(f"{directory / CONFIG_FILE}: no chat template: key 'chat_template' is missing "
                             f"and there is no {TEMPLATE_FILE} next to it")


class Tokenizer:
    """Fast tokenizer + chat template. `encode` never adds special tokens: prompts come from the template."""

    def __init__(self, core: tokenizers.Tokenizer, config: dict, chat_template: str, *, source: str = "",
                 generation_config: dict | None = None):
        self.core = core
        self.config = config
        self.source = source
        self.chat_template_source = chat_template
        self._template = compile_chat_template(chat_template)
        self.generation_config = generation_config or {}
        self.eos_token = config.get("eos_token")
        if isinstance(self.eos_token, dict):
            self.eos_token = self.eos_token.get("content")
        self.eos_token_id = self.token_to_id(self.eos_token) if self.eos_token else None
        pad = config.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        self.pad_token_id = self.token_to_id(pad) if pad else None

    @classmethod
    def from_dir(cls, directory: str | os.PathLike) -> Tokenizer:
        directory = pathlib.Path(directory)
        tok_path = directory / TOKENIZER_FILE
        gz_path = tok_path.with_name(TOKENIZER_FILE + ".gz")
        if not tok_path.exists() and not gz_path.exists():
            raise TokenizerLoadError(f"{tok_path}: file missing (need the fast tokenizer JSON, or {gz_path.name})")
        try:
            if tok_path.exists():
                core = tokenizers.Tokenizer.from_file(str(tok_path))
            else:
                core = tokenizers.Tokenizer.from_str(gzip.decompress(gz_path.read_bytes()).decode("utf-8"))
        except Exception as e:  # tokenizers raises a bare Exception subclass with a serde message
            path = tok_path if tok_path.exists() else gz_path
            raise TokenizerLoadError(f"{path}: cannot be parsed by `tokenizers`: {e}") from e
        cfg_path = directory / CONFIG_FILE
        config = _read_json(cfg_path) if cfg_path.exists() else {}
        template = _find_template(directory, config)
        gen_path = directory / GENERATION_CONFIG_FILE
        gen = _read_json(gen_path) if gen_path.exists() else {}
        return cls(core, config, template, source=str(directory), generation_config=gen)

    # ---- ids <-> text -------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.core.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int:
        tid = self.core.token_to_id(token)
        if tid is None:
            raise KeyError(f"token {token!r} not in the vocabulary of {self.source}")
        return tid

    def encode(self, text: str) -> list[int]:
        return self.core.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.core.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.core.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """End-of-turn ids: generation_config's eos list (Qwen3: <|im_end|>, <|endoftext|>), else eos."""
        eos = self.generation_config.get("eos_token_id")
        ids = [eos] if isinstance(eos, int) else list(eos or [])
        if self.eos_token_id is not None and self.eos_token_id not in ids:
            ids.insert(0, self.eos_token_id)
        return tuple(ids)

    # ---- chat template ------------------------------------------------------------------------

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None, *,
                            add_generation_prompt: bool = False, tokenize: bool = False,
                            **template_kwargs) -> str | list[int]:
        """Renders like transformers' `apply_chat_template` (same variables, same jinja settings)."""
        text = self._template.render(messages=messages, tools=tools or None,
                                     add_generation_prompt=add_generation_prompt,
                                     bos_token=self.config.get("bos_token") or "", eos_token=self.eos_token or "",
                                     **template_kwargs)
        return self.encode(text) if tokenize else text


def load_tokenizer(name_or_path: str | os.PathLike | None = None) -> Tokenizer:
    """The packaged Qwen3 tokenizer (no argument / ""), a local directory, or a hub repo id downloaded with
    huggingface_hub (only the tokenizer files)."""
    if not name_or_path:
        return Tokenizer.from_dir(PACKAGED_QWEN3)
    path = pathlib.Path(name_or_path)
    if path.is_dir():
        return Tokenizer.from_dir(path)
    if path.exists():
        raise TokenizerLoadError(f"{path}: is a file; pass the directory holding {TOKENIZER_FILE}")
    try:
        import huggingface_hub

        local = huggingface_hub.snapshot_download(
            str(name_or_path),
            allow_patterns=[TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE, GENERATION_CONFIG_FILE])
    except Exception as e:
        raise TokenizerLoadError(f"tokenizer {str(name_or_path)!r}: not a local directory and the hub "
                                 f"download failed: {type(e).__name__}: {e}") from e
    return Tokenizer.from_dir(local)
