"""``echorl run`` end to end: real coordinator, worker, trainer and evaluator processes.

Learning itself is shown by the benchmark (docs/benchmarks/), not asserted here; these tests assert
the protocol's promises on a shortened job in both sync modes: the run completes, the policy version
advances to maxSteps, and no consumed rollout is ever staler than the bound.
"""

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
metadata: {{name: {name}}}
spec:
  model: {{path: echorl:tiny}}
  task: {{name: arithmetic, heldoutSize: 16, evalEvery: 2}}
  algorithm: {{maxSteps: {steps}, batchSize: 2, groupSize: 4, sampling: {{maxNewTokens: 6}}}}
  storage: {{path: {store}}}
  syncPolicy: {sync}
  trainingSwarm: {{checkpointInterval: 2}}
"""


def _write_job(tmp_path: Path, name: str, sync: str, steps: int) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(JOB.format(name=name, steps=steps, store=tmp_path / "store", sync=sync))
    return path


def _echorl(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "echo_runtime.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _consumed_staleness(run_dir: Path) -> tuple[int, dict[str, int]]:
    records = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    status = [r for r in records if r.get("kind") == "status"]
    assert status, "no status samples were recorded"
    last = status[-1]
    return last["maxStaleness"], last["stalenessHistogram"]


@pytest.mark.parametrize(
    ("mode", "sync", "bound"),
    [
        ("sequential", "{mode: Sequential, maxStaleness: 0}", 0),
        ("async", "{mode: Async, maxStaleness: 1, bufferSize: 4}", 1),
    ],
)
def test_run_completes_within_the_bound(
    tmp_path: Path, built_model_cache: Path, mode: str, sync: str, bound: int
) -> None:
    job = _write_job(tmp_path, f"run-{mode}", sync, steps=4)
    proc = _echorl("run", str(job), "--no-progress", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["policyVersion"] == 4
    max_staleness, histogram = _consumed_staleness(tmp_path / "run")
    assert max_staleness == bound
    assert histogram, "no groups were consumed"
    assert max(int(k) for k in histogram) <= bound
    assert sum(histogram.values()) == summary["consumedGroups"] >= 4 * 2
    assert summary["maxObservedStaleness"] <= bound
    versions = [e["policyVersion"] for e in summary["evaluations"]]
    assert versions[0] == 0 and versions[-1] == 4
    for name in ("coordinator", "trainer", "evaluator", "default-0"):
        assert (tmp_path / "run" / "logs" / f"{name}.log").exists()
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0


def test_evaluation_can_be_turned_off(tmp_path: Path, built_model_cache: Path) -> None:
    """``task.evalEvery: 0``: no evaluator process, no held-out accuracy, the run completes as usual."""
    job = tmp_path / "no-eval.yaml"
    text = JOB.format(
        name="no-eval", steps=3, store=tmp_path / "store", sync="{mode: Async, maxStaleness: 1}"
    )
    job.write_text(text.replace("evalEvery: 2", "evalEvery: 0"))
    refused = _echorl("run", str(job), "--no-progress", "--target-accuracy", "0.5", cwd=tmp_path)
    assert refused.returncode != 0 and "evalEvery" in refused.stderr and "--target-accuracy" in refused.stderr
    proc = _echorl("run", str(job), "--no-progress", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no evaluator (task.evalEvery 0)" in proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["policyVersion"] == 3 and summary["evaluations"] == []
    assert summary["finalHeldoutAccuracy"] is None
    assert "evaluator" not in summary["memory"]["peakRssMiB"] and "trainer" in summary["memory"]["peakRssMiB"]
    assert not (tmp_path / "run" / "logs" / "evaluator.log").exists()
    assert (tmp_path / "run" / "logs" / "trainer.log").exists()


def test_rerun_refuses_then_resume_continues(tmp_path: Path, built_model_cache: Path) -> None:
    job = _write_job(tmp_path, "resumable", "{mode: Async, maxStaleness: 2}", steps=2)
    run_dir = str(tmp_path / "run")
    first = _echorl("run", str(job), "--no-progress", "--run-dir", run_dir, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    first_summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    again = _echorl("run", str(job), "--no-progress", "--run-dir", run_dir, cwd=tmp_path)
    assert again.returncode != 0
    assert "--resume" in again.stderr and "--fresh" in again.stderr
    resumed = _echorl(
        "run", str(job), "--no-progress", "--run-dir", run_dir, "--resume", "--max-steps", "4", cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["policyVersion"] == 4
    # Every field true across the resume: what the first attempt logged is not counted twice, and the
    # second coordinator's counters (which started from 0) are added to the first's.
    assert summary["trainerRecords"] == 4 and summary["coordinatorIncarnations"] == 2
    assert 0 < summary["trainerBusyFraction"] <= 1
    assert summary["wallClockSeconds"] > first_summary["wallClockSeconds"]
    assert summary["consumedGroups"] == 4 * 2 == sum(summary["stalenessHistogram"].values())
    assert summary["generatedGroups"] >= summary["consumedGroups"]
    assert summary["droppedFraction"] == summary["droppedStale"] / summary["generatedGroups"]
    versions = [e["policyVersion"] for e in summary["evaluations"]]
    assert versions == sorted(set(versions)) and versions[-1] == 4
    timing = summary["workerTiming"]["default-0"]
    assert timing["incarnations"] == 2 and 0 <= timing["loadFraction"] <= 1
    assert timing["rollouts"] >= summary["consumedGroups"] * 4
    published = sorted(
        int(p.name) for p in (tmp_path / "store" / "resumable" / "snapshots").iterdir() if p.name.isdigit()
    )
    assert published[-1] == 4  # versions 3 and 4 followed 2: none repeated, none skipped


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"]
)
def test_ctrl_c_or_sigterm_stops_every_process(
    tmp_path: Path, built_model_cache: Path, sig: signal.Signals, code: int
) -> None:
    job = _write_job(tmp_path, "interrupted", "{mode: Async, maxStaleness: 1}", steps=10_000)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
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
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    trainer_log = run_dir / "logs" / "trainer.log"
    while not (trainer_log.exists() and "step" in trainer_log.read_text()):
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "the trainer never took a step"
        time.sleep(0.5)
    children = _descendants(proc.pid)
    assert len(children) >= 4
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == code
    time.sleep(0.5)
    alive = [pid for pid in children if _alive(pid)]
    assert not alive, f"processes left running: {alive}"
    assert (run_dir / "summary.json").exists()


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,sid="], capture_output=True, text=True, check=True).stdout
    table = [tuple(int(x) for x in line.split()) for line in out.splitlines() if line.strip()]
    found, frontier = set(), {pid}
    while frontier:
        nxt = {p for p, pp, _ in table if pp in frontier} - found
        found |= nxt
        frontier = nxt
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
