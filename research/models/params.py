"""Parameter counts (total and active per token) from an abstract parameter tree — nothing allocated.

Why count from the tree rather than from the dims: the tree is what we actually train, shard and
checkpoint, so this catches a wrong shape or a missing/extra parameter that a formula would hide
(`ModelConfig.param_counts` is the formula; tests check that both agree, and against transformers).

Classification uses the logical axis names every parameter carries (`nn.Partitioned`):
  * a leaf with the expert axis ("exp") is per-expert: a token uses `experts_per_token / num_experts`
    of it (dropless top-k routing: exactly k experts per token per MoE layer);
  * a leaf with the vocab axis is an embedding / LM head (reported separately, counted as active:
    the usual convention of model cards, e.g. Qwen3-30B-A3B's "3.3B activated").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax

from research.models import ModelConfig, Qwen3, dummy_inputs

EXPERT_AXIS = "exp"
VOCAB_AXIS = "vocab"


@dataclasses.dataclass(frozen=True)
class ParamCount:
    total: int
    active: int  # parameters one token's forward pass uses
    embedding: int  # embedding table + untied LM head
    experts: int  # all per-expert parameters (of which active uses k/E)

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding

    def summary(self) -> str:
        b = lambda n: f"{n / 1e9:.3f}B"
        return (f"total {b(self.total)} ({self.total:,}), active {b(self.active)} ({self.active:,}), "
                f"non-embedding {b(self.non_embedding)}, experts {b(self.experts)}")


def abstract_params(cfg: ModelConfig) -> Any:
    """The boxed (logically named) param tree as ShapeDtypeStructs, via eval_shape of the real init.

    Expert parallelism changes how the MoE runs, not its parameters, and needs a mesh: it is turned
    off here so counting works without one."""
    cfg = cfg.replace(expert_parallel=False)
    return jax.eval_shape(lambda r: Qwen3(cfg).init(r, *dummy_inputs())["params"], jax.random.PRNGKey(0))


def _names(leaf) -> tuple:
    return tuple(leaf.names) if isinstance(leaf, nn.Partitioned) else ()


def count_params(abstract_boxed: Any, *, num_experts: int = 0, experts_per_token: int = 0) -> ParamCount:
    """Counts an (abstract or real) boxed param tree; `num_experts=0` for dense models."""
    total = active = embedding = experts = 0
    leaves = jax.tree.leaves(abstract_boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    for leaf in leaves:
        names = _names(leaf)
        value = leaf.value if isinstance(leaf, nn.Partitioned) else leaf
        n = math.prod(value.shape)
        total += n
        if EXPERT_AXIS in names:
            if not num_experts or n * experts_per_token % num_experts:
                raise ValueError(f"per-expert leaf {names} {value.shape} with num_experts={num_experts}, "
                                 f"experts_per_token={experts_per_token}")
            experts += n
            active += n * experts_per_token // num_experts
        else:
            active += n
        if VOCAB_AXIS in names:
            embedding += n
    return ParamCount(total=total, active=active, embedding=embedding, experts=experts)


def count_model_params(cfg: ModelConfig) -> ParamCount:
    """ParamCount of the model `cfg` describes, from its abstract tree (works for 30B on a laptop)."""
    return count_params(abstract_params(cfg), num_experts=cfg.num_experts, experts_per_token=cfg.num_experts_per_tok)
