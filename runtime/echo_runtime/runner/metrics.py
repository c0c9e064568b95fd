"""A run's metrics: the ``metrics.jsonl`` record stream and the ``summary.json`` computed from it.

Records are JSON objects with a ``kind``:

* ``status`` — a sample of the coordinator's status document (docs/contracts.md) at ``time``
  seconds since the run started;
* ``eval`` — held-out accuracy of policy version ``policyVersion`` (evaluated by the evaluator
  process; ``publishedAt`` is when that version was published, which is the wall-clock that counts);
* ``trainer`` — one optimizer step as the trainer reports it (``stepSeconds``, ``loss``, ...).

:func:`summarise` is pure: the same records always give the same summary.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

Record = Mapping[str, Any]


class MetricsLog:
    """Appends records to ``metrics.jsonl``, one JSON object per line, flushed per record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: Record) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_records(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics file; a torn last line (a killed run) is skipped, not fatal."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def time_to_target(evals: Iterable[Record], target: float) -> tuple[float | None, int | None]:
    """(wall-clock seconds, policy version) at which held-out accuracy first reached ``target``."""
    for record in sorted(evals, key=lambda r: r["policyVersion"]):
        if record["heldoutAccuracy"] >= target:
            return float(record.get("publishedAt", record["time"])), int(record["policyVersion"])
    return None, None


def summarise(records: Iterable[Record], target_accuracy: float | None = None) -> dict[str, Any]:
    """The run's summary: progress, accuracy, throughput and the staleness actually consumed."""
    records = list(records)
    status = [r for r in records if r.get("kind") == "status"]
    evals = sorted((r for r in records if r.get("kind") == "eval"), key=lambda r: r["policyVersion"])
    steps = [r for r in records if r.get("kind") == "trainer"]
    last = status[-1] if status else {}
    wall = max((float(r.get("time", 0.0)) for r in records), default=0.0)
    busy = sum(float(r.get("stepSeconds", 0.0)) for r in steps)
    summary: dict[str, Any] = {
        "wallClockSeconds": wall,
        "policyVersion": last.get("policyVersion"),
        "maxObservedStaleness": last.get("maxObservedStaleness"),
        "maxStaleness": last.get("maxStaleness"),
        "stalenessHistogram": last.get("stalenessHistogram", {}),
        "droppedStale": last.get("droppedStale", 0),
        "weightedStale": last.get("weightedStale", 0),
        "consumedGroups": last.get("consumedGroups", 0),
        "rolloutsPerSecond": _mean(r.get("rolloutsPerSecond") for r in status),
        "reward": last.get("reward"),
        "trainerBusyFraction": busy / wall if wall > 0 else None,
        "initialHeldoutAccuracy": evals[0]["heldoutAccuracy"] if evals else None,
        "finalHeldoutAccuracy": evals[-1]["heldoutAccuracy"] if evals else None,
        "bestHeldoutAccuracy": max((e["heldoutAccuracy"] for e in evals), default=None),
        "evaluations": [
            {k: e.get(k) for k in ("policyVersion", "heldoutAccuracy", "heldoutReward", "publishedAt")}
            for e in evals
        ],
    }
    if target_accuracy is not None:
        seconds, version = time_to_target(evals, target_accuracy)
        summary["targetAccuracy"] = target_accuracy
        summary["timeToTargetSeconds"] = seconds
        summary["stepsToTarget"] = version
    return summary


def _mean(values: Iterable[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return sum(numbers) / len(numbers) if numbers else None
