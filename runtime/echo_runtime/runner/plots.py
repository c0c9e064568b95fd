"""PNG plots of a run: reward and held-out accuracy vs wall-clock and vs step; consumed staleness."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt


def plot_run(records: Iterable[Mapping[str, Any]], out_dir: Path, title: str) -> list[Path]:
    """Write ``curves.png`` and ``staleness.png`` into ``out_dir``; return their paths."""
    records = list(records)
    status = [r for r in records if r.get("kind") == "status" and r.get("reward") is not None]
    evals = sorted((r for r in records if r.get("kind") == "eval"), key=lambda r: r["policyVersion"])
    out_dir.mkdir(parents=True, exist_ok=True)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for ax, key, label in ((axes[0], "time", "wall-clock (s)"), (axes[1], "policyVersion", "policy version")):
        if status:
            ax.plot(
                [r[key] for r in status], [r["reward"] for r in status], label="training reward", alpha=0.7
            )
        if evals:
            xs = [e.get("publishedAt", e["time"]) if key == "time" else e["policyVersion"] for e in evals]
            ax.plot(xs, [e["heldoutAccuracy"] for e in evals], marker="o", label="held-out accuracy")
        ax.set_xlabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(title)
    curves = out_dir / "curves.png"
    fig.savefig(curves, dpi=110)
    plt.close(fig)

    histogram: Mapping[str, int] = {}
    for r in records:
        if r.get("kind") == "status" and r.get("stalenessHistogram"):
            histogram = r["stalenessHistogram"]
    fig, ax = plt.subplots(figsize=(5, 3.5), constrained_layout=True)
    keys = sorted(histogram, key=int)
    ax.bar([int(k) for k in keys], [histogram[k] for k in keys])
    ax.set_xlabel("staleness of consumed rollouts (versions)")
    ax.set_ylabel("groups")
    ax.set_title(f"{title}: staleness consumed")
    staleness = out_dir / "staleness.png"
    fig.savefig(staleness, dpi=110)
    plt.close(fig)
    return [curves, staleness]
