"""ModelConfig: one frozen dataclass for Qwen3 dense and Qwen3-MoE, built from presets or HF config.json.

Why a dataclass and not ml_collections here: the config is a static (hashable) argument of every jitted
model function, so it must be immutable and hashable. Training configs (ml_collections) hold one of these.
The logical-axis rules live here too (``logical_rules``) so a config fully describes how the model shards.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

# Logical axis -> mesh axes. ONE short table: every param/activation name used in qwen3.py/moe.py is here.
# "batch" spans data+fsdp (+expert: outside the MoE block the expert axis is just more data parallelism).
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp", "expert")),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("exp", "expert"),
    ("expert_mlp", "tensor"),
    ("layers", None),
    ("length", None),
    ("head_dim", None),
    ("router", None),
    ("act_embed", None),
)

_ARCHS = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


class ConfigError(ValueError):
    """A config.json that does not describe a supported Qwen3 model; the message names file and key."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    tie_word_embeddings: bool = False
    # MoE (num_experts == 0: dense model)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    mlp_only_layers: tuple[int, ...] = ()
    decoder_sparse_step: int = 1
    # Qwen3-VL's text model: 3-D interleaved RoPE (positions [3, B, T]; research/models/mrope.py) when set, and the
    # vision tower's DeepStack features added at the image tokens after each of the first `deepstack_layers` layers
    mrope_section: tuple[int, ...] = ()
    deepstack_layers: int = 0
    # numerics / implementation choices (not part of the HF checkpoint)
    dtype: str = "bfloat16"  # compute dtype; params are always param_dtype
    param_dtype: str = "float32"
    attention_impl: str = "auto"
    moe_impl: str = "auto"  # "ragged" | "blocked" (CPU-fast) | "dense" | "auto" | "shapes" (AOT only); see moe.py
    expert_parallel: bool = False  # MoE through shard_map over the "expert" mesh axis (needs a mesh context)
    remat_policy: str = "none"  # see qwen3.REMAT_POLICIES
    scan_layers: bool = True
    logical_rules: tuple[tuple[str, Any], ...] = DEFAULT_RULES
    # Init std of the token embedding (a from-scratch model only; checkpoints overwrite it). 0.02 is the HF
    # initializer_range; tiny models trained from scratch need ~0.2, or Adam's common-mode drift (~lr per step
    # in the same direction for every target token) swamps the init and makes the tokens to copy collide.
    embedding_init_std: float = 0.02

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def layer_is_moe(self, i: int) -> bool:
        """HF rule (Qwen3MoeDecoderLayer): sparse unless in mlp_only_layers or off the sparse step."""
        return self.is_moe and i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

    def layer_runs(self) -> tuple[tuple[bool, int, int], ...]:
        """Maximal runs of consecutive layers of the same kind: (is_moe, first_layer, count).

        Each run is one ``nn.scan`` (params ``layers_{run}``), so a uniform model (every real Qwen3) compiles
        one layer body; a model mixing dense and sparse layers compiles one body per run. A VL model's DeepStack
        layers stay inside their run (the scan body adds feature k after layer k): runs of their own would each
        hold their own backward buffers, +109 GiB/device for Qwen3-VL-30B-A3B's step (docs/experiments/
        2026-12-07-deepstack-in-scan.md).
        """
        runs: list[tuple[bool, int, int]] = []
        for i in range(self.num_layers):
            kind = self.layer_is_moe(i)
            if runs and runs[-1][0] == kind:
                runs[-1] = (kind, runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((kind, i, 1))
        return tuple(runs)

    def replace(self, **kw) -> ModelConfig:
        return dataclasses.replace(self, **kw)

    def param_counts(self) -> tuple[int, int]:
        """(total, active-per-token) parameter counts, computed from the dims (embeddings included)."""
        D, Dh = self.hidden_size, self.head_dim
        attn = D * Dh * (2 * self.num_heads + 2 * self.num_kv_heads) + 2 * Dh + 2 * D
        total = active = 0
        for i in range(self.num_layers):
            if self.layer_is_moe(i):
                expert = 3 * D * self.moe_intermediate_size
                total += attn + D * self.num_experts + self.num_experts * expert
                active += attn + D * self.num_experts + self.num_experts_per_tok * expert
            else:
                mlp = 3 * D * self.intermediate_size
                total += attn + mlp
                active += attn + mlp
        emb = self.vocab_size * D * (1 if self.tie_word_embeddings else 2) + D
        return total + emb, active + emb

    @classmethod
    def from_hf_config(cls, path_or_dict: str | pathlib.Path | dict, **overrides) -> ModelConfig:
        """Build from an HF ``config.json`` (file, model dir, or dict); both key spellings are accepted.

        ``num_experts``/``num_local_experts`` and ``rope_theta``/``rope_parameters.rope_theta``. Anything that is
        not Qwen3/Qwen3-MoE, or lacks a required key, raises ConfigError naming the file and the key.
        """
        if isinstance(path_or_dict, dict):
            d, src = path_or_dict, "<dict>"
        else:
            p = pathlib.Path(path_or_dict)
            p = p / "config.json" if p.is_dir() else p
            src = str(p)
            try:
                d = json.loads(p.read_text())
            except FileNotFoundError as e:
                raise ConfigError(f"{src}: no such config file") from e
            except json.JSONDecodeError as e:
                raise ConfigError(f"{src}: not valid JSON ({e})") from e
        model_type = d.get("model_type")
        if model_type not in _ARCHS:
            raise ConfigError(
                f"{src}: key 'model_type' is {model_type!r} (architectures={d.get('architectures')}); "
                f"supported: {sorted(_ARCHS)}"
            )

        def need(key: str, *alts: str):
            for k in (key, *alts):
                if k in d and d[k] is not None:
                    return d[k]
            raise ConfigError(f"{src}: missing required key {key!r}" + (f" (or {list(alts)})" if alts else ""))

        theta = d.get("rope_theta")
        if theta is None:
            rp = d.get("rope_parameters") or {}
            theta = rp.get("rope_theta")
        if theta is None:
            raise ConfigError(f"{src}: missing required key 'rope_theta' (or 'rope_parameters.rope_theta')")
        rope_type = (d.get("rope_parameters") or d.get("rope_scaling") or {}).get("rope_type", "default")
        if rope_type != "default":
            raise ConfigError(f"{src}: key 'rope_parameters.rope_type' is {rope_type!r}; only 'default' supported")
        kw: dict[str, Any] = dict(
            vocab_size=need("vocab_size"),
            hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=need("num_attention_heads"),
            num_kv_heads=need("num_key_value_heads"),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        )
        kw["head_dim"] = d.get("head_dim") or kw["hidden_size"] // kw["num_heads"]
        if model_type == "qwen3_moe":
            kw.update(
                num_experts=need("num_experts", "num_local_experts"),
                num_experts_per_tok=need("num_experts_per_tok"),
                moe_intermediate_size=need("moe_intermediate_size"),
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
                decoder_sparse_step=int(d.get("decoder_sparse_step", 1)),
            )
        kw.update(overrides)
        return cls(**kw)

    def to_hf_config(self) -> dict:
        """The HF config.json dict (fields transformers needs to rebuild the same model)."""
        d: dict[str, Any] = dict(
            model_type="qwen3_moe" if self.is_moe else "qwen3",
            architectures=[_ARCHS["qwen3_moe" if self.is_moe else "qwen3"]],
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_parameters={"rope_theta": self.rope_theta, "rope_type": "default"},
            tie_word_embeddings=self.tie_word_embeddings,
            hidden_act="silu",
            attention_bias=False,
            torch_dtype="float32",
        )
        if self.is_moe:
            d.update(
                num_experts=self.num_experts,
                num_experts_per_tok=self.num_experts_per_tok,
                moe_intermediate_size=self.moe_intermediate_size,
                norm_topk_prob=self.norm_topk_prob,
                mlp_only_layers=list(self.mlp_only_layers),
                decoder_sparse_step=self.decoder_sparse_step,
            )
        return d


def tiny_dense(**overrides) -> ModelConfig:
    """A tiny dense Qwen3 (tied embeddings, like the small Qwen3 checkpoints); fp32 for parity tests."""
    kw = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, tie_word_embeddings=True, dtype="float32",
    )
    return ModelConfig(**{**kw, **overrides})


def tiny_moe(**overrides) -> ModelConfig:
    """A tiny Qwen3-MoE (untied head, 8 experts top-2, norm_topk_prob) with the 30B-A3B structure."""
    kw = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        dtype="float32",
    )
    return ModelConfig(**{**kw, **overrides})
