"""Images on SGLang's native `/generate` wire: `input_ids` with ONE `<|image_pad|>` per image, plus `image_data`.

Why this shape: an SGLang server preprocesses each `image_data` entry itself and expands each image's single
placeholder token into that image's t*h*w/merge**2 tokens. The shim's records hold the prompt already expanded (the
policy's processor made the grid), so sending those ids as they are expands every image twice (strands-rl/
strands-sglang#31). The client collapses each placeholder run to one token and sends the bytes as the harness sent
them; the server's expansion must then give back exactly the recorded length, which the client checks against
`meta_info.prompt_tokens` (a server whose image processor differs would make the records' image tokens a lie).
launch/serve.py's clone of the API (research/serving/native_server.py) expands the same way with the engine's
processor, so the round trip is tested without a GPU.
"""

from __future__ import annotations

import base64
import binascii
import re

_MAGIC = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpeg"), (b"GIF8", "gif"), (b"BM", "bmp"))
# The one data-URL pattern of the project (the shim imports it; its errors differ from the server's on purpose).
DATA_URL = re.compile(r"data:(image/[\w.+-]+)?(;[\w=-]+)*;base64,", re.I)


def runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of `token` in `ids`."""
    out: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != token:
            continue
        if out and out[-1][0] + out[-1][1] == i:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def collapse(ids: list[int], token: int) -> tuple[list[int], list[int]]:
    """(ids with each run of `token` cut to one token, the runs' lengths in order)."""
    out, lengths, at = [], [], 0
    for start, n in runs(ids, token):
        out += ids[at:start + 1]
        lengths.append(n)
        at = start + n
    return out + ids[at:], lengths


def expand(ids: list[int], token: int, counts: list[int]) -> list[int]:
    """The inverse on the server: the i-th `token` of `ids` becomes counts[i] of them. ValueError, naming both
    numbers, when `ids` holds a different number of placeholders than there are images (or an expanded run)."""
    at = [i for i, t in enumerate(ids) if t == token]
    if len(at) != len(counts):
        raise ValueError(f"input_ids hold {len(at)} image tokens ({token}) for {len(counts)} image_data entries: "
                         "send one placeholder token per image (the server expands it)")
    out, prev = [], 0
    for i, n in zip(at, counts):
        out += ids[prev:i] + [token] * n
        prev = i + 1
    return out + ids[prev:]


def data_url(data: bytes) -> str:
    """`data:image/KIND;base64,...` of encoded image bytes (the kind sniffed from the magic number)."""
    kind = next((k for magic, k in _MAGIC if data.startswith(magic)), None)
    if kind is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        kind = "webp"
    if kind is None:
        raise ValueError(f"image bytes of unknown kind (starting {data[:8]!r}): not PNG, JPEG, GIF, WEBP or BMP")
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def image_bytes(item: object, where: str) -> bytes:
    """An `image_data` entry (a data URL or bare base64; URLs and paths are refused: the server reaches nothing)
    -> its bytes; ValueError naming `where` otherwise."""
    if not isinstance(item, str):
        raise ValueError(f"{where}: expected a data URL or base64 string, got {type(item).__name__}")
    m = DATA_URL.match(item)
    if m is None and item.startswith(("http://", "https://", "file:", "/")):
        raise ValueError(f"{where}: only inline images (data URLs or base64) are served here, got {item[:40]!r}")
    try:
        return base64.b64decode(item[m.end():] if m else item, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"{where}: not valid base64 ({e})") from None
