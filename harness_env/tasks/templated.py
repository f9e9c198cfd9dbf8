"""What the template families share (web_family.py, visual_family.py, desktop_family.py): a task is (template,
variant index); every 5th index of a template is held out at a per-template offset (a stable hash, so every
template is in both splits); generation shuffles by seed, then goes round-robin over templates, so a small n
still covers them."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable

SPLITS = ("train", "heldout", "all")


def held_out(family: str, template: str, index: int) -> str:
    """`heldout` for 1 in 5 variant indexes of `family`/`template`, else `train`."""
    h = int(hashlib.sha256(f"{family}/{template}".encode()).hexdigest()[:8], 16)
    return "heldout" if (h + index) % 5 == 0 else "train"


def pairs(templates: Iterable[str], split_of: Callable[[str, int], str], split: str,
          per_template: int) -> list[tuple[str, int]]:
    """The (template, index) pairs of `split` over the first `per_template` indexes of each template."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} not in train|heldout|all")
    return [(t, i) for t in templates for i in range(per_template) if split == "all" or split_of(t, i) == split]


def round_robin(vs: list[tuple[str, int]], seed: int, per_template: int) -> list[tuple[str, int]]:
    """(template, index) pairs shuffled by `seed`, then taken round-robin over templates."""
    vs = list(vs)
    random.Random(seed).shuffle(vs)
    by_t: dict[str, list[int]] = {}
    for t, i in vs:
        by_t.setdefault(t, []).append(i)
    return [(t, idx[r]) for r in range(per_template) for t, idx in sorted(by_t.items()) if r < len(idx)]
