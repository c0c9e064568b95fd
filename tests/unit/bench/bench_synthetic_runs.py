"""A synthetic ``echorl run`` directory: a traced simulation written in the runner's file formats.

``write_run(root, truth)`` simulates the ground-truth configuration ``truth`` (which must set
``maxSteps``) and writes what ``echorl run`` would have: ``job.yaml``, ``run.json``, ``metrics.jsonl``
(status samples every second with the coordinator's windowed rate, one ``kind: trainer`` record per step,
a final evaluation), ``workers/<pool>-<i>.jsonl`` (sample and load events with the worker loop's
cumulative fields) and ``summary.json`` (computed by the runner's own :func:`metrics.summarise`). The fit
never sees ``truth``: only the files.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from echo_runtime.bench.simulate import SimConfig, SimResult, simulate, windowed_rate
from echo_runtime.runner import metrics

T0 = 1_800_000_000.0


def job_manifest(truth: SimConfig, name: str) -> dict[str, Any]:
    assert truth.max_steps is not None
    sync: dict[str, Any] = {
        "mode": truth.mode,
        "maxStaleness": truth.max_staleness,
        "refreshThreshold": truth.refresh_threshold,
        "staleAction": truth.stale_action,
    }
    if truth.buffer_size is not None:
        sync["bufferSize"] = truth.buffer_size
    return {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": "echorl:tiny"},
            "task": {"name": "arithmetic"},
            "algorithm": {
                "maxSteps": truth.max_steps,
                "batchSize": truth.batch_size,
                "groupSize": truth.group_size,
            },
            "syncPolicy": sync,
            "trainingSwarm": {"checkpointInterval": max(1, truth.trainer.checkpoint_every)},
            "inferenceSwarms": [
                {"name": c.name, "backend": "transformers", "replicas": c.count, "capacity": c.capacity}
                for c in truth.worker_classes
            ],
        },
    }


def write_run(
    root: Path, truth: SimConfig, *, linger: float = 3.0, after: float = 2.0, status_interval: float = 1.0
) -> SimResult:
    """Simulate ``truth`` and write it as the run directory ``root``; returns the ground-truth result."""
    result = simulate(truth.replace(tail_seconds=linger), trace=True)
    trace = result.trace
    assert trace is not None
    root.mkdir(parents=True)
    (root / "job.yaml").write_text(yaml.safe_dump(job_manifest(truth, root.name)))
    (root / "run.json").write_text(json.dumps({"job": root.name, "t0": T0, "source": "job.yaml"}))

    # Workers: pool name and index as the runner names them; their clocks start at registration.
    names: dict[int, str] = {}
    classes: dict[int, int] = {}
    counters: collections.Counter[str] = collections.Counter()
    wid = 0
    for index, cls in enumerate(truth.worker_classes):
        for _ in range(cls.count):
            classes[wid] = index
            names[wid] = f"{cls.name}-{counters[cls.name]}"
            counters[cls.name] += 1
            wid += 1
    joined = {w: t for t, w, _ in reversed(trace.joins)}  # the first registration of each
    events: dict[int, list[tuple[float, str, float, int, int]]] = collections.defaultdict(list)
    for end, w, seconds, groups, version in trace.samples:
        events[w].append((end, "sample", seconds, groups, version))
    for end, w, seconds, version in trace.loads:
        events[w].append((end, "load", seconds, 0, version))
    (root / "workers").mkdir()
    overhead = {w: truth.worker_classes[classes[w]].overhead_seconds for w in names}
    for w, items in events.items():
        load_s = sample_s = lease_s = 0.0
        rollouts = 0
        lines = []
        previous, loaded = None, 0.0
        for end, kind, seconds, groups, version in sorted(items):
            record: dict[str, Any] = {"event": kind, "seconds": seconds, "version": version}
            if kind == "sample":
                sample_s += seconds
                rollouts += groups * truth.group_size
                record["groups"] = groups
                if previous is not None and truth.lease_wait > 0:
                    # A long-polling worker logs its time inside lease requests: the idle gap before
                    # this round less its loads and per-lease overhead (polling workers log nothing).
                    lease_s += max(0.0, end - seconds - previous - loaded - overhead[w])
                previous, loaded = end, 0.0
            else:
                load_s += seconds
                loaded += seconds
            record.update(time=end - joined[w], loadSeconds=load_s, sampleSeconds=sample_s, rollouts=rollouts)
            if truth.lease_wait > 0:
                record["leaseSeconds"] = lease_s
            lines.append(json.dumps(record))
        (root / "workers" / f"{names[w]}.jsonl").write_text("\n".join(lines) + "\n")

    # metrics.jsonl: status samples, trainer records, the final evaluation.
    records: list[dict[str, Any]] = []
    samples = np.arange(0.5, result.seconds + 1e-9, status_interval)
    rates = windowed_rate(result.accept_times, truth.group_size, samples, started=0.0)
    for at, rate in zip(samples, rates, strict=True):
        registered = [{"pool": names[w].rsplit("-", 1)[0]} for w, t in joined.items() if t <= at]
        records.append(
            {
                "kind": "status",
                "time": float(at),
                "rolloutsPerSecond": float(rate),
                "workers": registered,
                "policyVersion": sum(1 for s in trace.steps if s[0] + sum(s[1:4]) <= at),
                "pacing": truth.pacing,  # the coordinator's status says whether it paced
            }
        )
    for start, step_s, publish_s, checkpoint_s, version in trace.steps:
        end = start + step_s + publish_s + checkpoint_s
        if end > result.seconds:
            continue
        records.append(
            {
                "kind": "trainer",
                "time": end + 0.5,
                "unixTime": T0 + end,
                "policyVersion": int(version),
                "stepSeconds": step_s,
                "publishSeconds": publish_s,
                "checkpointSeconds": checkpoint_s,
            }
        )
    records.append(
        {
            "kind": "eval",
            "time": result.seconds + after,
            "policyVersion": result.steps,
            "heldoutAccuracy": 0.0,
            "publishedAt": result.seconds,
        }
    )
    records.sort(key=lambda r: r["time"])
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = metrics.summarise(records)
    summary["workerTiming"] = {}
    (root / "summary.json").write_text(json.dumps(summary))
    return result
