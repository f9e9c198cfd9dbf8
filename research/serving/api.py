"""The one async interface every generation engine implements (JAX engine, SGLang client, replay).

The shim only ever talks to this interface: it hands over token ids and gets token ids, behaviour
logprobs, the weight version and (MoE) routed experts back. Text never crosses this boundary.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import AsyncIterator

import numpy as np


class EngineError(RuntimeError):
    """Generation failed inside the engine (maps to a 5xx in the shim)."""


class EngineUnavailable(EngineError):
    """Engine is down, paused or draining for a weight update: retry later (503/529 + Retry-After)."""

    def __init__(self, msg: str, retry_after_s: float = 1.0):
        super().__init__(msg)
        self.retry_after_s = retry_after_s


class ContextLengthExceeded(ValueError):
    """Prompt (+ max_new_tokens) does not fit the engine's context: a 400 in the shim."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: disabled
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class ImageInput:
    """One image of a vision-language prompt, as the policy's processor made it: its placeholder run in
    `prompt_ids` has t*h*w/merge**2 image tokens (in the order of the request's `images`)."""

    sha: str  # content address (research/shim/images.py): equal images share cached K/V, different ones never
    grid_thw: tuple[int, int, int]  # patches per axis
    pixels_NxP: np.ndarray  # float32 [t*h*w, 3*temporal*patch**2], patches in merge-block order
    data: bytes = b""  # the image as the harness sent it: for an engine that preprocesses itself (SGLang)


@dataclasses.dataclass
class GenerateRequest:
    prompt_ids: list[int]
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    session_id: str | None = None  # lets the engine reuse a session's KV cache across turns
    return_routed_experts: bool = False
    request_id: str | None = None
    images: tuple[ImageInput, ...] = ()  # a vision-language policy's images (only an engine serving one takes them)


@dataclasses.dataclass
class TokenChunk:
    """Tokens produced since the previous chunk (streaming)."""

    token_ids: list[int]
    logprobs: list[float]


@dataclasses.dataclass
class GenerateResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # stop | length | abort
    weight_version: int
    routed_experts: np.ndarray | None = None  # int32 [len(token_ids), layers, top_k]
    prompt_tokens: int = 0


class Engine(abc.ABC):
    """Async generation engine. Implementations must be safe for many concurrent requests."""

    @property
    @abc.abstractmethod
    def weight_version(self) -> int: ...

    @property
    def max_context(self) -> int:
        return 1 << 30

    @property
    def image_processor(self):  # noqa: ANN201 - research.models.image_processor.ImageProcessorConfig | None
        """How the served policy wants images preprocessed (a shim in front sets `ShimOptions.vision` from it);
        None for a text-only policy, whose shim omits images."""
        return None

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        """Non-streaming generation: drains `stream`."""
        result = None
        async for item in self.stream(req):
            result = item
        assert isinstance(result, GenerateResult)
        return result

    @abc.abstractmethod
    def stream(self, req: GenerateRequest) -> AsyncIterator[TokenChunk | GenerateResult]:
        """Yields TokenChunk's as tokens are produced, then exactly one final GenerateResult
        (which repeats all tokens). Cancelling the iterator aborts the request."""

    async def pause(self) -> None:
        """Stop admitting requests and wait for in-flight ones (weight sync)."""

    async def resume(self) -> None:
        """Admit requests again."""

    async def update_weights(self, params, version: int) -> None:  # noqa: ANN001
        """Swap in new weights tagged `version` (in-process engines; remote ones load from disk)."""
        raise NotImplementedError(f"{type(self).__name__} cannot take in-process weights")

    async def close(self) -> None:
        pass
