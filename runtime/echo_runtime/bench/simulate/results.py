"""What a simulation reports: throughput, trainer busy fraction, staleness, dropped work, per-class use.

Definitions (the same words as the runner's ``summary.json`` and the coordinator's status document):

* ``rolloutsPerSecond`` — rollouts *accepted* into the replay buffer per simulated second (what the
  coordinator's rate counts); ``consumedRolloutsPerSecond`` — rollouts that reached an optimizer step;
* ``trainerBusyFraction`` — optimizer-step seconds over the simulated span (as the runner computes it:
  ``Σ stepSeconds / wall``); publish and checkpoint time is reported apart (``trainerPublishFraction``);
* ``stalenessHistogram`` — consumed groups by ``t − version``;
* ``groups`` — where every group went: ``droppedStale`` (on arrival or in the buffer, as the coordinator
  counts), ``wasted`` (generated on a lease that had expired), ``lostInFlight`` (being generated when
  its worker failed; the task itself is re-issued, not lost);
* per class ``utilisation`` — generating seconds over alive worker-seconds; ``loadFraction`` — loading
  snapshots; ``idleFraction`` — the rest (waiting for work: backpressure, a closed round, no task).

:func:`windowed_rate` reproduces the runner's estimator of rollouts/s (the mean of the coordinator's
30-second windowed rate sampled every status interval) so simulated and measured runs compare like for
like.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from echo_runtime.bench.simulate.config import SimConfig


@dataclasses.dataclass
class Counters:
    """The engine's running totals (lists are indexed by worker class)."""

    gen_seconds: list[float]
    load_seconds: list[float]
    alive_seconds: list[float]
    lost_seconds: list[float]
    generated: list[int]
    accepted: list[int]
    consumed: list[int]
    loads: list[int]
    failures: list[int]
    dropped_on_arrival: int = 0
    dropped_in_buffer: int = 0
    wasted: int = 0
    lost_in_flight: int = 0
    reissued: int = 0
    weighted: int = 0
    violations: int = 0
    steps: int = 0
    step_seconds: float = 0.0
    publish_seconds: float = 0.0
    snapshot_mb: float = 0.0

    @classmethod
    def zero(cls, classes: int) -> Counters:
        return cls(
            gen_seconds=[0.0] * classes,
            load_seconds=[0.0] * classes,
            alive_seconds=[0.0] * classes,
            lost_seconds=[0.0] * classes,
            generated=[0] * classes,
            accepted=[0] * classes,
            consumed=[0] * classes,
            loads=[0] * classes,
            failures=[0] * classes,
        )


@dataclasses.dataclass
class Trace:
    """Per-event records, kept only when asked for (validation, plots)."""

    joins: list[tuple[float, int, int]] = dataclasses.field(default_factory=list)
    """(time, worker, class) of every registration."""
    samples: list[tuple[float, int, float, int, int]] = dataclasses.field(default_factory=list)
    """(end time, worker, sampling seconds, groups, version) of every finished generation: the end time
    includes the lease's overhead, the seconds do not (as the worker loop times its sampling calls)."""
    loads: list[tuple[float, int, float, int]] = dataclasses.field(default_factory=list)
    """(end time, worker, seconds, version) of every snapshot load."""
    steps: list[list[float]] = dataclasses.field(default_factory=list)
    """[start, step seconds, publish seconds, checkpoint seconds, new version] of every optimizer step."""


@dataclasses.dataclass(frozen=True)
class GroupCounts:
    """Where every task and group went (see the module docstring)."""

    created: int
    generated: int
    accepted: int
    consumed: int
    dropped_on_arrival: int
    dropped_in_buffer: int
    wasted: int
    lost_in_flight: int
    reissued: int
    weighted: int
    pending: int
    leased: int
    buffered: int

    @property
    def dropped_stale(self) -> int:
        return self.dropped_on_arrival + self.dropped_in_buffer

    @property
    def dropped_total(self) -> int:
        """Generated work that never reached an optimizer step and never will."""
        return self.dropped_stale + self.wasted

    def to_mapping(self) -> dict[str, int]:
        return {
            "created": self.created,
            "generated": self.generated,
            "accepted": self.accepted,
            "consumed": self.consumed,
            "droppedStale": self.dropped_stale,
            "droppedOnArrival": self.dropped_on_arrival,
            "droppedInBuffer": self.dropped_in_buffer,
            "wasted": self.wasted,
            "lostInFlight": self.lost_in_flight,
            "reissued": self.reissued,
            "weightedStale": self.weighted,
            "pendingAtEnd": self.pending,
            "leasedAtEnd": self.leased,
            "bufferedAtEnd": self.buffered,
            "droppedTotal": self.dropped_total,
        }


@dataclasses.dataclass(frozen=True)
class ClassStats:
    """One worker class over the run."""

    workers: int
    utilisation: float
    load_fraction: float
    idle_fraction: float
    groups: int
    """Groups generated (whatever became of them)."""
    consumed_groups: int
    rollouts_per_second: float
    """Accepted rollouts per simulated second from this class."""
    loads: int
    failures: int
    lost_seconds: float

    def to_mapping(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "utilisation": self.utilisation,
            "loadFraction": self.load_fraction,
            "idleFraction": self.idle_fraction,
            "groups": self.groups,
            "consumedGroups": self.consumed_groups,
            "rolloutsPerSecond": self.rollouts_per_second,
            "loads": self.loads,
            "failures": self.failures,
            "lostSeconds": self.lost_seconds,
        }


@dataclasses.dataclass(frozen=True)
class SimResult:
    """One simulation's outcome. ``to_mapping`` is the JSON written by ``echorl simulate --out``."""

    config: SimConfig
    seconds: float
    """The simulated span: ``durationSeconds``, or when the trainer published ``maxSteps`` versions."""
    steps: int
    rollouts_per_second: float
    consumed_rollouts_per_second: float
    trainer_busy_fraction: float
    trainer_publish_fraction: float
    staleness_histogram: dict[int, int]
    max_observed_staleness: int | None
    violations: int
    """Consumed groups whose staleness exceeded the bound: always 0 (the invariant under test)."""
    groups: GroupCounts
    classes: dict[str, ClassStats]
    snapshot_egress_mb_per_s: float
    """Snapshot bytes downloaded by all workers per second: what the snapshot store must serve."""
    events: int
    wall_seconds: float
    accept_times: tuple[float, ...] = dataclasses.field(repr=False, default=())
    """When each accepted group arrived (for :func:`windowed_rate`)."""
    trace: Trace | None = dataclasses.field(repr=False, default=None)

    @property
    def mean_staleness(self) -> float | None:
        total = sum(self.staleness_histogram.values())
        if not total:
            return None
        return sum(k * v for k, v in self.staleness_histogram.items()) / total

    def to_mapping(self) -> dict[str, Any]:
        return {
            "config": self.config.to_mapping(),
            "simulatedSeconds": self.seconds,
            "steps": self.steps,
            "rolloutsPerSecond": self.rollouts_per_second,
            "consumedRolloutsPerSecond": self.consumed_rollouts_per_second,
            "trainerBusyFraction": self.trainer_busy_fraction,
            "trainerPublishFraction": self.trainer_publish_fraction,
            "stalenessHistogram": {str(k): v for k, v in sorted(self.staleness_histogram.items())},
            "meanStaleness": self.mean_staleness,
            "maxObservedStaleness": self.max_observed_staleness,
            "violations": self.violations,
            "groups": self.groups.to_mapping(),
            "classes": {name: stats.to_mapping() for name, stats in self.classes.items()},
            "snapshotEgressMBps": self.snapshot_egress_mb_per_s,
            "events": self.events,
            "wallSeconds": self.wall_seconds,
        }


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def build(
    config: SimConfig,
    c: Counters,
    histogram: Mapping[int, int],
    accept_times: Sequence[float],
    *,
    end: float,
    events: int,
    wall: float,
    pending: int,
    leased: int,
    buffered: int,
    created: int,
    ledger_consumed: int,
    ledger_dropped: int,
    trace: Trace | None,
) -> SimResult:
    """Assemble a :class:`SimResult` from the engine's counters (and check the books balance)."""
    n = config.group_size
    groups = GroupCounts(
        created=created,
        generated=sum(c.generated),
        accepted=sum(c.accepted),
        consumed=sum(c.consumed),
        dropped_on_arrival=c.dropped_on_arrival,
        dropped_in_buffer=c.dropped_in_buffer,
        wasted=c.wasted,
        lost_in_flight=c.lost_in_flight,
        reissued=c.reissued,
        weighted=c.weighted,
        pending=pending,
        leased=leased,
        buffered=buffered,
    )
    # The ledger and the engine count the same things two ways: they must agree.
    assert ledger_consumed == groups.consumed, (ledger_consumed, groups.consumed)
    assert ledger_dropped == groups.dropped_stale, (ledger_dropped, groups.dropped_stale)
    assert groups.generated == groups.accepted + groups.dropped_on_arrival + groups.wasted, groups
    assert groups.accepted == groups.consumed + groups.dropped_in_buffer + groups.buffered, groups
    classes = {}
    for i, cls in enumerate(config.worker_classes):
        alive = c.alive_seconds[i]
        util, load = _ratio(c.gen_seconds[i], alive), _ratio(c.load_seconds[i], alive)
        classes[cls.name] = ClassStats(
            workers=cls.count,
            utilisation=util,
            load_fraction=load,
            idle_fraction=max(0.0, 1.0 - util - load) if alive > 0 else 0.0,
            groups=c.generated[i],
            consumed_groups=c.consumed[i],
            rollouts_per_second=_ratio(c.accepted[i] * n, end),
            loads=c.loads[i],
            failures=c.failures[i],
            lost_seconds=c.lost_seconds[i],
        )
    return SimResult(
        config=config,
        seconds=end,
        steps=c.steps,
        rollouts_per_second=_ratio(groups.accepted * n, end),
        consumed_rollouts_per_second=_ratio(groups.consumed * n, end),
        trainer_busy_fraction=_ratio(c.step_seconds, end),
        trainer_publish_fraction=_ratio(c.publish_seconds, end),
        staleness_histogram=dict(sorted(histogram.items())),
        max_observed_staleness=max(histogram) if histogram else None,
        violations=c.violations,
        groups=groups,
        classes=classes,
        snapshot_egress_mb_per_s=_ratio(c.snapshot_mb, end),
        events=events,
        wall_seconds=wall,
        accept_times=tuple(accept_times),
        trace=trace,
    )


def windowed_rate(
    accept_times: Sequence[float],
    group_size: int,
    sample_times: Sequence[float] | np.ndarray,
    *,
    started: float = 0.0,
    window: float = 30.0,
) -> np.ndarray:
    """The coordinator's ``RateWindow`` rate of accepted rollouts at each of ``sample_times``.

    Exactly :class:`echo_runtime.coordinator.counters.RateWindow`: events in one-second buckets, the buckets
    of the last ``window`` whole seconds, divided by ``min(window, max(1, now − started))``.
    """
    times = np.sort(np.asarray(accept_times, dtype=float))
    seconds = np.floor(times)
    samples = np.asarray(sample_times, dtype=float)
    now_second = np.floor(samples)
    span = int(max(1, int(window)))
    upper = np.searchsorted(times, samples, side="right")  # accepted at or before the sample
    lower = np.searchsorted(seconds, now_second - span, side="right")  # buckets older than the window
    counts = np.maximum(0, upper - lower) * group_size
    spans = np.minimum(float(span), np.maximum(1.0, samples - started))
    result: np.ndarray = counts / spans
    return result
