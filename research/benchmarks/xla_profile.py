"""Where the device time of a jitted call goes: a jax.profiler trace, its ops mapped to categories.

XLA:CPU runs each HLO op (a fusion, a dot, a copy) as one traced event; the compiled HLO text gives each op's
`op_name` metadata, which carries the `jax.named_scope`s (and flax module paths) it came from. Summing event
durations per category answers "how much of a decode step is the LM head / MoE / attention / sampling".
Durations are wall time per op on its thread, so on a loaded machine they stretch with it; read the shares.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
from collections.abc import Callable, Sequence

import jax

_OP = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) [^\n]*$", re.M)
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SKIP = ("ThunkExecutor", "while", "cond", "call")


def op_names(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> "op_name metadata (jit path and named scopes) | result shape". Passes that
    create ops (dot rewrites) can drop the metadata; the shape then still identifies e.g. the LM head."""
    out = {}
    for m in _OP.finditer(hlo_text):
        name = _OP_NAME.search(m.group(0))
        out[m.group(1)] = f"{name.group(1) if name else ''}|{m.group(2)}"
    return out


def trace_ops(fn: Callable[[], object], *, calls: int) -> dict[str, float]:
    """Runs `fn` `calls` times under the profiler; returns XLA op name -> milliseconds per call (summed over
    threads). Control-flow containers (while, conditional) are left out: their bodies' ops are counted."""
    fn()
    d = tempfile.mkdtemp(prefix="xla_profile_")
    with jax.profiler.trace(d):
        for _ in range(calls):
            fn()
    path = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)[0]
    total: collections.Counter = collections.Counter()
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            if "XLA" not in line.name and "PjRt" not in line.name:
                continue
            for ev in line.events:
                if not ev.name.startswith(_SKIP):
                    total[ev.name] += ev.duration_ns / 1e6 / calls
    return dict(total)


def by_category(times_ms: dict[str, float], names: dict[str, str], categories: Sequence[tuple[str, str]]) -> dict:
    """Sums op times into the first category whose pattern (a regex) matches the op's `op_names` entry (op_name
    and shape); else "other"."""
    out: collections.Counter = collections.Counter()
    for op, ms in times_ms.items():
        path = names.get(op, op)
        cat = next((c for c, pat in categories if re.search(pat, path)), "other")
        out[cat] += ms
    return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
