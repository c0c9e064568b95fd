"""Colocated mode and ``echorl bench sync`` end to end: real ``echorl run`` processes on the tiny model.

Asserts the promises, not learning: a Colocated run completes with every consumed group at staleness 0
and the same records and summary as the decoupled modes; a 1 seed × 2 configurations × 2 steps grid
writes results.json, results.md and the plots, consistent with its runs' summaries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

JOB = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: {name}}}
spec:
  model: {{path: echorl:tiny}}
  task: {{name: arithmetic, heldoutSize: 8, evalEvery: 2}}
  algorithm: {{maxSteps: {steps}, batchSize: 2, groupSize: 4, sampling: {{maxNewTokens: 6}}}}
  storage: {{path: {store}}}
  syncPolicy: {sync}
  trainingSwarm: {{checkpointInterval: 2}}
"""


def _echorl(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "echo_runtime.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _records(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_colocated_run_is_on_policy(tmp_path: Path, built_model_cache: Path) -> None:
    job = tmp_path / "colocated.yaml"
    job.write_text(
        JOB.format(
            name="colocated", steps=3, store=tmp_path / "store", sync="{mode: Colocated, maxStaleness: 0}"
        )
    )
    run_dir = tmp_path / "run"
    proc = _echorl(
        "run", str(job), "--no-progress", "--run-dir", str(run_dir), "--target-accuracy", "0", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mode"] == "Colocated"
    assert summary["policyVersion"] == 3
    assert summary["maxObservedStaleness"] == 0
    assert summary["stalenessHistogram"] == {"0": 3 * 2} == {"0": summary["consumedGroups"]}
    assert summary["droppedStale"] == 0 and summary["weightedStale"] == 0
    assert summary["workerTiming"]["colocated"]["loadSeconds"] == 0.0
    assert summary["stepsToTarget"] == 0  # the target 0 is met by the starting policy
    assert [e["policyVersion"] for e in summary["evaluations"]][-1] == 3
    steps = [r for r in _records(run_dir) if r.get("kind") == "trainer"]
    assert [r["policyVersion"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["maxStaleness"] == 0 and r["droppedGroups"] == 0
        # Sampling shares the trainer's module: behaviour and recomputed log-probs agree to rounding.
        assert r["logprobMismatch"]["transformers"]["maxAbs"] < 1e-4  # type: ignore[index]
    assert any((tmp_path / "store").rglob("snapshots/3")), "version 3 was not published"


def test_bench_sync_tiny_grid(tmp_path: Path, built_model_cache: Path) -> None:
    job = tmp_path / "grid.yaml"
    job.write_text(
        JOB.format(name="grid", steps=2, store=tmp_path / "ignored", sync="{mode: Async, maxStaleness: 1}")
    )
    out = tmp_path / "out"
    args = ["bench", "sync", "--job", str(job), "--configs", "Colocated,Async:1", "--seeds", "1"]
    proc = _echorl(*args, "--max-steps", "2", "--target-accuracy", "0", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("results.json", "results.md", "accuracy_vs_wallclock.png", "staleness.png", "speedup.png"):
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    assert list(results["configs"]) == ["Colocated", "Async:1"]
    assert results["failures"] == []
    for name, slug, bound in (("Colocated", "colocated", 0), ("Async:1", "async1", 1)):
        summary = json.loads((out / slug / "seed0" / "summary.json").read_text())
        config = results["configs"][name]
        assert summary["policyVersion"] == 2
        assert config["seeds"] == 1 and config["reachedTarget"] == 1
        assert config["stalenessHistogram"] == summary["stalenessHistogram"]
        assert max(int(k) for k in config["stalenessHistogram"]) <= bound
        assert config["finalHeldoutAccuracy"]["mean"] == summary["finalHeldoutAccuracy"]
        assert 0 < config["trainerBusyFraction"]["mean"] < 1
    assert results["configs"]["Colocated"]["snapshotLoadFraction"]["mean"] == 0.0
    assert results["configs"]["Colocated"]["speedupVsColocated"]["rolloutsPerSecond"][
        "ratio"
    ] == pytest.approx(1.0)
    assert "| Async:1 | 1 |" in (out / "results.md").read_text()
    # --resume-grid skips finished runs and re-aggregates the same results.
    again = _echorl(
        *args, "--max-steps", "2", "--target-accuracy", "0", "--out", str(out), "--resume-grid", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "skipped" in again.stderr
    rerun = json.loads((out / "results.json").read_text())
    assert (
        rerun["configs"]["Async:1"]["rolloutsPerSecond"] == results["configs"]["Async:1"]["rolloutsPerSecond"]
    )
