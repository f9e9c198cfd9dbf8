"""The eval report: a text table, report.json, report.csv and a PNG plot (pass@k per harness/category)."""

from __future__ import annotations

import csv
import dataclasses
import json
import pathlib
from collections.abc import Sequence

from harness_env.eval.metrics import Row


def text_table(rows: Sequence[Row], ks: Sequence[int]) -> str:
    cols = [f"pass@{k}" for k in ks] + [f"pass^{k}" for k in ks if k > 1]
    head = ["harness", "category", "tasks", "rollouts", *cols, "reward", "statuses"]
    lines = [head]
    for r in rows:
        vals = [f"{r.metrics[c]:.3f}" if c in r.metrics else "-" for c in cols]
        st = " ".join(f"{k}={v}" for k, v in sorted(r.statuses.items()))
        lines.append([r.harness, r.group, str(r.tasks), str(r.rollouts), *vals, f"{r.mean_reward:.3f}", st])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def write_csv(rows: Sequence[Row], path: pathlib.Path) -> None:
    metric_names = sorted({m for r in rows for m in r.metrics})
    statuses = sorted({s for r in rows for s in r.statuses})
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["harness", "category", "tasks", "rollouts", *metric_names, "mean_reward",
                    *[f"status_{s}" for s in statuses]])
        for r in rows:
            w.writerow([r.harness, r.group, r.tasks, r.rollouts, *[r.metrics.get(m, "") for m in metric_names],
                        r.mean_reward, *[r.statuses.get(s, 0) for s in statuses]])


def plot(rows: Sequence[Row], ks: Sequence[int], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    harnesses = sorted({r.harness for r in rows})
    cats = sorted({r.group for r in rows}, key=lambda g: (g != "all", g))
    fig, axes = plt.subplots(1, len(ks), figsize=(4 + 2.5 * len(ks), 3.5), squeeze=False)
    width = 0.8 / max(1, len(harnesses))
    for ax, k in zip(axes[0], ks):
        for i, h in enumerate(harnesses):
            vals = [next((r.metrics.get(f"pass@{k}", 0.0) for r in rows if r.harness == h and r.group == c), 0.0)
                    for c in cats]
            ax.bar([j + i * width for j in range(len(cats))], vals, width, label=h)
        ax.set_xticks([j + width * (len(harnesses) - 1) / 2 for j in range(len(cats))], cats, rotation=45,
                      ha="right", fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_title(f"pass@{k}")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(out_dir: pathlib.Path, rows: Sequence[Row], ks: Sequence[int], behaviour: dict | None = None,
                 extra: dict | None = None) -> dict[str, pathlib.Path]:
    """Writes report.json / report.csv / report.png / report.txt into out_dir; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {k: out_dir / f"report.{k}" for k in ("json", "csv", "png", "txt")}
    doc = {"ks": list(ks), "rows": [dataclasses.asdict(r) for r in rows], "behaviour": behaviour or {},
           **(extra or {})}
    paths["json"].write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    write_csv(rows, paths["csv"])
    plot(rows, ks, paths["png"])
    text = text_table(rows, ks)
    if behaviour:
        text += "\n\nbehaviour (per harness):\n" + "\n".join(
            f"  {h}: " + json.dumps(v, sort_keys=True) for h, v in sorted(behaviour.items()))
    paths["txt"].write_text(text + "\n")
    return paths
