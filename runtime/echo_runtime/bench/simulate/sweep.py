"""Grids of simulations: Δmax × pool sizes × buffer sizes, each averaged over seeds; a table and a plot.

Promises: the grid is the full product of the values given (a missing axis is the base configuration's
value); point ``i`` of the grid is simulated with seeds ``base.seed .. base.seed + seeds − 1``, so a sweep
is as deterministic as one simulation; the table and the JSON report the mean and, with several seeds,
the standard deviation over seeds.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from echo_runtime.bench.simulate import engine
from echo_runtime.bench.simulate.config import SimConfig
from echo_runtime.bench.simulate.results import SimResult

METRICS: dict[str, Callable[[SimResult], float]] = {
    "rolloutsPerSecond": lambda r: r.rollouts_per_second,
    "consumedRolloutsPerSecond": lambda r: r.consumed_rollouts_per_second,
    "trainerBusyFraction": lambda r: r.trainer_busy_fraction,
    "stepsPerHour": lambda r: r.steps * 3600.0 / r.seconds if r.seconds else 0.0,
    "meanStaleness": lambda r: r.mean_staleness if r.mean_staleness is not None else 0.0,
    "droppedFraction": lambda r: r.groups.dropped_total / r.groups.generated if r.groups.generated else 0.0,
    "snapshotEgressMBps": lambda r: r.snapshot_egress_mb_per_s,
}
"""The per-point summaries (name → value of one result); averaged over seeds."""


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One point of the grid and its results over seeds."""

    max_staleness: int
    pools: dict[str, int]
    buffer_size: int
    results: tuple[SimResult, ...]

    def mean(self, metric: str) -> float:
        return statistics.fmean(METRICS[metric](r) for r in self.results)

    def std(self, metric: str) -> float:
        values = [METRICS[metric](r) for r in self.results]
        return statistics.stdev(values) if len(values) > 1 else 0.0

    def utilisation(self) -> dict[str, float]:
        names = self.results[0].classes
        return {name: statistics.fmean(r.classes[name].utilisation for r in self.results) for name in names}

    def staleness_histogram(self) -> dict[int, int]:
        total: dict[int, int] = {}
        for r in self.results:
            for k, v in r.staleness_histogram.items():
                total[k] = total.get(k, 0) + v
        return dict(sorted(total.items()))

    def to_mapping(self) -> dict[str, Any]:
        return {
            "maxStaleness": self.max_staleness,
            "pools": self.pools,
            "bufferSize": self.buffer_size,
            "seeds": len(self.results),
            "mean": {m: self.mean(m) for m in METRICS},
            "std": {m: self.std(m) for m in METRICS},
            "utilisation": self.utilisation(),
            "stalenessHistogram": {str(k): v for k, v in self.staleness_histogram().items()},
            "violations": sum(r.violations for r in self.results),
            "runs": [{k: v for k, v in r.to_mapping().items() if k != "config"} for r in self.results],
        }


def sweep(
    base: SimConfig,
    *,
    max_staleness: Sequence[int] | None = None,
    pools: Sequence[Mapping[str, int]] | None = None,
    buffer_sizes: Sequence[int | None] | None = None,
    seeds: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> list[SweepPoint]:
    """Simulate every combination of the axes (each ``None`` axis: the base value)."""
    if seeds < 1:
        raise ValueError(f"seeds: must be ≥ 1, got {seeds}")
    deltas = list(max_staleness) if max_staleness else [base.max_staleness]
    variants = [dict(p) for p in pools] if pools else [{}]
    buffers = list(buffer_sizes) if buffer_sizes else [base.buffer_size]
    grid = list(itertools.product(variants, buffers, deltas))
    points = []
    for i, (variant, buffer, delta) in enumerate(grid):
        config = base.with_pools(variant).with_max_staleness(delta).replace(buffer_size=buffer)
        runs = tuple(engine.simulate(config.replace(seed=base.seed + s)) for s in range(seeds))
        points.append(SweepPoint(delta, config.pool_sizes(), config.buffer_capacity, runs))
        if progress is not None:
            progress(i + 1, len(grid))
    return points


def table(points: Sequence[SweepPoint]) -> str:
    """A plain-text table of the sweep (one row per point)."""
    header = [
        "Δmax",
        "pools",
        "buffer",
        "rollouts/s",
        "consumed/s",
        "busy",
        "steps/h",
        "stale",
        "dropped",
        "egress MB/s",
        "utilisation",
    ]
    rows = [header]
    for p in points:
        rows.append(
            [
                str(p.max_staleness),
                " ".join(f"{k}={v}" for k, v in p.pools.items()),
                str(p.buffer_size),
                _pm(p, "rolloutsPerSecond", "{:.1f}"),
                _pm(p, "consumedRolloutsPerSecond", "{:.1f}"),
                _pm(p, "trainerBusyFraction", "{:.3f}"),
                _pm(p, "stepsPerHour", "{:.0f}"),
                f"{p.mean('meanStaleness'):.2f}",
                f"{100 * p.mean('droppedFraction'):.1f}%",
                f"{p.mean('snapshotEgressMBps'):.0f}",
                " ".join(f"{k}:{v:.2f}" for k, v in p.utilisation().items()),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _pm(point: SweepPoint, metric: str, fmt: str) -> str:
    text = fmt.format(point.mean(metric))
    if len(point.results) > 1:
        text += "±" + fmt.format(point.std(metric))
    return text


def plot(points: Sequence[SweepPoint], out: Path, title: str = "echorl simulate") -> Path:
    """Busy fraction, throughput and dropped work against Δmax, one line per pool/buffer variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[SweepPoint]] = {}
    for p in points:
        label = " ".join(f"{k}={v}" for k, v in p.pools.items()) + f" buf={p.buffer_size}"
        series.setdefault(label, []).append(p)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = [
        ("trainerBusyFraction", "trainer busy fraction"),
        ("consumedRolloutsPerSecond", "consumed rollouts/s"),
        ("droppedFraction", "dropped fraction of generated groups"),
    ]
    for ax, (metric, label) in zip(axes, panels, strict=True):
        for name, pts in series.items():
            pts = sorted(pts, key=lambda p: p.max_staleness)
            ax.errorbar(
                [p.max_staleness for p in pts],
                [p.mean(metric) for p in pts],
                yerr=[p.std(metric) for p in pts],
                marker="o",
                capsize=3,
                label=name,
            )
        ax.set_xlabel("Δmax (maxStaleness)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
