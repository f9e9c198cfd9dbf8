"""Images in requests, for a vision-language policy: decoded and checked once, stored once by content, rendered as
Qwen3-VL's placeholder tokens, and named in each call's record.

Why markers in the segment text: the shim renders a request into text segments that it tokenizes and caches by
text. An image part becomes `<|vision_start|>` + `image:NONCE:SHA256:TxHxW` + `<|vision_end|>` in its message's
text; tokenizing a segment expands each marker into `<|vision_start|>`, t*h*w/merge**2 `<|image_pad|>` and
`<|vision_end|>` (special tokens are split off before BPE, so cutting the text at a marker tokenizes like the
whole). Two images differ in their segments' text, so the segment cache never mixes them up, and the record lists
each prompt's images in order (`meta["images"]`: "SHA256:TxHxW"), while the pixels live once in the store beside
the capture log (`<log>.images/ab/abcd....png`, the bytes as sent). The NONCE is per shim: text a harness sends
that merely looks like a marker is text.

With no vision policy (`ShimOptions.vision` None) an image part stays "[image omitted]" as for any text policy.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import hashlib
import os
import pathlib
import re
import secrets
from collections.abc import Iterator

from research.models import image_processor as ip
from research.models.tokenizer import Tokenizer
from research.serving import image_wire
from research.serving.api import ImageInput

VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
_EXT = {"PNG": "png", "JPEG": "jpg", "GIF": "gif", "WEBP": "webp", "BMP": "bmp"}


class BadImage(ValueError):
    """An image part the shim refuses: `where` in the request and why (common.text_of answers it as a 400)."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where, self.message = where, message


class ImageStore:
    """Encoded images by sha256 under `root` (two-character fan-out), each written once, atomically."""

    def __init__(self, root: str | pathlib.Path):
        self.root = pathlib.Path(root)

    def path(self, sha: str) -> pathlib.Path | None:
        hits = list((self.root / sha[:2]).glob(f"{sha}.*"))
        return hits[0] if hits else None

    def put(self, data: bytes, ext: str) -> str:
        sha = hashlib.sha256(data).hexdigest()
        if self.path(sha) is None:
            d = self.root / sha[:2]
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f".{sha}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            tmp.replace(d / f"{sha}.{ext}")
        return sha

    def get(self, sha: str) -> bytes:
        p = self.path(sha)
        if p is None:
            raise KeyError(f"image {sha} not in {self.root}")
        return p.read_bytes()


class Vision:
    """A shim's image handling: the policy's processor settings, the store, the marker nonce."""

    cache_images = 64  # preprocessed images kept in memory (~0.5-3 MB each at screenshot sizes)

    def __init__(self, processor: ip.ImageProcessorConfig, store: ImageStore):
        self.processor, self.store = processor, store
        self._pixels: dict[str, object] = {}
        self.nonce = secrets.token_hex(6)
        self._marker = re.compile(re.escape(VISION_START) + rf"image:{self.nonce}:([0-9a-f]{{64}}):(\d+)x(\d+)x(\d+)"
                                  + re.escape(VISION_END))

    def image_text(self, data: bytes, where: str) -> str:
        """The marker of one encoded image (stored); BadRequest naming `where` for an image we refuse."""
        try:
            im, fmt = ip.decode(data, self.processor)
            with contextlib.closing(im):
                h, w = ip.target_size(im.height, im.width, self.processor)
        except ip.ImageError as e:
            raise BadImage(where, str(e)) from None
        sha = self.store.put(data, _EXT[fmt])
        p = self.processor.patch_size
        return f"{VISION_START}image:{self.nonce}:{sha}:1x{h // p}x{w // p}{VISION_END}"

    def inputs(self, images: list[str]) -> tuple[ImageInput, ...]:
        """The engine's inputs of a prompt's images ("SHA:TxHxW" each): pixels from the store, preprocessed once
        per image (a group's rollouts and a session's turns see the same screenshots again and again)."""
        out = []
        for x in images:
            sha, _, grid = x.partition(":")
            hit = self._pixels.pop(sha, None)
            if hit is None:
                data = self.store.get(sha)  # the marker was made by this processor from these bytes
                hit = (ip.patch_rows(data, self.processor, grid, f"image {sha}"), data)
            self._pixels[sha] = hit  # most recently used last
            while len(self._pixels) > self.cache_images:
                self._pixels.pop(next(iter(self._pixels)))
            t, h, w = (int(v) for v in grid.split("x"))
            out.append(ImageInput(sha, (t, h, w), *hit))
        return tuple(out)

    def images_of(self, text: str) -> list[str]:
        """"SHA:TxHxW" of each image marker in `text`, in order."""
        return [f"{m[0]}:{m[1]}x{m[2]}x{m[3]}" for m in self._marker.findall(text)]

    def encode(self, tok: Tokenizer, text: str) -> list[int]:
        """Token ids of a segment, each image marker expanded into its placeholder tokens."""
        if VISION_START not in text:
            return tok.encode(text)
        ids, at = [], 0
        start, end, pad = (tok.token_to_id(t) for t in (VISION_START, VISION_END, IMAGE_PAD))
        for m in self._marker.finditer(text):
            ids += tok.encode(text[at:m.start()]) if m.start() > at else []
            t, h, w = (int(g) for g in m.groups()[1:])
            ids += [start] + [pad] * ip.num_tokens((t, h, w), self.processor) + [end]
            at = m.end()
        return ids + (tok.encode(text[at:]) if at < len(text) else [])


_ACTIVE: contextvars.ContextVar[Vision | None] = contextvars.ContextVar("hrl_vision", default=None)


@contextlib.contextmanager
def parsing_with(vision: Vision | None) -> Iterator[None]:
    """Image parts parsed inside this block become `vision`'s markers (None: they are omitted)."""
    token = _ACTIVE.set(vision)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> Vision | None:
    return _ACTIVE.get()


def _base64(s: str, where: str) -> bytes:
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise BadImage(where, "image data is not valid base64") from None


def _data_url(url: object, where: str) -> bytes:
    if not isinstance(url, str):
        raise BadImage(where, "must be a string (a data: URL)")
    m = image_wire.DATA_URL.match(url)
    if m is None:
        kind = url.split(":", 1)[0] if ":" in url else "this"
        raise BadImage(where, f"only base64 data: URLs are accepted, not a {kind} URL: the sandbox has no network")
    return _base64(url[m.end():], where)


def part_bytes(part: dict, kind: str, where: str) -> bytes:
    """The encoded image of an OpenAI Chat `image_url`, a Responses `input_image` or an Anthropic `image` part."""
    if kind == "image_url":  # OpenAI Chat: {"image_url": {"url": ...}} (or the bare string)
        url = part.get("image_url")
        return _data_url(url.get("url") if isinstance(url, dict) else url, f"{where}.image_url")
    if kind == "input_image":  # Responses: {"image_url": "data:..."}; a file_id needs the Files API we do not serve
        if "image_url" not in part:
            raise BadImage(where, "input_image needs image_url (a base64 data: URL); file_id is not served")
        return _data_url(part["image_url"], f"{where}.image_url")
    src = part.get("source")  # Anthropic: {"source": {"type": "base64", "media_type": ..., "data": ...}}
    if not isinstance(src, dict) or src.get("type") != "base64":
        got = src.get("type") if isinstance(src, dict) else type(src).__name__
        raise BadImage(f"{where}.source", f"only base64 image sources are accepted (got {got!r}): no network")
    data = src.get("data")
    if not isinstance(data, str):
        raise BadImage(f"{where}.source.data", "must be a base64 string")
    return _base64(data, f"{where}.source.data")


def image_part_text(part: dict, kind: str, where: str) -> str | None:
    """The text an image part renders as under the active vision policy; None when none is active."""
    v = active()
    if v is None:
        return None
    return v.image_text(part_bytes(part, kind, where), where)
