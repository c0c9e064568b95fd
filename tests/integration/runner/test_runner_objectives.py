"""Objectives end to end: real ``echorl run`` processes on the tiny model (docs/algorithms.md).

Asserts the promises, not learning: with DAPO's dynamic sampling no group without signal reaches an
optimizer step (the trainer's own records say so) while the coordinator counts the ones it filtered;
a job in which every reward is equal says, in its output and its summary, that it learns nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

JOB = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: {name}}}
spec:
  model: {{path: echorl:tiny}}
  task: {task}
  algorithm: {{preset: {preset}, maxSteps: {steps}, batchSize: 2, groupSize: 2, sampling: {{maxNewTokens: 6}}}}
  storage: {{path: {store}}}
  syncPolicy: {{mode: Async, maxStaleness: 1}}
"""


def _run(
    tmp_path: Path, name: str, task: str, preset: str, steps: int
) -> tuple[subprocess.CompletedProcess[str], Path]:
    job = tmp_path / f"{name}.yaml"
    job.write_text(JOB.format(name=name, task=task, preset=preset, steps=steps, store=tmp_path / "store"))
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "echo_runtime.cli",
            "run",
            str(job),
            "--no-progress",
            "--run-dir",
            str(run_dir),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, run_dir


def _records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in (json.loads(line) for line in lines if line.strip()) if r.get("kind") == kind]


def test_dynamic_sampling_keeps_groups_without_signal_out_of_every_step(
    tmp_path: Path, built_model_cache: Path
) -> None:
    # The untrained tiny model on arithmetic: a completion with a number scores 0.1, one without 0, a
    # right one 1; with two completions per group many groups are all-equal.
    proc, run_dir = _run(tmp_path, "dapo", "{name: arithmetic, evalEvery: 0}", "DAPO", steps=4)
    assert "objective: DAPO: " in proc.stdout and "clip 0.2/0.28" in proc.stdout
    trainer = _records(run_dir, "trainer")
    assert len({r["policyVersion"] for r in trainer}) == 4
    assert all(r["zeroSignalGroups"] == 0 for r in trainer), [r["zeroSignalGroups"] for r in trainer]
    assert all(r["entropy"] > 0 and "clipFractionHigh" in r and "dualClipFraction" in r for r in trainer)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["filteredGroups"] >= 1 and summary["maxObservedStaleness"] <= 1
    assert summary["consumedGroups"] == 8  # 4 steps × 2 groups, every one with signal


def test_a_job_that_learns_nothing_says_so(tmp_path: Path, built_model_cache: Path) -> None:
    # Exact answers the tiny model never writes: every reward 0, every advantage 0, no gradient.
    rows = [{"prompt": f"Spell the secret {i}.", "answer": f"zq-{i}-never-{i}-qz"} for i in range(40)]
    data = tmp_path / "impossible.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = f"{{name: dataset, dataset: {{path: {data}, checker: Exact}}, evalEvery: 0}}"
    proc, run_dir = _run(tmp_path, "nothing", task, "GRPO", steps=7)
    assert "warning: no learning signal" in proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [w.split(":")[0] for w in summary["warnings"]] == ["no learning signal"]
    trainer = _records(run_dir, "trainer")
    assert all(r["zeroSignalGroups"] == r["groups"] and r["gradNorm"] == 0.0 for r in trainer)
    assert max(r.get("noSignalBatches", 0) for r in _records(run_dir, "status")) >= 5
