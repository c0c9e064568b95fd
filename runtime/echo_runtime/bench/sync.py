"""``echorl bench sync``, the pure part: per-run measures, confidence intervals over seeds, the table.

Inputs are finished ``echorl run`` directories (``summary.json`` + ``metrics.jsonl``); nothing here
runs a process or draws a plot, so the same runs always give the same ``results.json``.

Definitions (one per measure, used by the table, the JSON and the plots):

* **training wall-clock**: seconds from the run's start (before any model is loaded: process start-up
  counts) to the last optimizer step. The final evaluation after it is not training time.
* **time-to-target**: wall-clock at which the first policy version whose held-out accuracy reaches the
  target was *published* (evaluation lag excluded), and that version (= optimizer steps). A seed that
  never reaches it is counted in ``reached`` and left out of the mean: a censored value, flagged.
* **trainer busy fraction**: Σ ``stepSeconds`` (forward/backward/AdamW) / training wall-clock.
* **rollouts/s**: rollouts consumed by optimizer steps / training wall-clock.
* **snapshot load overhead**: Σ workers' snapshot-load seconds / Σ workers' wall seconds (0 for
  Colocated: it samples with the weights it trains).
* **worker busy fraction**: Σ workers' sampling seconds / Σ workers' wall seconds (Colocated, which
  samples in its own process, reports its sampling share; none without worker timing).
* **snapshot traffic**: the workers' snapshot loads, and the bytes they moved: for each load, the bytes
  the store holds for that version (an adapter, a full model, or a delta; a version retention has
  already collected counts as the median of those still held — adapters and deltas of one job are
  all about one size). Read from the run's store by ``bench/sync_run.py``; 0 for Colocated.
* **staleness consumed**: the coordinator's histogram of consumed groups by staleness; its mean.
* **G and T** per step: generation seconds per batch (Colocated: its ``sampleSeconds``; decoupled:
  Σ workers' sampling seconds / steps) and training seconds per step (``stepSeconds``); with one thread
  per process, as the offload framing pins them, these are core-seconds. **Seconds per step**: training
  wall-clock / steps.
* **Offload bound** (``--framing offload``): Colocated alternates G and T on the trainer's cores; with
  generation moved to added cores the best a decoupled run can do is overlap them perfectly, so the
  speedup is at most ``(G + T) / max(G, T)``, G and T from the Colocated runs. Each configuration's
  speedup (Colocated's seconds per step over its own, bootstrap CI) is reported beside it, and as a
  fraction of it. In the equal-hardware framing every run has the same cores and the same work to do
  on them, so overlap has no such head-room (bound 1): what it can win there is only what one
  process's threads leave unused.
* **Steady state**: seconds per step and trainer busy fraction between the first and the last optimizer
  step (start-up, model loading and the first batch left out): what a long run converges to.
* **95% CI** across seeds: Student-t interval ``mean ± t₀.₉₇₅,n−1 · s/√n`` (n ≥ 2; cut to [0, 1] for
  fractions — accuracy, busy and load fractions — whose mean cannot leave it), and a seeded
  percentile bootstrap of the mean (reported too; with 3 seeds it is narrow and should be read with
  the t-interval). **Speedup** of a configuration: Colocated's mean over its mean for time-to-target
  (higher is faster), its mean over Colocated's for rollouts/s; CI by bootstrap of the ratio of means,
  the two configurations' seeds resampled independently.

The statistics are ``scipy.stats``'s (``t``, ``sem``, ``bootstrap``), not hand-written.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

BASELINE = "Colocated"
FRACTIONS = frozenset(
    {"finalHeldoutAccuracy", "trainerBusyFraction", "steadyTrainerBusyFraction", "workerBusyFraction",
     "snapshotLoadFraction"}
)  # fmt: skip
"""Measures that are fractions: their intervals are cut to [0, 1]."""
BOOTSTRAP_RESAMPLES = 2000

SCALARS = (
    "timeToTargetSeconds",
    "stepsToTarget",
    "finalHeldoutAccuracy",
    "trainerBusyFraction",
    "rolloutsPerSecond",
    "snapshotLoadFraction",
    "droppedGroups",
    "weightedGroups",
    "meanStaleness",
    "trainingSeconds",
    "generateSecondsPerStep",
    "trainSecondsPerStep",
    "secondsPerStep",
    "steadySecondsPerStep",
    "steadyTrainerBusyFraction",
    "workerBusyFraction",
    "snapshotLoads",
    "snapshotMegabytes",
)


def t_quantile(df: int) -> float:
    """``t_{0.975, df}``, Student's t quantile (``scipy.stats.t``)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be ≥ 1, got {df}")
    return float(stats.t.ppf(0.975, df))


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The 95% Student-t interval of the mean; None with fewer than 2 values."""
    if len(values) < 2:
        return None
    x = np.asarray(values, dtype=np.float64)
    mean, sem = float(x.mean()), float(stats.sem(x))
    if sem == 0.0:  # every value equal: scipy's interval is undefined (scale 0); the mean is exact
        return mean, mean
    low, high = stats.t.interval(0.95, len(x) - 1, loc=mean, scale=sem)
    return float(low), float(high)


def _mean(sample: np.ndarray, axis: int = -1) -> Any:
    return np.mean(sample, axis=axis)


def bootstrap_interval(
    values: Sequence[float], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float] | None:
    """The 95% percentile-bootstrap interval of the mean (seeded); None with fewer than 2 values."""
    if len(values) < 2:
        return None
    x = np.asarray(values, dtype=np.float64)
    found = stats.bootstrap(
        (x,),
        _mean,
        n_resamples=resamples,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def _ratio_of_means(a: np.ndarray, b: np.ndarray, axis: int = -1) -> Any:
    return np.mean(a, axis=axis) / np.mean(b, axis=axis)


def ratio_interval(
    numerator: Sequence[float], denominator: Sequence[float], *, seed: int = 0
) -> tuple[float, tuple[float, float] | None] | None:
    """``mean(numerator) / mean(denominator)`` and its 95% percentile-bootstrap interval.

    The two samples are resampled independently (they are different configurations' seeds). The
    interval is None with fewer than 2 values on a side, or when a denominator value is 0 or the
    values change sign (a resample could then divide by zero).
    """
    if not numerator or not denominator or float(np.mean(denominator)) == 0.0:
        return None
    a, b = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    ratio = float(a.mean() / b.mean())
    if len(a) < 2 or len(b) < 2 or not (np.all(b > 0) or np.all(b < 0)):
        return ratio, None
    found = stats.bootstrap(
        (a, b),
        _ratio_of_means,
        n_resamples=BOOTSTRAP_RESAMPLES,
        confidence_level=0.95,
        method="percentile",
        paired=False,
        rng=np.random.default_rng(seed),
    )
    return ratio, (float(found.confidence_interval.low), float(found.confidence_interval.high))


def describe(
    values: Iterable[float | None], *, seed: int = 0, within: tuple[float, float] | None = None
) -> dict[str, Any]:
    """Mean, sample standard deviation, t and bootstrap 95% intervals of the non-missing values.
    ``within``: the range the measure cannot leave (a fraction: 0–1); the t-interval is cut to it, as
    the mean cannot lie outside (with 2–3 seeds the raw interval often spans past both ends)."""
    present = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    ci = t_interval(present)
    if ci is not None and within is not None:
        ci = (max(ci[0], within[0]), min(ci[1], within[1]))
    return {
        "n": len(present),
        "values": present,
        "mean": float(np.mean(present)) if present else None,
        "std": float(np.std(present, ddof=1)) if len(present) > 1 else None,
        "ci95": ci,
        "bootstrap95": bootstrap_interval(present, seed=seed),
    }


# --------------------------------------------------------------------------------------------- runs
def run_measures(
    summary: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    target: float | None,
    traffic: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The measures of one run (module docstring) from its ``summary.json`` and ``metrics.jsonl``, and
    ``traffic`` (``{"loads": n, "bytes": b}``: the workers' snapshot loads) where the caller read it."""
    steps = [r for r in records if r.get("kind") == "trainer"]
    training = max((float(r.get("time", 0.0)) for r in steps), default=0.0)
    busy = sum(float(r.get("stepSeconds", 0.0)) for r in steps)
    consumed = sum(int(r.get("rollouts", 0)) for r in steps)
    timing = summary.get("workerTiming") or {}
    load = sum(float(w.get("loadSeconds") or 0.0) for w in timing.values())
    wall = sum(float(w.get("wallSeconds") or 0.0) for w in timing.values())
    sampling = sum(float(w.get("sampleSeconds") or 0.0) for w in timing.values())
    histogram = {str(k): int(v) for k, v in (summary.get("stalenessHistogram") or {}).items()}
    groups = sum(histogram.values())
    evaluations = [
        {"policyVersion": int(e["policyVersion"]), "heldoutAccuracy": float(e["heldoutAccuracy"]),
         "publishedAt": float(e.get("publishedAt") or 0.0)}
        for e in summary.get("evaluations", [])
    ]  # fmt: skip
    seconds, version = _time_to_target(evaluations, target)
    n = len(steps)
    ordered = sorted(steps, key=lambda r: float(r.get("time", 0.0)))
    times = [float(r.get("time", 0.0)) for r in ordered]
    sampled = [float(r["sampleSeconds"]) for r in steps if r.get("sampleSeconds") is not None]
    generate = sum(sampled) if sampled else sum(float(w.get("sampleSeconds") or 0.0) for w in timing.values())
    return {
        "policyVersion": summary.get("policyVersion"),
        "trainingSeconds": training,
        "timeToTargetSeconds": seconds,
        "stepsToTarget": version,
        "reachedTarget": seconds is not None,
        "initialHeldoutAccuracy": summary.get("initialHeldoutAccuracy"),
        "finalHeldoutAccuracy": summary.get("finalHeldoutAccuracy"),
        "trainerBusyFraction": busy / training if training > 0 else None,
        "generateSecondsPerStep": generate / n if n and generate > 0 else None,
        "trainSecondsPerStep": busy / n if n else None,
        "secondsPerStep": training / n if n and training > 0 else None,
        "steadySecondsPerStep": (times[-1] - times[0]) / (n - 1) if n > 1 and times[-1] > times[0] else None,
        "steadyTrainerBusyFraction": (
            sum(float(r.get("stepSeconds", 0.0)) for r in ordered[1:]) / (times[-1] - times[0])
            if n > 1 and times[-1] > times[0]
            else None
        ),
        "rolloutsPerSecond": consumed / training if training > 0 else None,
        "consumedRollouts": consumed,
        "snapshotLoadSeconds": load,
        "snapshotLoadFraction": load / wall if wall > 0 else 0.0,
        "workerBusyFraction": sampling / wall if wall > 0 else None,
        "snapshotLoads": int(traffic["loads"]) if traffic else 0,
        "snapshotMegabytes": float(traffic["bytes"]) / 1e6 if traffic else 0.0,
        "droppedGroups": int(summary.get("droppedStale") or 0),
        "weightedGroups": int(summary.get("weightedStale") or 0),
        "stalenessHistogram": histogram,
        "meanStaleness": sum(int(k) * v for k, v in histogram.items()) / groups if groups else None,
        "maxObservedStaleness": summary.get("maxObservedStaleness"),
        "evaluations": evaluations,
    }


def _time_to_target(
    evaluations: Sequence[Mapping[str, Any]], target: float | None
) -> tuple[float | None, int | None]:
    if target is None:
        return None, None
    for e in sorted(evaluations, key=lambda e: e["policyVersion"]):
        if e["heldoutAccuracy"] >= target:
            return float(e["publishedAt"]), int(e["policyVersion"])
    return None, None


# ---------------------------------------------------------------------------------------- aggregate
def accuracy_band(
    curves: Sequence[Sequence[Mapping[str, Any]]], points: int = 60
) -> dict[str, list[float | None]]:
    """Mean held-out accuracy vs wall-clock across seeds with a 95% t band, on a common time grid.

    Each seed's accuracy at time x is that of the newest version published by x (a step function).
    The grid ends at the earliest last evaluation, so every point averages every seed.
    """
    usable = [sorted(c, key=lambda e: e["publishedAt"]) for c in curves if c]
    if not usable:
        return {"time": [], "mean": [], "low": [], "high": []}
    end = min(c[-1]["publishedAt"] for c in usable)
    grid = np.linspace(0.0, end, points) if end > 0 else np.array([0.0])
    mean: list[float | None] = []
    low: list[float | None] = []
    high: list[float | None] = []
    for x in grid:
        ys = [next((e["heldoutAccuracy"] for e in reversed(c) if e["publishedAt"] <= x), c[0]["heldoutAccuracy"])
              for c in usable]  # fmt: skip
        mean.append(float(np.mean(ys)))
        ci = t_interval(ys)
        low.append(ci[0] if ci else None)
        high.append(ci[1] if ci else None)
    return {"time": [float(x) for x in grid], "mean": mean, "low": low, "high": high}


def aggregate(
    runs: Mapping[str, Sequence[Mapping[str, Any]]], target: float | None, framing: str = "equal"
) -> dict[str, Any]:
    """Per configuration: every scalar described across seeds, the summed staleness histogram, the
    accuracy band, and speedups relative to Colocated (when it is in the grid), with the offload bound
    in the offload framing."""
    configs: dict[str, Any] = {}
    for offset, (name, measures) in enumerate(runs.items()):
        histogram: dict[str, int] = {}
        for m in measures:
            for k, v in m["stalenessHistogram"].items():
                histogram[k] = histogram.get(k, 0) + int(v)
        configs[name] = {
            "seeds": len(measures),
            "reachedTarget": sum(bool(m["reachedTarget"]) for m in measures),
            "stalenessHistogram": dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
            "maxObservedStaleness": max(
                (m["maxObservedStaleness"] for m in measures if m["maxObservedStaleness"] is not None),
                default=None,
            ),
            "accuracyBand": accuracy_band([m["evaluations"] for m in measures]),
            **{
                key: describe(
                    (m[key] for m in measures), seed=offset, within=(0.0, 1.0) if key in FRACTIONS else None
                )
                for key in SCALARS
            },
        }
    base = runs.get(BASELINE)
    for name, measures in runs.items():
        speed: dict[str, Any] = {}
        if base is not None:
            speed["timeToTarget"] = _ratio(
                [m["timeToTargetSeconds"] for m in base], [m["timeToTargetSeconds"] for m in measures]
            )
            speed["rolloutsPerSecond"] = _ratio(
                [m["rolloutsPerSecond"] for m in measures], [m["rolloutsPerSecond"] for m in base]
            )
            speed["secondsPerStep"] = _ratio(
                [m["secondsPerStep"] for m in base], [m["secondsPerStep"] for m in measures]
            )
            speed["steadySecondsPerStep"] = _ratio(
                [m["steadySecondsPerStep"] for m in base], [m["steadySecondsPerStep"] for m in measures]
            )
        configs[name]["speedupVsColocated"] = speed
    reference = configs[BASELINE]["finalHeldoutAccuracy"].get("ci95") if base is not None else None
    for c in configs.values():
        mean = c["finalHeldoutAccuracy"]["mean"]
        # The accuracy goal: a configuration's mean final accuracy inside Colocated's interval.
        c["finalAccuracyInsideColocatedCI"] = (
            None if reference is None or mean is None else bool(reference[0] <= mean <= reference[1])
        )
    bound = offload_bound(base) if base is not None else None
    if bound is not None:
        for c in configs.values():
            for key, out in (
                ("secondsPerStep", "offloadBoundFraction"),
                ("steadySecondsPerStep", "steadyOffloadBoundFraction"),
            ):
                per_step = (c["speedupVsColocated"] or {}).get(key)
                c[out] = (
                    None
                    if per_step is None or framing != "offload"
                    else {
                        "ratio": per_step["ratio"] / bound["bound"],
                        "ci95": _scaled(per_step.get("ci95"), bound["bound"]),
                    }
                )
    return {
        "targetAccuracy": target,
        "baseline": BASELINE if base is not None else None,
        "framing": framing,
        "bound": None
        if bound is None
        else {**bound, "bound": bound["bound"] if framing == "offload" else 1.0},
        "configs": configs,
    }


def offload_bound(colocated: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """G, T (means over the Colocated runs) and the offload bound (G + T) / max(G, T)."""
    g = [float(m["generateSecondsPerStep"]) for m in colocated if m.get("generateSecondsPerStep")]
    t = [float(m["trainSecondsPerStep"]) for m in colocated if m.get("trainSecondsPerStep")]
    if not g or not t:
        return None
    gen, train = float(np.mean(g)), float(np.mean(t))
    return {
        "generateSecondsPerStep": gen,
        "trainSecondsPerStep": train,
        "bound": (gen + train) / max(gen, train),
    }


def _scaled(ci: Sequence[float] | None, by: float) -> list[float] | None:
    return None if not ci else [float(ci[0]) / by, float(ci[1]) / by]


def bound_text(results: Mapping[str, Any]) -> str:
    """The framing and, in the offload framing, each configuration's speedup against the bound."""
    bound = results.get("bound")
    if not bound:
        return ""
    g, t = bound["generateSecondsPerStep"], bound["trainSecondsPerStep"]
    if results.get("framing") != "offload":
        return (
            f"Equal hardware: every run has the same cores. Colocated: G = {g:.2f} s generating and "
            f"T = {t:.2f} s training per step, one after the other on all of them; a decoupled run splits "
            "the same cores, so its bound is 1 (see `docs/benchmarks/README.md`).\n\n"
        )
    lines = [
        f"Offload framing: Colocated generates for G = {g:.2f} s and trains for T = {t:.2f} s per step on "
        f"the trainer's cores; moving generation to added cores can speed it up at most "
        f"(G + T) / max(G, T) = **{bound['bound']:.2f}×**.",
        "",
        "Whole run (start-up included) | steady state (first to last step):",
        "",
        "| configuration | seconds per step | speedup vs Colocated | fraction of the bound | "
        "steady seconds per step | steady speedup | steady fraction of the bound | steady trainer busy | "
        "final accuracy (inside Colocated's CI?) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in results["configs"].items():
        speed = c.get("speedupVsColocated") or {}
        lines.append(
            f"| {name} | {_fmt(c['secondsPerStep'], 2)} | {_speed_text(speed.get('secondsPerStep'))} | "
            f"{_fraction_text(c.get('offloadBoundFraction'))} | {_fmt(c['steadySecondsPerStep'], 2)} | "
            f"{_speed_text(speed.get('steadySecondsPerStep'))} | "
            f"{_fraction_text(c.get('steadyOffloadBoundFraction'))} | "
            f"{_fmt(c['steadyTrainerBusyFraction'], 1, 100.0)} % | "
            f"{_inside_text(c)} |"
        )
    return "\n".join(lines) + "\n\n"


def _ratio(numerator: Sequence[float | None], denominator: Sequence[float | None]) -> dict[str, Any] | None:
    a = [float(v) for v in numerator if v is not None]
    b = [float(v) for v in denominator if v is not None]
    found = ratio_interval(a, b)
    if found is None:
        return None
    return {"ratio": found[0], "ci95": found[1]}


# -------------------------------------------------------------------------------------------- table
def _fmt(d: Mapping[str, Any], digits: int = 2, scale: float = 1.0) -> str:
    if d.get("mean") is None:
        return "–"
    text = f"{d['mean'] * scale:.{digits}f}"
    if d.get("ci95"):
        low, high = d["ci95"]
        text += f" [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"
    return text


def markdown_table(results: Mapping[str, Any]) -> str:
    """The results as a markdown table: mean [95% t-interval] across seeds per configuration."""
    target = results.get("targetAccuracy")
    header = (
        "| configuration | seeds | time-to-target (s) | steps-to-target | reached | final accuracy | "
        "trainer busy | worker busy | rollouts/s | snapshot load | snapshot loads | MB moved | dropped | weighted | "
        "staleness consumed (mean; histogram) | "
        "speedup (time-to-target) | speedup (rollouts/s) |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for name, c in results["configs"].items():
        speed = c.get("speedupVsColocated") or {}
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    str(c["seeds"]),
                    _fmt(c["timeToTargetSeconds"], 1),
                    _fmt(c["stepsToTarget"], 1),
                    f"{c['reachedTarget']}/{c['seeds']}" if target is not None else "–",
                    _fmt(c["finalHeldoutAccuracy"], 3),
                    _fmt(c["trainerBusyFraction"], 1, 100.0) + " %",
                    _fmt(c["workerBusyFraction"], 1, 100.0) + " %",
                    _fmt(c["rolloutsPerSecond"], 2),
                    _fmt(c["snapshotLoadFraction"], 1, 100.0) + " %",
                    _fmt(c["snapshotLoads"], 1),
                    _fmt(c["snapshotMegabytes"], 1),
                    _fmt(c["droppedGroups"], 1),
                    _fmt(c["weightedGroups"], 1),
                    _fmt(c["meanStaleness"], 2) + "; " + _histogram_text(c["stalenessHistogram"]),
                    _speed_text(speed.get("timeToTarget")),
                    _speed_text(speed.get("rolloutsPerSecond")),
                ]
            )
            + " |"
        )
    notes = [
        "",
        "Mean [95% Student-t interval] across seeds. "
        + (f"Target held-out accuracy {target}; " if target is not None else "")
        + "time-to-target is the wall-clock at which the first version reaching it was published, "
        "averaged over the seeds that reached it (`reached`). Speedups are relative to Colocated "
        "(bootstrap 95% interval of the ratio of means).",
    ]
    return "\n".join(lines + notes) + "\n"


def _inside_text(c: Mapping[str, Any]) -> str:
    mean = c["finalHeldoutAccuracy"]["mean"]
    inside = c.get("finalAccuracyInsideColocatedCI")
    if mean is None:
        return "–"
    return f"{mean:.3f}" + ("" if inside is None else " (yes)" if inside else " (no)")


def _fraction_text(fraction: Mapping[str, Any] | None) -> str:
    return _speed_text(fraction).replace("×", "")


def _histogram_text(histogram: Mapping[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in histogram.items()) or "–"


def _speed_text(speed: Mapping[str, Any] | None) -> str:
    if not speed:
        return "–"
    text = f"{speed['ratio']:.2f}×"
    if speed.get("ci95"):
        low, high = speed["ci95"]
        text += f" [{low:.2f}, {high:.2f}]"
    return text
