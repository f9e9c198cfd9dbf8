"""Inline SVG line charts of metrics.jsonl series (no plotting library, no script: the page works offline).

Why server-side SVG: a chart is a few hundred points; drawing it here keeps the viewer one HTML response with
nothing to fetch, and the same markup renders in a browser, in headless Chromium and in a saved page.
"""

from __future__ import annotations

import html
import math

# (title, [(series label, record kind, key), ...]) of the metrics page; series absent from the run are left out
CHARTS = [
    ("reward", [("train", "train", "rollout/all/reward"), ("held-out", "eval", "eval/all/reward")]),
    ("pass rate", [("train", "train", "rollout/all/pass_rate"), ("held-out", "eval", "eval/all/pass_rate")]),
    ("KL", [("kl_ref", "train", "kl_ref"), ("kl_old_new", "train", "kl_old_new"),
            ("mismatch_k3", "train", "mismatch_k3")]),
    ("clip fraction", [("clip_frac", "train", "clip_frac")]),
    ("entropy", [("rl", "train", "entropy"), ("sft", "sft", "entropy")]),
    ("signal groups", [("signal_groups", "train", "signal_groups"), ("groups", "train", "groups")]),
    ("loss", [("rl", "train", "loss"), ("sft", "sft", "loss")]),
]
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
MAX_POINTS = 600
W, H, PAD_L, PAD_B = 440, 190, 52, 28


def series(records: list[dict], kind: str, key: str) -> list[tuple[float, float]]:
    """(step, value) of one key in records of one kind; a key logged twice at a step keeps the last value."""
    pts: dict[float, float] = {}
    for r in records:
        v = r.get(key)
        if r.get("kind") == kind and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            pts[float(r["step"])] = float(v)
    out = sorted(pts.items())
    if len(out) > MAX_POINTS:  # every k-th point, the last one kept
        k = -(-len(out) // MAX_POINTS)
        out = out[::k] + ([out[-1]] if (len(out) - 1) % k else [])
    return out


def numeric_keys(records: list[dict]) -> list[tuple[str, str]]:
    """(kind, key) of every numeric series in the records (the metrics page's key picker)."""
    seen = {(r.get("kind", ""), k) for r in records for k, v in r.items()
            if k not in ("kind", "step") and isinstance(v, int | float) and not isinstance(v, bool)}
    return sorted(seen)


def _ticks(lo: float, hi: float, integer: bool = False) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / 3))
    if integer:
        step = max(step, 1)
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= 5:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def line_chart(title: str, lines: list[tuple[str, list[tuple[float, float]]]]) -> str:
    """An SVG chart of named (x, y) series; an empty chart says so."""
    lines = [(name, pts) for name, pts in lines if pts]
    head = f'<figure class="chart"><figcaption>{html.escape(title)}</figcaption>'
    if not lines:
        return head + '<div class="empty">no data yet</div></figure>'
    xs = [x for _, pts in lines for x, _ in pts]
    ys = [y for _, pts in lines for _, y in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 - y0 < 1e-12:
        y0, y1 = y0 - 0.5, y1 + 0.5
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    sx = lambda x: PAD_L + (x - x0) / (x1 - x0) * (W - PAD_L - 10)
    sy = lambda y: H - PAD_B - (y - y0) / (y1 - y0) * (H - PAD_B - 10)
    parts = [f'<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img">',
             f'<rect x="{PAD_L}" y="10" width="{W - PAD_L - 10}" height="{H - PAD_B - 10}" fill="#fafafa" '
             'stroke="#ccc"/>']
    for t in _ticks(y0, y1):
        parts.append(f'<line x1="{PAD_L}" x2="{W - 10}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#eee"/>'
                     f'<text x="{PAD_L - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:.4g}</text>')
    for t in _ticks(x0, x1, integer=all(float(x).is_integer() for x in xs)):
        parts.append(f'<text x="{sx(t):.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{t:.6g}</text>')
    for i, (name, pts) in enumerate(lines):
        c = COLOURS[i % len(COLOURS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(f'<polyline class="series" data-name="{html.escape(name)}" data-points="{len(pts)}" '
                     f'fill="none" stroke="{c}" stroke-width="1.6" points="{coords}"/>')
        if len(pts) <= 60:
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{c}"><title>'
                      f'{html.escape(name)} step {x:g}: {y:.5g}</title></circle>' for x, y in pts]
        parts.append(f'<text x="{PAD_L + 6 + 90 * i}" y="24" fill="{c}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return head + "".join(parts) + "</figure>"


def metric_charts(records: list[dict], extra: list[tuple[str, str]] = (), only: tuple[str, ...] = ()) -> str:
    """The metrics page's charts: the fixed set (or those titled in `only`), then one per requested (kind, key)."""
    out = [line_chart(title, [(name, series(records, kind, key)) for name, kind, key in spec])
           for title, spec in CHARTS if not only or title in only]
    out += [line_chart(f"{kind}: {key}", [(key, series(records, kind, key))]) for kind, key in extra]
    return "".join(out)
