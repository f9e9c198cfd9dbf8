"""One engine factory for every launcher: an endpoint spec string "kind[:arg]" -> an `Engine`.

Why: the shim launcher, `launch.eval` and anything else that needs "an engine from the command line"
used to build engines each in its own way, and drifted (one checked the vocabulary, the other did not;
one passed max_context through, the other did not). Here every kind is built once:

  replay[:FILE]   ReplayEngine cycling the completions in FILE (a JSON list of strings or id lists);
                  without FILE one fixed completion (plumbing checks)
  jax[:MODEL]     the embedded JAX engine: MODEL an HF Qwen3 or Qwen3-VL dir (a VL policy's engine says how
                  its images are preprocessed: `Engine.image_processor`) or a preset (tiny_moe, tiny_dense);
                  default a tiny random Qwen3-MoE with the tokenizer's vocabulary (plumbing runs)
  sglang:URL      a running SGLang server (SGLangClient; token ids in and out); `sglang:URL,vl=DIR` when it
                  serves a Qwen3-VL checkpoint DIR: the client passes images (its image token and processor read
                  from DIR's config.json and preprocessor_config.json, as the server reads them)
  openai:URL      any OpenAI-compatible /v1/completions server that returns token ids (vLLM-style)
  NAME            a scripted engine from `scripts` (NAME -> function of the rendered prompt text -> reply),
                  so callers register their own (harness_env's `oracle`) without research/ importing them

Imports are lazy: building a replay engine must not pull in JAX, nor a JAX engine aiohttp.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Mapping

from research.serving.api import Engine

ScriptFn = Callable[[str], str]
_DEFAULT_REPLAY = "(replay engine) ok"


@dataclasses.dataclass(frozen=True)
class _Opts:
    max_len: int
    num_slots: int
    max_context: int | None


def _replay(arg: str, tok, o: _Opts) -> Engine:  # noqa: ANN001
    from research.serving.replay import ReplayEngine

    script = load_replay_file(arg) if arg else [_DEFAULT_REPLAY]
    return ReplayEngine(script, tok, cycle=True, **({"max_context": o.max_context} if o.max_context else {}))


def load_replay_file(path: str | pathlib.Path) -> list:
    """The completions of a replay file, checked: a non-empty JSON list of strings or lists of token ids."""
    p = pathlib.Path(path)
    try:
        script = json.loads(p.read_text())
    except OSError as e:
        raise ValueError(f"replay file {p}: cannot read it ({e.strerror or e})") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"replay file {p}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    if not isinstance(script, list) or not script:
        raise ValueError(f"replay file {p}: expected a non-empty JSON list of completions, got {type(script).__name__}"
                         + (" (empty)" if script == [] else ""))
    for i, item in enumerate(script):
        ok_ids = isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        if not (isinstance(item, str) or ok_ids):
            raise ValueError(f"replay file {p}: completion {i} is {str(item)[:60]!r}; expected a string or a list "
                             "of token ids")
    return script


def _jax(arg: str, tok, o: _Opts) -> Engine:  # noqa: ANN001
    from research.serving.scheduler import EngineConfig
    from research.serving.serve import PRESETS, model_and_params

    model = arg or "tiny_moe"
    if model not in PRESETS and not (pathlib.Path(model) / "config.json").is_file():
        raise ValueError(f"jax:{model}: neither a preset ({', '.join(PRESETS)}) nor an HF dir with config.json")
    if model not in PRESETS and _is_vl(pathlib.Path(model)):
        return _jax_vl(pathlib.Path(model), tok, o)
    cfg, params = model_and_params(model, vocab_size=tok.vocab_size if model in PRESETS else None)
    if cfg.vocab_size < tok.vocab_size:
        raise ValueError(f"jax:{model}: model vocab {cfg.vocab_size} < tokenizer vocab {tok.vocab_size}")
    return jax_engine(cfg, params, EngineConfig(num_slots=o.num_slots, max_len=o.max_len))


def _is_vl(path: pathlib.Path) -> bool:
    return json.loads((path / "config.json").read_text()).get("model_type") in ("qwen3_vl", "qwen3_vl_moe")


def _jax_vl(path: pathlib.Path, tok, o: _Opts) -> Engine:  # noqa: ANN001
    """A Qwen3-VL checkpoint: the engine serves images, preprocessed as its preprocessor_config.json says."""
    from research.models.image_processor import ImageProcessorConfig
    from research.models.qwen3_vl import load_hf
    from research.serving.jax_engine import JaxEngine
    from research.serving.qwen3_vl_runner import Qwen3VLRunner
    from research.serving.scheduler import EngineConfig

    params, text, vision, image_id = load_hf(path)
    if text.vocab_size < tok.vocab_size:
        raise ValueError(f"jax:{path}: model vocab {text.vocab_size} < tokenizer vocab {tok.vocab_size}")
    if tok.token_to_id("<|image_pad|>") != image_id:
        raise ValueError(f"jax:{path}: image_token_id {image_id} is not the tokenizer's <|image_pad|> "
                         f"({tok.token_to_id('<|image_pad|>')})")
    proc = path / "preprocessor_config.json"
    runner = Qwen3VLRunner(text, vision, image_id,
                           image_processor=ImageProcessorConfig.from_hf(proc) if proc.is_file() else None)
    return JaxEngine(runner, params, config=EngineConfig(num_slots=o.num_slots, max_len=o.max_len))


def jax_engine(model_cfg, params, engine_config, weight_version: int = 0) -> Engine:  # noqa: ANN001
    """The embedded JAX engine over `params` (how every caller builds one)."""
    from research.serving.jax_engine import JaxEngine
    from research.serving.qwen3_runner import Qwen3Runner

    return JaxEngine(Qwen3Runner(model_cfg), params, config=engine_config, weight_version=weight_version)


def policy_engine(run, params, *, weight_version: int) -> Engine:  # noqa: ANN001
    """The RL loop's engine for the typed run config `run` (research/rl/config.py): the JAX engine over the
    learner's params in process (`sync.kind == "jax"`), or the SGLang server at `sync.sglang_url`, which
    receives weights from disk."""
    vl = {} if run.vision is None else {"image_token_id": run.image_pad_id, "image_processor": run.processor()}
    if run.sync.kind == "sglang":
        from research.serving.sglang_client import SGLangClient

        return SGLangClient(_url("sglang", run.sync.sglang_url), weight_version=weight_version,
                            max_context=run.engine.max_len, **vl)
    if vl:  # a Qwen3-VL policy: the engine encodes each request's images with the learner's own tower
        from research.serving.jax_engine import JaxEngine
        from research.serving.qwen3_vl_runner import Qwen3VLRunner

        runner = Qwen3VLRunner(run.model, run.vision, vl["image_token_id"], image_processor=vl["image_processor"])
        return JaxEngine(runner, params, config=run.engine, weight_version=weight_version)
    return jax_engine(run.model, params, run.engine, weight_version)


def _sglang(arg: str, tok, o: _Opts) -> Engine:  # noqa: ANN001
    from research.serving.sglang_client import SGLangClient

    url, _, vl = arg.partition(",vl=")
    wire = _vl_wire(pathlib.Path(vl), tok) if vl else {}
    return SGLangClient(_url("sglang", url), max_context=o.max_context, **wire)


def _vl_wire(path: pathlib.Path, tok) -> dict:  # noqa: ANN001
    """The SGLang client's image settings for the Qwen3-VL checkpoint at `path` (checked against `tok`)."""
    from research.models.image_processor import ImageProcessorConfig
    from research.models.qwen3_vl import configs_from_hf

    if not (path / "config.json").is_file() or not _is_vl(path):
        raise ValueError(f"sglang:...,vl={path}: not a Qwen3-VL checkpoint dir (config.json with model_type qwen3_vl)")
    image_id = configs_from_hf(path)[2]
    if tok.token_to_id("<|image_pad|>") != image_id:
        raise ValueError(f"sglang:...,vl={path}: image_token_id {image_id} is not the tokenizer's <|image_pad|> "
                         f"({tok.token_to_id('<|image_pad|>')})")
    proc = path / "preprocessor_config.json"
    if not proc.is_file():
        raise ValueError(f"sglang:...,vl={path}: no preprocessor_config.json (the server's image processor settings)")
    return {"image_token_id": image_id, "image_processor": ImageProcessorConfig.from_hf(proc)}


def _openai(arg: str, tok, o: _Opts) -> Engine:  # noqa: ANN001
    from research.serving.openai_client import OpenAICompletionsEngine

    return OpenAICompletionsEngine(_url("openai", arg), **({"max_context": o.max_context} if o.max_context else {}))


def _url(kind: str, arg: str) -> str:
    if not arg.startswith(("http://", "https://")):
        raise ValueError(f"{kind}:URL needs an http(s) URL, got {arg!r} (e.g. {kind}:http://host:30000)")
    return arg


# kind -> (builder, how the spec is written): the usage line of every error lists these.
BUILDERS: dict[str, tuple[Callable[[str, object, _Opts], Engine], str]] = {
    "replay": (_replay, "replay[:FILE]"),
    "jax": (_jax, "jax[:HF_DIR|tiny_moe|tiny_dense]"),
    "sglang": (_sglang, "sglang:URL"),
    "openai": (_openai, "openai:URL"),
}


def known_specs(scripts: Mapping[str, ScriptFn] | None = None) -> str:
    return " | ".join([*(usage for _, usage in BUILDERS.values()), *sorted(scripts or {})])


def _scripted(fn: ScriptFn, tok) -> Engine:  # noqa: ANN001
    from research.serving.replay import ReplayEngine

    return ReplayEngine(lambda req: fn(tok.decode(req.prompt_ids)), tok)


def build_engine(spec: str, tokenizer, *, max_len: int = 4096, num_slots: int = 8,  # noqa: ANN001
                 max_context: int | None = None, scripts: Mapping[str, ScriptFn] | None = None) -> Engine:
    """The engine named by `spec` ("kind[:arg]", see the module doc); ValueError names the known kinds.

    `max_len`/`num_slots` size the JAX engine's slots; `max_context` caps remote/replay engines' context.
    """
    kind, _, arg = spec.partition(":")
    scripts = scripts or {}
    if kind in scripts:
        if arg:
            raise ValueError(f"engine spec {spec!r}: the scripted engine {kind!r} takes no argument")
        return _scripted(scripts[kind], tokenizer)
    if kind not in BUILDERS:
        raise ValueError(f"engine spec {spec!r}: unknown kind {kind!r}; expected {known_specs(scripts)}")
    builder, _ = BUILDERS[kind]
    return builder(arg, tokenizer, _Opts(max_len=max_len, num_slots=num_slots, max_context=max_context))
