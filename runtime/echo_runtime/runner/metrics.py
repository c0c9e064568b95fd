"""A run's metrics: the ``metrics.jsonl`` record stream and the ``summary.json`` computed from it.

Records are JSON objects with a ``kind``:

* ``status`` — a sample of the coordinator's status document (docs/contracts.md) at ``time``
  seconds since the run started;
* ``eval`` — held-out accuracy of policy version ``policyVersion`` (evaluated by the evaluator
  process; ``publishedAt`` is when that version was published, which is the wall-clock that counts);
* ``trainer`` — one optimizer step as the trainer reports it (``stepSeconds``, ``loss``, ...).

:func:`summarise` is pure: the same records always give the same summary. It stays true across
restarts and ``--resume``: a version's last ``trainer`` or ``eval`` record stands for it (a resumed
process may report a version again), and the coordinator's counters, which start again from 0 when it
restarts (a new ``epoch`` in its status), are added up over its incarnations.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

Record = Mapping[str, Any]


class MetricsLog:
    """Appends records to ``metrics.jsonl``, one JSON object per line, flushed per record."""

    def __init__(self, path: Path, forward: Callable[[Record], None] | None = None) -> None:
        """``forward``, if given, also gets every record written (the experiment trackers)."""
        self.path = path
        self.forward = forward
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: Record) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        if self.forward is not None:
            self.forward(record)

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


COUNTERS = (
    "droppedStale",
    "weightedStale",
    "consumedGroups",
    "generatedGroups",
    "droppedQuarantined",
    "requeuedPrompts",
    "verifierTimeouts",
    "verifierErrors",
    "filteredGroups",
    "setAsidePrompts",
)
"""Coordinator status counters that a restart resets (summed over its incarnations)."""


def by_version(records: Iterable[Record]) -> list[Record]:
    """One record per ``policyVersion`` — the last one — in version order."""
    latest: dict[int, Record] = {}
    for record in records:
        latest[int(record["policyVersion"])] = record
    return [latest[v] for v in sorted(latest)]


def coordinator_totals(status: list[Record]) -> dict[str, Any]:
    """The coordinator's counters over the run: the last sample of each incarnation (``epoch``), added."""
    last_of: dict[str, Record] = {}
    for record in status:
        last_of[str(record.get("epoch", ""))] = record
    totals: dict[str, Any] = {name: sum(int(r.get(name, 0)) for r in last_of.values()) for name in COUNTERS}
    histogram: dict[int, int] = {}
    for record in last_of.values():
        for k, v in (record.get("stalenessHistogram") or {}).items():
            histogram[int(k)] = histogram.get(int(k), 0) + int(v)
    totals["stalenessHistogram"] = {str(k): histogram[k] for k in sorted(histogram)}
    observed = [
        r["maxObservedStaleness"] for r in last_of.values() if r.get("maxObservedStaleness") is not None
    ]
    totals["maxObservedStaleness"] = max(observed) if observed else None
    totals["coordinatorIncarnations"] = len(last_of)
    return totals


def warnings_seen(status: list[Record]) -> list[str]:
    """Every kind of warning the status documents carried during the run, each with its last message."""
    last: dict[str, str] = {}
    for record in status:
        for message in record.get("warnings") or []:
            last[str(message).split(":", 1)[0]] = str(message)
    return [last[k] for k in sorted(last)]


def summarise(records: Iterable[Record], target_accuracy: float | None = None) -> dict[str, Any]:
    """The run's summary: progress, accuracy, throughput and the staleness actually consumed."""
    records = list(records)
    status = [r for r in records if r.get("kind") == "status"]
    evals = by_version(r for r in records if r.get("kind") == "eval")
    steps = by_version(r for r in records if r.get("kind") == "trainer")
    last = status[-1] if status else {}
    wall = max((float(r.get("time", 0.0)) for r in records), default=0.0)
    busy = sum(float(r.get("stepSeconds", 0.0)) for r in steps)
    totals = coordinator_totals(status)
    generated = totals["generatedGroups"]
    summary: dict[str, Any] = {
        "wallClockSeconds": wall,
        "policyVersion": last.get("policyVersion"),
        "maxStaleness": last.get("maxStaleness"),
        **totals,
        "droppedFraction": totals["droppedStale"] / generated if generated else None,
        "trainerRecords": len(steps),
        "rolloutsPerSecond": _mean(r.get("rolloutsPerSecond") for r in status),
        "reward": last.get("reward"),
        "trainerBusyFraction": busy / wall if wall > 0 else None,
        "initialHeldoutAccuracy": evals[0]["heldoutAccuracy"] if evals else None,
        "finalHeldoutAccuracy": evals[-1]["heldoutAccuracy"] if evals else None,
        "bestHeldoutAccuracy": max((e["heldoutAccuracy"] for e in evals), default=None),
        "warnings": warnings_seen(status),
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
