"""``echorl bench sync`` plots from ``results.json``: accuracy vs wall-clock with 95% bands per
configuration, the staleness consumed per configuration, and speedup vs Δmax relative to Colocated."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never a window
import matplotlib.pyplot as plt


def plot_all(results: Mapping[str, Any], out: Path) -> list[Path]:
    """Write accuracy_vs_wallclock.png, staleness.png and speedup.png into ``out``; return their paths."""
    return [_accuracy(results, out), _staleness(results, out), _speedup(results, out)]


def _accuracy(results: Mapping[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for name, c in results["configs"].items():
        band = c["accuracyBand"]
        if not band["time"]:
            continue
        (line,) = ax.step(band["time"], band["mean"], where="post", label=f"{name} (n={c['seeds']})")
        if all(v is not None for v in band["low"]):
            ax.fill_between(
                band["time"], band["low"], band["high"], step="post", alpha=0.2, color=line.get_color()
            )
    if results.get("targetAccuracy") is not None:
        ax.axhline(results["targetAccuracy"], color="grey", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("wall-clock (s) at which the version was published")
    ax.set_ylabel("held-out accuracy (mean, 95% t band)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    path = out / "accuracy_vs_wallclock.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _staleness(results: Mapping[str, Any], out: Path) -> Path:
    configs = list(results["configs"].items())
    fig, axes = plt.subplots(1, max(1, len(configs)), figsize=(2.6 * max(1, len(configs)), 3), squeeze=False,
                             constrained_layout=True)  # fmt: skip
    for ax, (name, c) in zip(axes[0], configs, strict=False):
        histogram = c["stalenessHistogram"]
        total = sum(histogram.values()) or 1
        ax.bar([int(k) for k in histogram], [v / total for v in histogram.values()])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("staleness")
        ax.set_xticks(range(0, max([int(k) for k in histogram] or [0]) + 1))
    axes[0][0].set_ylabel("fraction of consumed groups")
    path = out / "staleness.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _speedup(results: Mapping[str, Any], out: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for ax, key, label in (
        (axes[0], "timeToTarget", "time-to-target"),
        (axes[1], "rolloutsPerSecond", "rollouts/s"),
    ):
        xs, ys, errs = [], [], []
        for name, c in results["configs"].items():
            speed = (c.get("speedupVsColocated") or {}).get(key)
            if speed is None:
                continue
            if name.startswith("Async:"):
                xs.append(int(name.split(":")[1]))
                ys.append(speed["ratio"])
                low, high = speed["ci95"] or (speed["ratio"], speed["ratio"])
                errs.append((speed["ratio"] - low, high - speed["ratio"]))
            else:
                ax.axhline(speed["ratio"], linestyle="--" if name == "Sequential" else ":", linewidth=1,
                           color="tab:orange" if name == "Sequential" else "grey", label=name)  # fmt: skip
        if xs:
            ax.errorbar(xs, ys, yerr=list(zip(*errs, strict=True)), marker="o", capsize=3, label="Async")
        ax.set_xlabel("Δmax (maxStaleness)")
        ax.set_ylabel(f"speedup vs Colocated ({label})")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:  # e.g. no seed reached the target: say so instead of an empty legend
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
    path = out / "speedup.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
