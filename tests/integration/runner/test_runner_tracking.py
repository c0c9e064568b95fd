"""``echorl run --report-to all``: a real local run (coordinator, worker, trainer, evaluator), stopped
and resumed, reported to TensorBoard, MLflow, W&B (offline) and trackio. What each tracker holds is
read back with its own reader (tests/tracker_files.py) and compared with the run's ``metrics.jsonl``:
one tracker run across the resume, every trainer record's loss at its version, every evaluation,
the tables of sample completions, and the run's configuration."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tracker_files

DESTINATIONS = {"MLFLOW_TRACKING_URI", "WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "TRACKIO_DIR"}
"""Where the trackers would write, if the caller's environment said: left out, so they write to the
run's own directory (the telemetry switches of tests/conftest.py stay)."""

JOB = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: tracked}}
spec:
  model: {{path: echorl:tiny}}
  task: {{name: arithmetic, heldoutSize: 16, evalEvery: 2}}
  algorithm: {{maxSteps: 4, batchSize: 2, groupSize: 4, learningRate: 0.0003, sampling: {{maxNewTokens: 6}}}}
  storage: {{path: {store}}}
  syncPolicy: {{mode: Async, maxStaleness: 1}}
  trainingSwarm: {{checkpointInterval: 2, tracking: {{project: echo-it, samplesEvery: 2, samples: 2}}}}
"""


def _echorl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in DESTINATIONS}
    return subprocess.run(
        [sys.executable, "-m", "echo_runtime.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600, env={**env, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def _losses(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [(r["policyVersion"], r["loss"]) for r in records if r.get("kind") == "trainer"]


def _close(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6, abs=1e-7)


def test_a_resumed_run_reports_everything_to_one_run_of_each_tracker(
    tmp_path: Path, built_model_cache: Path
) -> None:
    job = tmp_path / "tracked.yaml"
    job.write_text(JOB.format(store=tmp_path / "store"))
    run_dir = tmp_path / "run"
    bad = _echorl("run", str(job), "--report-to", "tensorboard,comet", cwd=tmp_path)
    assert bad.returncode == 2 and "--report-to" in bad.stderr and "comet" in bad.stderr
    first = _echorl(
        "run", str(job), "--no-progress", "--run-dir", str(run_dir), "--max-steps", "2", "--report-to", "all",
        cwd=tmp_path,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "reporting to tensorboard, mlflow, wandb, trackio" in first.stdout
    run_id = (run_dir / "tracking" / "run-id").read_text().strip()
    resumed = _echorl(
        "run", str(job), "--no-progress", "--run-dir", str(run_dir), "--resume", "--report-to", "all",
        cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"(run {run_id}," in resumed.stdout
    assert "warning: tracker" not in first.stdout + resumed.stdout

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = _losses(records)
    assert [v for v, _ in losses] == [1, 2, 3, 4]
    # The tiny model's accuracy is mostly 0: its mean reward (partial credit) tells evaluations apart.
    evaluations = [(r["policyVersion"], r["heldoutReward"]) for r in records if r["kind"] == "eval"]
    assert evaluations and evaluations[-1][0] == 4
    sampled = {
        r["policyVersion"]: r["samples"] for r in records if r.get("kind") == "trainer" and "samples" in r
    }
    assert sorted(sampled) == [2, 4] and all(len(rows) == 2 for rows in sampled.values())
    base = run_dir / "tracking"

    logdir = base / "tensorboard" / "tracked"
    scalars = tracker_files.tensorboard_scalars(logdir)
    _close(scalars["train/loss"], losses)
    _close(scalars["eval/heldoutReward"], evaluations)
    # Sampled every second, logged once per version (by each of the two runners: the resume repeats one).
    status_versions = [s for s, _ in scalars["coordinator/consumedGroups"]]
    assert len(set(status_versions)) >= 2 and len(status_versions) <= len(set(status_versions)) + 1
    busy = scalars["workers/default-0/busyFraction"]
    assert busy and all(0.0 < v <= 1.0 for _, v in busy)
    texts = tracker_files.tensorboard_texts(logdir)
    assert [s for s, _ in texts["samples"]] == [2, 4]
    assert sampled[4][0]["completion"].strip().split("\n")[0] in texts["samples"][1][1]
    assert '"learningRate": 0.0003' in texts["config"][0][1]

    client, run = tracker_files.mlflow_run((base / "mlruns").as_uri(), "echo-it")  # one run, resumed
    assert run.data.tags["echorl.runId"] == run_id and run.info.status == "FINISHED"
    _close(tracker_files.mlflow_series(client, run, "train/loss"), losses)
    _close(tracker_files.mlflow_series(client, run, "eval/heldoutReward"), sorted(evaluations))
    assert run.data.params["spec.algorithm.learningRate"] == "0.0003"
    assert run.data.params["echorlVersion"] and run.data.params["job"] == "tracked"

    runs = sorted((base / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(f"-{run_id}") for r in runs)  # one W&B run id, resumed
    rows = [row for r in runs for row in tracker_files.wandb_history(r)]
    _close([(r["policyVersion"], r["train/loss"]) for r in rows if "train/loss" in r], losses)
    _close(
        [(r["policyVersion"], r["eval/heldoutReward"]) for r in rows if "eval/heldoutReward" in r],
        evaluations,
    )

    got = tracker_files.trackio_logs(base / "trackio", "echo-it")
    assert list(got["logs"]) == [run_id]
    logs = got["logs"][run_id]
    _close([(r["step"], r["train/loss"]) for r in logs if "train/loss" in r], losses)
    assert [r["step"] for r in logs if "samples" in r] == [2, 4]
