"""Fit the simulator to a measured local run, predict the run, and say how far off the prediction is.

A run directory of ``echorl run`` (runner/local.py) holds everything needed:

* ``job.yaml`` — mode, Δmax, refresh threshold, batch and group size, buffer size, pools (replicas,
  capacity), checkpoint interval;
* ``run.json`` — ``t0``, the wall-clock origin of every ``time`` in the metrics;
* ``metrics.jsonl`` — ``kind: status`` samples (which pools' workers are registered when) and
  ``kind: trainer`` records (``stepSeconds``, ``publishSeconds``, ``checkpointSeconds``, ``unixTime``);
* ``workers/<pool>-<i>.jsonl`` — every worker's ``sample`` events (seconds, groups) and ``load`` events;
  if absent, ``summary.json``'s ``workerTiming`` (per-worker ``sampleSeconds`` / ``rollouts``) is used;
* ``summary.json`` — the measured ``rolloutsPerSecond`` and ``trainerBusyFraction`` to predict.

What is fitted (inputs of the model, measured per run) and what is predicted (outputs) are kept apart:

* fitted: per pool the mean and CV of seconds per generated group and the mean snapshot-load time;
  the trainer's step time (mean, CV), publish and checkpoint time; when each pool's workers registered
  and when the trainer took its first batch (process start-up and model loading are not part of the
  protocol); the seconds after the last step until the run ended (the final evaluation);
* predicted, by simulating the same number of optimizer steps: the wall-clock of the run, hence
  ``trainerBusyFraction = Σ stepSeconds / wall`` (the steps' expected total over the predicted wall:
  for a fixed number of steps, predicting the busy fraction *is* predicting the wall-clock), and
  ``rolloutsPerSecond`` with the runner's own estimator (the mean of the coordinator's 30-second
  windowed rate over the status samples, sampled at the run's status interval until the trainer exits).

``relative error = (predicted − measured) / measured``. Everything here is pure except :func:`read_run`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from echo_runtime.bench.simulate import engine, results
from echo_runtime.bench.simulate.config import SimConfig, TrainerConfig, WorkerClass

LEASE_TIMEOUT = 15.0
"""``echorl run`` starts its coordinator with ``--lease-timeout 15``..."""
HEARTBEAT_INTERVAL = 1.0
"""... and ``--heartbeat-interval 1`` (so a worker retries an empty lease after 1 s)."""
TARGETS = ("rolloutsPerSecond", "trainerBusyFraction")


@dataclasses.dataclass(frozen=True)
class PoolMeasure:
    """What one pool's workers did in a run."""

    name: str
    replicas: int
    capacity: int
    lease_seconds: tuple[float, ...]
    """Seconds of each sampling call (one lease)..."""
    lease_groups: tuple[int, ...]
    """... and how many groups it generated."""
    load_seconds: tuple[float, ...]
    round_residuals: tuple[float, ...]
    """Per round, the seconds between two sampling calls not spent sampling or loading: the per-lease
    overhead, plus a retry wait when the lease came back empty."""
    joined_at: float | None
    """Seconds after ``t0`` when the pool's first worker was seen registered (None: never seen)."""
    long_poll: bool = True
    """Its workers long-poll for leases (their records carry ``leaseSeconds``); older workers polled."""


@dataclasses.dataclass(frozen=True)
class StepMeasure:
    step_seconds: float
    publish_seconds: float
    checkpoint_seconds: float
    ended_at: float
    """Seconds after ``t0`` when the step's publish (and checkpoint) finished."""

    @property
    def started_at(self) -> float:
        return self.ended_at - self.step_seconds - self.publish_seconds - self.checkpoint_seconds


@dataclasses.dataclass(frozen=True)
class MeasuredRun:
    """A local run, reduced to what the fit and the comparison need."""

    name: str
    mode: str
    max_staleness: int
    refresh_threshold: int
    stale_action: str
    group_size: int
    batch_size: int
    buffer_size: int | None
    checkpoint_interval: int
    pools: tuple[PoolMeasure, ...]
    steps: tuple[StepMeasure, ...]
    status_times: tuple[float, ...]
    status_rates: tuple[float, ...]
    wall_seconds: float
    measured: dict[str, float]
    """``rolloutsPerSecond`` and ``trainerBusyFraction`` as the run's ``summary.json`` has them."""
    pacing: bool = False
    """The coordinator paced leases (its status says ``pacing: true``; runs before pacing say nothing)."""


@dataclasses.dataclass(frozen=True)
class FittedRun:
    """A simulator configuration for a run plus the run's fixed overheads."""

    config: SimConfig
    """Its ``tailSeconds`` covers the status samples after the last step (workers still running)."""
    after_seconds: float
    """Wall-clock after the last status sample until the run ended (final evaluation, shutdown)."""
    status_times: tuple[float, ...]
    """When the runner sampled the coordinator's rate (the simulated estimator samples at the same times)."""
    status_started: float
    """When the coordinator's rate window started counting."""


# ------------------------------------------------------------------------------------------ fitting
def mean_cv(values: Sequence[float]) -> tuple[float, float]:
    """Mean and coefficient of variation (population; 0 for fewer than two values)."""
    if not values:
        raise ValueError("no values to fit")
    mean = statistics.fmean(values)
    if len(values) < 2 or mean <= 0:
        return mean, 0.0
    return mean, statistics.pstdev(values) / mean


def round_overhead(residuals: Sequence[float], retry: float = HEARTBEAT_INTERVAL) -> float:
    """The per-lease overhead: the median residual of the rounds that cannot include a retry wait."""
    quick = [r for r in residuals if 0.0 <= r < 0.9 * retry]
    return statistics.median(quick) if quick else 0.0


def fit_pool(pool: PoolMeasure) -> WorkerClass:
    """A worker class from a pool's sampling and loading times (batchScaling 1: k groups take k × g)."""
    if not pool.lease_groups or sum(pool.lease_groups) == 0:
        raise ValueError(f"pool {pool.name!r}: no sampling events to fit its speed from")
    per_group = [s / g for s, g in zip(pool.lease_seconds, pool.lease_groups, strict=True) if g > 0]
    group_seconds = sum(pool.lease_seconds) / sum(pool.lease_groups)
    _, cv = mean_cv(per_group)
    apply = statistics.fmean(pool.load_seconds) if pool.load_seconds else 0.0
    return WorkerClass(
        name=pool.name,
        count=pool.replicas,
        group_seconds=group_seconds,
        group_cv=cv,
        apply_seconds=apply,
        capacity=pool.capacity,
        batch_scaling=1.0,
        overhead_seconds=round_overhead(pool.round_residuals),
        start_seconds=max(0.0, pool.joined_at or 0.0),
    )


def fit_trainer(steps: Sequence[StepMeasure], checkpoint_interval: int) -> TrainerConfig:
    if not steps:
        raise ValueError("no trainer steps to fit the step time from")
    step, cv = mean_cv([s.step_seconds for s in steps])
    checkpoints = [s.checkpoint_seconds for s in steps if s.checkpoint_seconds > 0]
    return TrainerConfig(
        step_seconds=step,
        step_cv=cv,
        publish_seconds=statistics.fmean(s.publish_seconds for s in steps),
        checkpoint_every=checkpoint_interval if checkpoints else 0,
        checkpoint_seconds=statistics.fmean(checkpoints) if checkpoints else 0.0,
        start_seconds=max(0.0, steps[0].started_at),
    )


def fit(run: MeasuredRun, seed: int = 0) -> FittedRun:
    """The simulator configuration of ``run`` (see the module docstring for what is fitted)."""
    classes = tuple(fit_pool(p) for p in run.pools if p.replicas > 0)
    trainer = fit_trainer(run.steps, run.checkpoint_interval)
    last_step = run.steps[-1].ended_at
    last_status = max(run.status_times, default=last_step)
    linger = max(0.0, last_status - last_step)
    after = max(0.0, run.wall_seconds - max(last_status, last_step))
    config = SimConfig(
        worker_classes=classes,
        trainer=trainer,
        mode=run.mode,  # type: ignore[arg-type]
        max_staleness=run.max_staleness,
        refresh_threshold=run.refresh_threshold,
        stale_action=run.stale_action,  # type: ignore[arg-type]
        group_size=run.group_size,
        batch_size=run.batch_size,
        buffer_size=run.buffer_size,
        snapshot_mb=0.0,  # the measured load time already includes the (local) download
        duration_seconds=max(3600.0, 20.0 * run.wall_seconds),
        max_steps=len(run.steps),
        tail_seconds=linger,
        lease_timeout=LEASE_TIMEOUT,
        heartbeat_interval=HEARTBEAT_INTERVAL,
        lease_wait=2.0 if all(p.long_poll for p in run.pools if p.replicas > 0) else 0.0,
        pacing=run.pacing,
        seed=seed,
    )
    started = max(0.0, run.status_times[0] - HEARTBEAT_INTERVAL) if run.status_times else 0.0
    return FittedRun(config, after, run.status_times, started)


# ------------------------------------------------------------------------------------------ predicting
@dataclasses.dataclass(frozen=True)
class Prediction:
    """Predicted targets, mean and standard deviation over seeds."""

    mean: dict[str, float]
    std: dict[str, float]
    wall_seconds: float

    def to_mapping(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "wallSeconds": self.wall_seconds}


def predict_once(fitted: FittedRun, seed: int) -> dict[str, float]:
    """One simulation of the fitted run: its wall-clock, busy fraction and windowed rollouts/s."""
    result = engine.simulate(fitted.config.replace(seed=seed))
    wall = result.seconds + fitted.after_seconds
    # The same optimizer steps as the run: their expected total is known, the wall-clock is predicted.
    step_seconds = result.steps * fitted.config.trainer.step_seconds
    # The runner samples the rate until the trainer process exits: the end of the simulated tail.
    period = _median_step(fitted.status_times)
    first = fitted.status_times[0] if fitted.status_times else 0.0
    samples = (
        np.arange(first, result.seconds + 1e-9, period) if result.seconds >= first else np.array([first])
    )
    rates = results.windowed_rate(
        result.accept_times, fitted.config.group_size, samples, started=fitted.status_started
    )
    return {
        "rolloutsPerSecond": float(np.mean(rates)) if len(rates) else 0.0,
        "trainerBusyFraction": step_seconds / wall if wall > 0 else 0.0,
        "wallSeconds": wall,
    }


def predict(fitted: FittedRun, seeds: int = 5) -> Prediction:
    runs = [predict_once(fitted, fitted.config.seed + s) for s in range(seeds)]
    keys = (*TARGETS, "wallSeconds")
    mean = {k: statistics.fmean(r[k] for r in runs) for k in keys}
    std = {k: statistics.stdev(r[k] for r in runs) if len(runs) > 1 else 0.0 for k in keys}
    return Prediction(mean=mean, std=std, wall_seconds=mean["wallSeconds"])


def relative_errors(measured: Mapping[str, float], predicted: Mapping[str, float]) -> dict[str, float | None]:
    """``(predicted − measured) / measured`` per target (None where nothing was measured)."""
    out: dict[str, float | None] = {}
    for key in TARGETS:
        value = measured.get(key)
        out[key] = None if not value else (predicted[key] - value) / value
    return out


def validate(run: MeasuredRun, *, seeds: int = 5, tolerance: float = 0.2) -> dict[str, Any]:
    """Fit, predict and compare one run: the JSON record ``simulate_validation.py`` writes per run."""
    fitted = fit(run)
    prediction = predict(fitted, seeds)
    errors = relative_errors(run.measured, prediction.mean)
    return {
        "run": run.name,
        "mode": run.mode,
        "maxStaleness": run.max_staleness,
        "steps": len(run.steps),
        "fitted": {**fitted.config.to_mapping(), "afterSeconds": fitted.after_seconds},
        "measured": {**run.measured, "wallSeconds": run.wall_seconds},
        "predicted": prediction.to_mapping(),
        "relativeError": errors,
        "withinTolerance": all(e is not None and abs(e) <= tolerance for e in errors.values()),
    }


def _median_step(times: Sequence[float]) -> float:
    if len(times) < 2:
        return 1.0
    diffs = np.diff(np.asarray(times, dtype=float))
    step = float(np.median(diffs))
    return step if step > 0 else 1.0


# ------------------------------------------------------------------------------------------ reading
class RunError(ValueError):
    """A run directory that lacks what the fit needs; the message names the file and the field."""


def read_run(directory: str | Path) -> MeasuredRun:
    """Read a run directory of ``echorl run`` (see the module docstring for the files)."""
    from echo_runtime import spec
    from echo_runtime.runner import metrics

    root = Path(directory)
    for name in ("job.yaml", "summary.json", "metrics.jsonl"):
        if not (root / name).exists():
            raise RunError(f"{root}: no {name}; is this a run directory of `echorl run` that finished?")
    job = spec.load_job(root / "job.yaml")
    summary = json.loads((root / "summary.json").read_text(encoding="utf-8"))
    t0 = _t0(root)
    records = metrics.read_records(root / "metrics.jsonl")
    status = [r for r in records if r.get("kind") == "status"]
    trainer = [r for r in records if r.get("kind") == "trainer"]
    if not trainer:
        raise RunError(
            f"{root / 'metrics.jsonl'}: no `kind: trainer` records (did any optimizer step finish?)"
        )
    steps = tuple(_step(r, t0) for r in trainer)
    algo, sync = job.spec.algorithm, job.sync_policy
    pools = tuple(
        _pool(
            root,
            name,
            pool.replicas if pool.replicas is not None else 1,
            pool.capacity,
            status,
            summary,
            algo.group_size,
        )
        for name, pool in job.inference_pools
        if not pool.external
    )
    measured = {k: float(summary[k]) for k in TARGETS if isinstance(summary.get(k), int | float)}
    missing = [k for k in TARGETS if k not in measured]
    if missing:
        raise RunError(f"{root / 'summary.json'}: no {', '.join(missing)}")
    return MeasuredRun(
        name=root.name,
        mode=sync.mode,
        max_staleness=sync.max_staleness,
        refresh_threshold=sync.refresh_threshold,
        stale_action=sync.stale_action,
        group_size=algo.group_size,
        batch_size=algo.batch_size,
        buffer_size=sync.buffer_size,
        checkpoint_interval=job.training_swarm.checkpoint_interval,
        pools=pools,
        steps=steps,
        status_times=tuple(float(r["time"]) for r in status if "time" in r),
        status_rates=tuple(float(r.get("rolloutsPerSecond") or 0.0) for r in status if "time" in r),
        wall_seconds=float(
            summary.get("wallClockSeconds") or max(float(r.get("time", 0.0)) for r in records)
        ),
        measured=measured,
        pacing=any(r.get("pacing") is True for r in status),
    )


def _t0(root: Path) -> float | None:
    path = root / "run.json"
    if not path.exists():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("t0")
    return float(value) if isinstance(value, int | float) else None


def _step(record: Mapping[str, Any], t0: float | None) -> StepMeasure:
    unix = record.get("unixTime")
    # unixTime is stamped when the step's record is written (after publish and checkpoint); the runner's
    # own ``time`` is when it noticed the record (up to one status interval later).
    ended = (
        float(unix) - t0
        if isinstance(unix, int | float) and t0 is not None
        else float(record.get("time", 0.0))
    )
    return StepMeasure(
        step_seconds=float(record.get("stepSeconds") or 0.0),
        publish_seconds=float(record.get("publishSeconds") or 0.0),
        checkpoint_seconds=float(record.get("checkpointSeconds") or 0.0),
        ended_at=ended,
    )


def _pool(
    root: Path,
    name: str,
    replicas: int,
    capacity: int,
    status: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    group_size: int,
) -> PoolMeasure:
    from echo_runtime.runner import metrics

    seconds: list[float] = []
    groups: list[int] = []
    loads: list[float] = []
    residuals: list[float] = []
    long_poll = False  # set once any record carries leaseSeconds
    files = sorted((root / "workers").glob(f"{name}-*.jsonl"))
    files = [f for f in files if f.stem.rsplit("-", 1)[0] == name]
    for path in files:
        previous: float | None = None  # when the worker's previous sampling call ended
        loaded = 0.0  # load seconds since then
        leased = 0.0  # the cumulative seconds inside lease requests (long-poll waits) at that point
        for record in metrics.read_records(path):
            event, at = record.get("event"), record.get("time")
            if event == "sample" and record.get("groups"):
                seconds.append(float(record["seconds"]))
                groups.append(int(record["groups"]))
                # Time waiting in a lease long-poll is idle time the simulator produces itself (the
                # protocol), not per-lease overhead: take it out (workers that log ``leaseSeconds``).
                in_lease = float(record.get("leaseSeconds") or 0.0)
                long_poll = long_poll or "leaseSeconds" in record
                if previous is not None and isinstance(at, int | float):
                    residuals.append(
                        float(at) - previous - float(record["seconds"]) - loaded - (in_lease - leased)
                    )
                previous, loaded = (float(at) if isinstance(at, int | float) else None), 0.0
                leased = in_lease
            elif event == "load" and isinstance(record.get("seconds"), int | float):
                loads.append(float(record["seconds"]))
                loaded += float(record["seconds"])
    if not groups:  # no timing files: the summary's per-worker totals
        for worker, timing in (summary.get("workerTiming") or {}).items():
            if str(worker).rsplit("-", 1)[0] != name or not timing.get("rollouts"):
                continue
            seconds.append(float(timing.get("sampleSeconds") or 0.0))
            groups.append(max(1, round(float(timing["rollouts"]) / group_size)))
    return PoolMeasure(
        name=name,
        replicas=replicas,
        capacity=capacity,
        lease_seconds=tuple(seconds),
        lease_groups=tuple(groups),
        load_seconds=tuple(loads),
        round_residuals=tuple(residuals),
        joined_at=_joined_at(status, name),
        long_poll=long_poll,
    )


def _joined_at(status: Sequence[Mapping[str, Any]], pool: str) -> float | None:
    """The last status sample before a worker of ``pool`` was first seen registered.

    The worker registered between that sample and the next (one status interval, ~1 s); the simulator
    spreads first registrations uniformly over one retry interval (1 s here) after ``startSeconds``,
    which covers the same window."""
    previous: float | None = None
    for record in status:
        time = record.get("time")
        if not isinstance(time, int | float):
            continue
        if any(w.get("pool") == pool for w in record.get("workers") or ()):
            return float(time) - HEARTBEAT_INTERVAL if previous is None else previous
        previous = float(time)
    return None


def summarise_errors(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Across validated runs: mean and max absolute relative error per target, and how many passed."""
    out: dict[str, Any] = {
        "runs": len(records),
        "withinTolerance": sum(bool(r["withinTolerance"]) for r in records),
    }
    for key in TARGETS:
        errors = [abs(r["relativeError"][key]) for r in records if r["relativeError"].get(key) is not None]
        out[key] = {
            "meanAbsRelativeError": statistics.fmean(errors) if errors else None,
            "maxAbsRelativeError": max(errors) if errors else None,
        }
    out["allFinite"] = all(
        math.isfinite(r["relativeError"][k])
        for r in records
        for k in TARGETS
        if r["relativeError"].get(k) is not None
    )
    return out
