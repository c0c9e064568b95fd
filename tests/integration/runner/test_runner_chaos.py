"""``echorl run`` under chaos: its processes SIGKILLed at random moments, and it heals like a pod.

One run of a short Async job (real coordinator, two workers, trainer and evaluator processes). While
it trains, a seeded schedule SIGKILLs two workers, the trainer twice and the coordinator twice, in a
random order, each at a random policy version. With no manual step the run must:

* exit 0 with every version 1..N published exactly once (one manifest each, none written twice: the
  store refuses to overwrite, so a restarted trainer that repeated a version would have died of it);
* never have consumed a rollout staler than Δmax (the coordinators' and the trainer's own records);
* have exactly one trainer record per version (a trainer killed between publishing a version and
  writing its record writes it on resume, from the snapshot);
* count the restarts in ``summary.json``, and leave nothing running.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

STEPS = 48
DMAX = 2
JOB = f"""apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: chaos}}
spec:
  model: {{path: echorl:tiny}}
  task: {{name: arithmetic, heldoutSize: 16, evalEvery: 16}}
  algorithm: {{maxSteps: {STEPS}, batchSize: 2, groupSize: 4, sampling: {{maxNewTokens: 6}}}}
  storage: {{path: STORE}}
  syncPolicy: {{mode: Async, maxStaleness: {DMAX}, retention: {{keepLast: 1000}}}}
  trainingSwarm: {{checkpointInterval: 4}}
  inferenceSwarms: [{{name: cpu, replicas: 2}}]
"""
VICTIMS = ["cpu-0", "cpu-1", "trainer", "trainer", "coordinator", "coordinator"]


def process_groups() -> dict[int, int]:
    """Every live process's group: pid → pgid."""
    out: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                out[int(entry.name)] = int(fields[2])
    return out


def processes_of(run_dir: Path) -> dict[str, list[int]]:
    """The run's live processes by role, found by their command lines (each names its log or files)."""
    found: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if state == "Z" or not any(str(run_dir) in a for a in text):
            continue
        if "coordinator" in text:
            role = "coordinator"
        elif "trainer" in text:
            role = "trainer"
        elif "worker" in text:
            role = next((Path(a).stem for a in text if a.endswith(".jsonl") and "/workers/" in a), "worker")
        elif "echo_runtime.runner.evaluator" in text:
            role = "evaluator"
        else:
            role = "runner"
        found.setdefault(role, []).append(int(entry.name))
    return found


def versions_done(run_dir: Path) -> int:
    path = run_dir / "trainer.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_sigkills_of_every_kind_of_process_heal_without_help(tmp_path: Path, built_model_cache: Path) -> None:
    rng = random.Random(15)
    victims = rng.sample(VICTIMS, len(VICTIMS))
    at = sorted(rng.sample(range(4, STEPS - 6), len(victims)))
    store, run_dir = tmp_path / "store", tmp_path / "run"
    job = tmp_path / "chaos.yaml"
    job.write_text(JOB.replace("STORE", str(store)))
    runner = subprocess.Popen(
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
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    killed: list[tuple[str, int]] = []
    groups: set[int] = set()
    """Process groups of the run's children (each is started in its own, with its own children)."""
    deadline = time.monotonic() + 800
    try:
        for victim, version in zip(victims, at, strict=True):
            while versions_done(run_dir) < version:
                assert runner.poll() is None, (
                    f"the run ended early:\n{runner.stdout.read() if runner.stdout else ''}"
                )
                assert time.monotonic() < deadline, f"stuck before version {version}"
                time.sleep(0.2)
            time.sleep(rng.uniform(0.0, 1.0))  # anywhere in a step: sampling, training, publishing
            # The victim may be between a crash and its restart (an earlier kill, a backoff): wait for it.
            alive = time.monotonic() + 60
            running = processes_of(run_dir)
            while not running.get(victim) and time.monotonic() < alive:
                time.sleep(0.2)
                running = processes_of(run_dir)
            table = process_groups()
            groups.update(table[pid] for pids in running.values() for pid in pids if pid in table)
            pids = running.get(victim, [])
            assert pids, f"no {victim} process to kill at version {version} within 60 s: {running}"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            killed.append((victim, versions_done(run_dir)))
        output, _ = runner.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(timeout=30)
            # Killed outright, the runner cannot stop its children (each in its own process group).
            for pid in (pid for pids in processes_of(run_dir).values() for pid in pids):
                with contextlib.suppress(ProcessLookupError):
                    if os.getpgid(pid) != os.getpgid(0):
                        os.killpg(os.getpgid(pid), signal.SIGKILL)
    assert runner.returncode == 0, output[-4000:]
    assert len(killed) == len(VICTIMS)

    snapshots = store / "chaos" / "snapshots"
    published = sorted(int(p.name) for p in snapshots.iterdir() if p.name.isdigit())
    assert published == list(range(1, STEPS + 1))
    for version in published:  # one manifest per version, naming the one publish that counts
        manifest = json.loads((snapshots / str(version) / "manifest.json").read_text())
        assert manifest["version"] == version
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    assert "VersionExistsError" not in trainer_log and "already" not in trainer_log.lower()

    records = [json.loads(line) for line in (run_dir / "trainer.jsonl").read_text().splitlines()]
    assert sorted(r["policyVersion"] for r in records) == list(range(1, STEPS + 1))  # each exactly once
    assert all(r["maxStaleness"] is None or r["maxStaleness"] <= DMAX for r in records)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["policyVersion"] == STEPS and summary["trainerRecords"] == STEPS
    assert summary["maxObservedStaleness"] <= DMAX
    assert max(int(k) for k in summary["stalenessHistogram"]) <= DMAX
    assert summary["coordinatorIncarnations"] >= 3  # the first, plus one per coordinator kill
    assert 0 < summary["trainerBusyFraction"] <= 1
    restarts = summary["restarts"]
    for role in ("cpu-0", "cpu-1", "trainer", "coordinator"):
        assert restarts.get(role, 0) >= VICTIMS.count(role), (restarts, killed)
    time.sleep(1.0)
    assert processes_of(run_dir) == {}, "processes left running"
    groups.discard(os.getpgid(0))
    leftovers = {pid: pgid for pid, pgid in process_groups().items() if pgid in groups}
    assert not leftovers, f"processes of the run's process groups left running: {leftovers}"
