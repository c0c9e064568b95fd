"""``echorl run`` with a reward model: a scoring pool of the run's own (``echorl scorer``) serving a
classifier fine-tuned here, frozen mid-run until the coordinator refuses a submission for want of its
reward, then killed for real. The run completes, every step's reward is the weighted mean of the
verifier's and the model's as the coordinator combined them, and the scorer's restart is counted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

JOB = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: rewarded}}
spec:
  model: {{path: echorl:tiny}}
  task: {{name: arithmetic, evalEvery: 0}}
  algorithm: {{maxSteps: 12, batchSize: 2, groupSize: 4, sampling: {{maxNewTokens: 6}}}}
  storage: {{path: {store}}}
  syncPolicy: {{mode: Sequential, maxStaleness: 0}}
  rewardModels:
  - {{name: bang, type: Classifier, model: {model}, threads: 1, timeoutSeconds: 2}}
"""


def _scorer_pids(run_dir: Path) -> list[int]:
    out = subprocess.run(
        ["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=True
    ).stdout
    return [int(line.split()[0]) for line in out.splitlines() if " scorer " in line and str(run_dir) in line]


def test_a_run_with_a_reward_model_whose_scorer_is_killed(
    tmp_path: Path, built_model_cache: Path, reward_model_dirs: dict[str, Path]
) -> None:
    job = tmp_path / "rewarded.yaml"
    job.write_text(JOB.format(store=tmp_path / "store", model=reward_model_dirs["classifier"]))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "echo_runtime.cli", "run", str(job), "--no-progress", "--run-dir", str(run_dir)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        trainer = run_dir / "trainer.jsonl"
        while not (trainer.exists() and trainer.read_text().strip()):
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "no step within 300 s"
            time.sleep(0.3)
        # 11 steps are left, each of whose batches needs the scorer: with 4 in all (before), a loaded
        # machine saw the first record only after the last step, and froze a scorer nobody called.
        (pid,) = _scorer_pids(run_dir)
        # Frozen first, so that the coordinator's calls time out (after timeoutSeconds) and submissions
        # are refused with 503 for as long as it takes to see that happen; then killed for real, and
        # the runner restarts it.
        os.kill(pid, signal.SIGSTOP)
        coordinator_log = run_dir / "logs" / "coordinator.log"
        while "its scoring pool did not answer" not in coordinator_log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline + 120, "no submission was refused"
            time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:  # SIGTERM: the runner stops its children, as after Ctrl-C
            proc.terminate()
            proc.wait(timeout=120)
    assert proc.returncode == 0, output[-4000:]
    assert "scoring pools: bang (1 process(es)), loading" in output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["policyVersion"] == 12
    assert summary["restarts"].get("scorer-bang-0") == 1
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("kind") == "trainer"]
    assert [r["policyVersion"] for r in steps] == list(range(1, 13))
    for record in steps:
        parts = record["rewardComponents"]
        assert {"task", "bang"} <= set(parts)
        assert 0.0 <= parts["bang"] <= 1.0
        # Weights 1 and 1: the reward trained on is the mean of the verifier's and the model's.
        assert record["rewardMean"] == pytest.approx((parts["task"] + parts["bang"]) / 2, abs=1e-9)
    assert not _scorer_pids(run_dir), "a scorer outlived the run"
