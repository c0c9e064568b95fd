"""From the run's records (``metrics.jsonl``'s ``trainer``, ``status`` and ``eval`` kinds) to what a
tracker logs: scalars by name against the policy version and the wall-clock, and tables.

Names are ``<section>/<field>[/<key>...]`` in the records' own camelCase:

* ``train/...`` — a trainer record: loss and its parts, KL, entropy, clip fractions, importance
  weights, drops and filters, the reward, step/batch/publish/checkpoint seconds, the log-prob
  mismatch per backend (``train/logprobMismatch/<backend>/meanAbs``), the store's size; and
  ``train/busyFraction``, the step's seconds over the wall-clock since the record before.
* ``coordinator/...`` — a status document: reward, rollouts/s, buffer, drops, quarantines, the
  staleness histogram (``coordinator/stalenessHistogram/<staleness>``), each pool
  (``coordinator/pools/<pool>/...``) and each worker (``coordinator/workers/<id>/rolloutsPerSecond``).
* ``eval/...`` — a held-out evaluation: accuracy, reward, seconds.
* ``workers/<name>/...`` — a local worker's busy and load fractions (``echorl run`` only).

Tables: ``samples`` (a trainer record's sample completions, every ``tracking.samplesEvery``
versions) and ``eval/examples`` (an evaluation's examples).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

SAMPLE_COLUMNS = ("policyVersion", "prompt", "completion", "reward", "worker", "staleness")
"""The columns of a table of sample completions (a trainer record's ``samples``)."""
EXAMPLE_COLUMNS = ("policyVersion", "prompt", "completion", "reward")
"""The columns of an evaluation's examples."""
_SKIP = frozenset(
    {"kind", "time", "unixTime", "policyVersion", "samples", "examples", "epoch", "publishedAt"}
)
"""Fields that are the axes, tables or identities, not series."""
_NAME = re.compile(r"[^A-Za-z0-9_\-./ :]")
"""What MLflow, the strictest of the four, refuses in a metric name."""


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


@dataclasses.dataclass(frozen=True)
class Point:
    """What one record gives the trackers: scalars and tables at one policy version and time."""

    version: int
    unix_time: float
    """Wall-clock of the record (seconds since the epoch)."""
    seconds: float
    """Seconds since the run started (the records' ``time``)."""
    scalars: dict[str, float]
    tables: tuple[Table, ...] = ()


def clean(name: str) -> str:
    """A series name every tracker accepts (anything else becomes ``_``)."""
    return _NAME.sub("_", name)


def flatten(value: Any, prefix: str) -> Iterator[tuple[str, float]]:
    """Every finite number in ``value`` (nested mappings), named by its path under ``prefix``."""
    if isinstance(value, bool):
        yield clean(prefix), float(value)
    elif isinstance(value, int | float):
        if math.isfinite(value):
            yield clean(prefix), float(value)
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            if str(key) not in _SKIP:
                yield from flatten(inner, f"{prefix}/{key}")


class Points:
    """Turns records into points, keeping what spans records (the previous trainer record's time for
    the busy fraction, the last version whose status was logged)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        """The run's start (seconds since the epoch): ``time`` + t0 is a record's wall-clock."""
        self._last_step_time: float | None = None
        self._status_version: int | None = None

    def point(self, record: Mapping[str, Any]) -> Point | None:
        """The point of ``record``, or None when it adds nothing (an unknown kind, a status document of
        a version already logged: the coordinator is asked every second, the trackers get one per
        version)."""
        kind = record.get("kind")
        version = record.get("policyVersion")
        if not isinstance(version, int) or isinstance(version, bool):
            return None
        seconds = float(record.get("time") or 0.0)
        unix_time = float(record.get("unixTime") or self.t0 + seconds)
        if kind == "trainer":
            return self._trainer(record, version, seconds, unix_time)
        if kind == "status":
            if version == self._status_version:
                return None
            self._status_version = version
            workers = {
                str(w.get("id")): {k: v for k, v in w.items() if k in ("rolloutsPerSecond", "loadedVersion")}
                for w in record.get("workers") or []
                if isinstance(w, Mapping)
            }
            body = {k: v for k, v in record.items() if k != "workers"}
            scalars = dict(flatten(body, "coordinator"))
            scalars.update(flatten(workers, "coordinator/workers"))
            return Point(version, unix_time, seconds, scalars)
        if kind == "eval":
            scalars = dict(flatten(record, "eval"))
            rows = tuple(
                (version, *(str(x) if i < 2 else _number(x) for i, x in enumerate(example[:3])))
                for example in record.get("examples") or []
                if isinstance(example, list | tuple) and len(example) >= 3
            )
            tables = (Table("eval/examples", EXAMPLE_COLUMNS, rows),) if rows else ()
            return Point(version, unix_time, seconds, scalars, tables)
        if kind == "workerTiming":
            return Point(version, unix_time, seconds, dict(flatten(record.get("workers") or {}, "workers")))
        return None

    def _trainer(self, record: Mapping[str, Any], version: int, seconds: float, unix_time: float) -> Point:
        scalars = dict(flatten(record, "train"))
        step_seconds = record.get("stepSeconds")
        if self._last_step_time is not None and isinstance(step_seconds, int | float):
            wall = seconds - self._last_step_time
            if wall > 0:
                scalars["train/busyFraction"] = min(1.0, float(step_seconds) / wall)
        self._last_step_time = seconds
        rows = tuple(
            (
                version,
                str(s.get("prompt", "")),
                str(s.get("completion", "")),
                _number(s.get("reward")),
                str(s.get("worker", "")),
                _number(s.get("staleness")),
            )
            for s in record.get("samples") or []
            if isinstance(s, Mapping)
        )
        tables = (Table("samples", SAMPLE_COLUMNS, rows),) if rows else ()
        return Point(version, unix_time, seconds, scalars, tables)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested configuration as flat ``a.b.c`` → text parameters (what MLflow takes; lists as JSON)."""
    import json

    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(params(value, f"{name}."))
        elif isinstance(value, str):
            out[name] = value
        else:
            out[name] = json.dumps(value, sort_keys=True)
    return out
