"""The simulator's configuration: worker classes, the trainer, and the job's sync policy, as dataclasses.

A configuration file is YAML or JSON with camelCase keys (the manifests' convention)::

    mode: Async              # or Sequential
    maxStaleness: 2          # Δmax
    groupSize: 8             # n rollouts per group
    batchSize: 64            # groups per optimizer step
    bufferSize: 128          # replay-buffer capacity in groups (default 2 × batchSize, as the coordinator)
    snapshotMB: 40           # size of one published snapshot (a LoRA adapter, or the full weights)
    durationSeconds: 3600    # simulated time (or maxSteps: stop after that many optimizer steps)
    trainer: {stepSeconds: 20, publishSeconds: 1.5}
    workerClasses:
      - {name: h100, count: 8, groupSeconds: 2.5, groupCv: 0.2, downloadMBps: 1000}

Promises:

* Every field is validated when the configuration is built; a wrong value is a :class:`ConfigError`
  naming the key (``workerClasses[1].groupSeconds``), what was given and what is allowed. Unknown keys
  are errors too, so a typo never silently falls back to a default.
* :meth:`SimConfig.to_mapping` and :func:`config_from_mapping` round-trip.
* The staleness parameters become a :class:`~echo_runtime.staleness.StalenessPolicy`, the
  coordinator's own: the simulator decides admissions with the real :func:`~.staleness.admit`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml

from echo_runtime import staleness

MODES = get_args(staleness.Mode)
STALE_ACTIONS = get_args(staleness.StaleAction)


class ConfigError(ValueError):
    """A simulator configuration that cannot be used; the message names the key and the allowed values."""


def _key(field: dataclasses.Field[Any]) -> str:
    explicit = field.metadata.get("key")
    if explicit:
        return str(explicit)
    head, *rest = field.name.split("_")
    return head + "".join(part.capitalize() for part in rest)


@dataclasses.dataclass(frozen=True)
class WorkerClass:
    """A homogeneous pool of inference workers (one hardware class: H100, RTX 5090, M4 Pro, CPU, ...)."""

    name: str
    count: int
    """Number of workers of this class (0 allowed: sweeps switch a class off)."""
    group_seconds: float
    """Mean seconds to generate one group (``groupSize`` rollouts) on one worker of this class."""
    group_cv: float = 0.0
    """Coefficient of variation of the generation time (log-normal jitter; 0 = deterministic)."""
    download_mbps: float = dataclasses.field(default=math.inf, metadata={"key": "downloadMBps"})
    """Snapshot download bandwidth per worker, megabytes per second (``.inf``: free)."""
    apply_seconds: float = 0.0
    """Seconds to apply a downloaded snapshot to the loaded model (LoRA swap, weight copy)."""
    overhead_seconds: float = 0.0
    """Seconds per lease outside sampling and loading: the lease and submit round trips, serialisation
    (small on a LAN, large for a laptop behind a home connection)."""
    capacity: int = 1
    """Groups per lease (the worker's ``--capacity``); a lease of k groups is sampled as one batch."""
    batch_scaling: float = 1.0
    """A k-group lease takes ``groupSeconds × (1 + batchScaling × (k − 1))``: 1 = no gain from batching,
    0 = k groups as fast as one (an engine far from saturation)."""
    mtbf_hours: float | None = None
    """Mean time between failures of one worker, hours of uptime (exponential); None = never fails."""
    rejoin_seconds: float = 60.0
    """After a failure, seconds until the worker registers again (restart plus base-model load)."""
    start_seconds: float = 0.0
    """When the class's workers first register (process start plus base-model load)."""

    def __post_init__(self) -> None:
        where = f"workerClasses[{self.name!r}]"
        if not self.name or not isinstance(self.name, str):
            raise ConfigError("workerClasses[].name: a non-empty name is required")
        _check_int(f"{where}.count", self.count, 0)
        _check_float(f"{where}.groupSeconds", self.group_seconds, 0.0, exclusive=True)
        _check_float(f"{where}.groupCv", self.group_cv, 0.0)
        _check_float(f"{where}.downloadMBps", self.download_mbps, 0.0, exclusive=True, allow_inf=True)
        _check_float(f"{where}.applySeconds", self.apply_seconds, 0.0)
        _check_float(f"{where}.overheadSeconds", self.overhead_seconds, 0.0)
        _check_int(f"{where}.capacity", self.capacity, 1)
        _check_float(f"{where}.batchScaling", self.batch_scaling, 0.0)
        if self.mtbf_hours is not None:
            _check_float(f"{where}.mtbfHours", self.mtbf_hours, 0.0, exclusive=True, allow_inf=True)
        _check_float(f"{where}.rejoinSeconds", self.rejoin_seconds, 0.0)
        _check_float(f"{where}.startSeconds", self.start_seconds, 0.0)

    def lease_seconds(self, groups: int) -> float:
        """Mean seconds to generate a lease of ``groups`` groups."""
        return self.group_seconds * (1.0 + self.batch_scaling * (groups - 1))

    def load_seconds(self, snapshot_mb: float) -> float:
        """Seconds to download and apply one snapshot of ``snapshot_mb`` megabytes."""
        return snapshot_mb / self.download_mbps + self.apply_seconds


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The training swarm as the protocol sees it: a step time and the time to publish a version."""

    step_seconds: float
    """Mean seconds of one optimizer step on a batch (what the runner's ``stepSeconds`` measures)."""
    step_cv: float = 0.0
    publish_seconds: float = 0.0
    """Seconds to publish a snapshot and announce it (the trainer does nothing else meanwhile)."""
    checkpoint_every: int = 0
    """A checkpoint every this many versions (and after the last step when ``maxSteps`` is set); 0 = none."""
    checkpoint_seconds: float = 0.0
    start_seconds: float = 0.0
    """When the trainer asks for its first batch (process start plus model load)."""

    def __post_init__(self) -> None:
        _check_float("trainer.stepSeconds", self.step_seconds, 0.0, exclusive=True)
        _check_float("trainer.stepCv", self.step_cv, 0.0)
        _check_float("trainer.publishSeconds", self.publish_seconds, 0.0)
        _check_int("trainer.checkpointEvery", self.checkpoint_every, 0)
        _check_float("trainer.checkpointSeconds", self.checkpoint_seconds, 0.0)
        _check_float("trainer.startSeconds", self.start_seconds, 0.0)


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """One simulated job: its pools, its trainer and its sync policy (the coordinator's settings)."""

    worker_classes: tuple[WorkerClass, ...]
    trainer: TrainerConfig
    mode: staleness.Mode = "Async"
    max_staleness: int = 1
    """Δmax."""
    refresh_threshold: int = 0
    """Sequential mode's bound (≤ Δmax)."""
    stale_action: staleness.StaleAction = "Drop"
    group_size: int = 8
    batch_size: int = 8
    buffer_size: int | None = None
    """Async replay-buffer capacity in groups, bounding pending + leased + buffered tasks (the
    coordinator's backpressure); None = 2 × batchSize, the coordinator's default."""
    snapshot_mb: float = dataclasses.field(default=0.0, metadata={"key": "snapshotMB"})
    duration_seconds: float = 3600.0
    max_steps: int | None = None
    """Stop once the trainer has published this many versions (before ``durationSeconds`` if earlier)."""
    tail_seconds: float = 0.0
    """With ``maxSteps``: keep simulating the workers this long after the last step (a measured run's
    status samples continue until the trainer process has exited)."""
    lease_timeout: float = 30.0
    """A worker silent this long is forgotten and its leases re-issued (the coordinator's setting)."""
    heartbeat_interval: float = 5.0
    task_timeout: float = 600.0
    """A lease older than this is re-issued even if its worker is alive; its late group is wasted."""
    expire_interval: float = 1.0
    """How often the coordinator sweeps for silent workers."""
    poll_interval: float | None = None
    """How long a worker waits after an empty lease reply; None = min(1, heartbeatInterval) as the
    coordinator's ``retryAfterSeconds``. Only used when ``leaseWait`` is 0."""
    lease_wait: float = 2.0
    """The workers' lease long-poll (``echorl worker`` holds a lease request 2 s): > 0 means an idle
    worker takes work the moment it appears; 0 models polling every ``pollInterval``."""
    pacing: bool = True
    """The coordinator's pacing (:func:`echo_runtime.staleness.lease_floor`): lease only what can be
    consumed in bound, workers load newer versions as their next task needs. False models a coordinator
    without it (runs before pacing, or ``echorl coordinator --no-pacing``)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.worker_classes:
            raise ConfigError("workerClasses: at least one worker class is required")
        names = [c.name for c in self.worker_classes]
        if len(set(names)) != len(names):
            raise ConfigError(f"workerClasses: names must be unique, got {names}")
        if self.mode not in MODES:
            raise ConfigError(f"mode: must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.stale_action not in STALE_ACTIONS:
            raise ConfigError(
                f"staleAction: must be one of {', '.join(STALE_ACTIONS)}, got {self.stale_action!r}"
            )
        _check_int("maxStaleness", self.max_staleness, 0)
        _check_int("refreshThreshold", self.refresh_threshold, 0)
        if self.refresh_threshold > self.max_staleness:
            raise ConfigError(
                f"refreshThreshold: must be ≤ maxStaleness ({self.max_staleness}), got {self.refresh_threshold}"
            )
        _check_int("groupSize", self.group_size, 1)
        _check_int("batchSize", self.batch_size, 1)
        if self.buffer_size is not None:
            _check_int(
                "bufferSize", self.buffer_size, self.batch_size, why="batchSize, or no batch could ever fill"
            )
        _check_float("snapshotMB", self.snapshot_mb, 0.0)
        _check_float("durationSeconds", self.duration_seconds, 0.0, exclusive=True)
        if self.max_steps is not None:
            _check_int("maxSteps", self.max_steps, 1)
        _check_float("tailSeconds", self.tail_seconds, 0.0)
        _check_float("leaseTimeout", self.lease_timeout, 0.0, exclusive=True)
        _check_float("heartbeatInterval", self.heartbeat_interval, 0.0, exclusive=True)
        if self.heartbeat_interval >= self.lease_timeout:
            raise ConfigError(
                f"heartbeatInterval ({self.heartbeat_interval}s) must be shorter than leaseTimeout "
                f"({self.lease_timeout}s)"
            )
        _check_float("taskTimeout", self.task_timeout, 0.0, exclusive=True)
        _check_float("expireInterval", self.expire_interval, 0.0, exclusive=True)
        if self.poll_interval is not None:
            _check_float("pollInterval", self.poll_interval, 0.0, exclusive=True)
        _check_float("leaseWait", self.lease_wait, 0.0)
        _check_int("seed", self.seed, 0)

    # ------------------------------------------------------------------------------ derived
    @property
    def policy(self) -> staleness.StalenessPolicy:
        """The coordinator's staleness policy for these settings."""
        return staleness.StalenessPolicy(
            self.mode, self.max_staleness, self.stale_action, self.refresh_threshold
        )

    @property
    def buffer_capacity(self) -> int:
        return self.buffer_size if self.buffer_size is not None else 2 * self.batch_size

    @property
    def retry_seconds(self) -> float:
        return self.poll_interval if self.poll_interval is not None else min(1.0, self.heartbeat_interval)

    @property
    def workers(self) -> int:
        return sum(c.count for c in self.worker_classes)

    def pool_sizes(self) -> dict[str, int]:
        return {c.name: c.count for c in self.worker_classes}

    # ------------------------------------------------------------------------------ variations
    def replace(self, **changes: Any) -> SimConfig:
        return dataclasses.replace(self, **changes)

    def with_max_staleness(self, max_staleness: int) -> SimConfig:
        """This job with Δmax changed (Sequential's refresh threshold is clamped to stay ≤ Δmax)."""
        return self.replace(
            max_staleness=max_staleness, refresh_threshold=min(self.refresh_threshold, max_staleness)
        )

    def with_pools(self, counts: Mapping[str, int]) -> SimConfig:
        """This job with the named classes' worker counts changed."""
        unknown = sorted(set(counts) - {c.name for c in self.worker_classes})
        if unknown:
            raise ConfigError(
                f"pool {unknown[0]!r} is not a worker class; classes: {', '.join(c.name for c in self.worker_classes)}"
            )
        classes = tuple(
            dataclasses.replace(c, count=counts[c.name]) if c.name in counts else c
            for c in self.worker_classes
        )
        return self.replace(worker_classes=classes)

    def scaled(self, factor: float) -> SimConfig:
        """Every pool's size multiplied by ``factor`` (rounded, at least 1 where it was at least 1)."""
        _check_float("scale", factor, 0.0, exclusive=True)
        return self.with_pools(
            {c.name: max(1 if c.count else 0, round(c.count * factor)) for c in self.worker_classes}
        )

    # ------------------------------------------------------------------------------ (de)serialisation
    def to_mapping(self) -> dict[str, Any]:
        """The camelCase mapping a configuration file holds (infinite bandwidth as ``"inf"``)."""
        mapping: dict[str, Any] = _to_mapping(self)
        return mapping


def _to_mapping(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {_key(f): _to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [_to_mapping(v) for v in obj]
    if isinstance(obj, float) and math.isinf(obj):
        return "inf"
    return obj


C = TypeVar("C")


def _from_mapping(cls: type[C], data: object, where: str, nested: Mapping[str, Any]) -> C:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or 'configuration'}: expected a mapping, got {type(data).__name__}")
    fields = {_key(f): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    aliases = {"duration": "durationSeconds"} if cls is SimConfig else {}
    kwargs: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = aliases.get(str(raw_key), str(raw_key))
        field = fields.get(key)
        path = f"{where}.{key}" if where else key
        if field is None:
            raise ConfigError(f"{path}: unknown key; allowed: {', '.join(fields)}")
        if field.name in nested:
            value = nested[field.name](value, path)
        elif isinstance(value, str) and re.fullmatch(r"[+]?\.?inf(inity)?", value.strip().lower()):
            value = math.inf
        kwargs[field.name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        missing = [k for k, f in fields.items() if f.name not in kwargs and _required(f)]
        raise ConfigError(
            f"{where or 'configuration'}: missing required key(s) {', '.join(missing)}"
        ) from exc


def _required(field: dataclasses.Field[Any]) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _classes(value: object, where: str) -> tuple[WorkerClass, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise ConfigError(f"{where}: expected a list of worker classes")
    return tuple(_from_mapping(WorkerClass, item, f"{where}[{i}]", {}) for i, item in enumerate(value))


def _trainer(value: object, where: str) -> TrainerConfig:
    return _from_mapping(TrainerConfig, value, where, {})


def config_from_mapping(data: object) -> SimConfig:
    """A validated :class:`SimConfig` from a camelCase mapping (a parsed YAML or JSON file)."""
    return _from_mapping(SimConfig, data, "", {"worker_classes": _classes, "trainer": _trainer})


def load_config(path: str | Path) -> SimConfig:
    """The configuration in a YAML or JSON file; errors name the file and the key."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read ({exc.strerror})") from exc
    try:
        data = json.loads(text) if source.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{source}: not valid {'JSON' if source.suffix == '.json' else 'YAML'}: {exc}"
        ) from exc
    try:
        return config_from_mapping(data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


# ---------------------------------------------------------------------------------- validation helpers
def _check_int(where: str, value: object, low: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if value < low:
        raise ConfigError(f"{where}: must be ≥ {low}{f' ({why})' if why else ''}, got {value}")


def _check_float(
    where: str, value: object, low: float, *, exclusive: bool = False, allow_inf: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not allow_inf):
        raise ConfigError(f"{where}: must be a finite number, got {value!r}")
    if number < low or (exclusive and number == low):
        raise ConfigError(f"{where}: must be {'>' if exclusive else '≥'} {low:g}, got {value!r}")
