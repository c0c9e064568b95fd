"""Handles on the real processes of the coordinator's integration tests (fixtures in conftest.py)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from echo_runtime.coordinator import client, wire
from services import procs

REPO = Path(__file__).resolve().parents[3]
SIM_WORKER = Path(__file__).with_name("sim_worker.py")
TRAINER_TOKEN = "it-trainer-token-0123456789"
POOL_TOKEN = "it-cpu-pool-token-0123456789"
FAST = client.RetryPolicy(attempts=60, base=0.05, cap=0.5, deadline=30.0)


def job_yaml(
    name: str,
    store: Path,
    mode: str,
    max_staleness: int,
    group_size: int,
    batch_size: int,
    buffer_size: int | None,
    refresh: int,
    task: str = "arithmetic",
) -> str:
    sync: dict[str, Any] = {"mode": mode, "maxStaleness": max_staleness, "refreshThreshold": refresh}
    if buffer_size is not None:
        sync["bufferSize"] = buffer_size
    job = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": name},
        "spec": {
            "task": {"name": task},
            "algorithm": {"groupSize": group_size, "batchSize": batch_size, "sampling": {"maxNewTokens": 8}},
            "syncPolicy": sync,
            "storage": {"type": "Local", "path": str(store)},
            "inferenceSwarms": [{"name": "cpu", "capacity": 4}],
        },
    }
    return json.dumps(job)  # JSON is YAML


@dataclass
class RunningCoordinator:
    argv: list[str]
    port: int
    log: Path
    store: Path
    job: str
    process: procs.ManagedProcess | None = None
    clients: list[Any] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RunningCoordinator:
        # tests/ too: a job may name a task of the test suite's (misbehaving_tasks:misbehaving)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "runtime"), str(REPO / "tests")])}
        self.process = procs.ManagedProcess("coordinator", self.argv, self.log, env=env, cwd=REPO).start()
        self.process.wait_healthy(self._healthy, timeout=60)
        return self

    def _healthy(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        assert self.process is not None and self.process.popen is not None
        self.process.popen.kill()
        self.process.popen.wait(timeout=10)
        self.process.stop()

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        if self.process is not None:
            self.process.stop()

    def trainer(self, retry: client.RetryPolicy = FAST) -> client.TrainerClient:
        c = client.TrainerClient(self.url, TRAINER_TOKEN, retry=retry, timeout=5.0)
        self.clients.append(c)
        return c

    def worker(self, capacity: int = 2, retry: client.RetryPolicy = FAST) -> client.WorkerClient:
        c = client.WorkerClient(
            self.url,
            POOL_TOKEN,
            pool="cpu",
            backend="transformers",
            device="cpu",
            dtype="float32",
            capacity=capacity,
            retry=retry,
            timeout=5.0,
        )
        self.clients.append(c)
        return c

    def status(self) -> wire.StatusDocument:
        r = httpx.get(
            f"{self.url}/v1/status", headers={"Authorization": f"Bearer {TRAINER_TOKEN}"}, timeout=5
        )
        return wire.StatusDocument.model_validate_json(r.content)


@dataclass
class SimWorker:
    popen: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        # A reader thread, not select(): several lines may arrive in one read and sit in the text
        # buffer, where select() on the pipe no longer sees them.
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for text in self.popen.stdout:
            self.lines.put(text)
        self.lines.put("")

    def line(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next JSON line the worker printed (it prints whole lines, flushed)."""
        try:
            text = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the sim worker printed nothing in {timeout} s") from None
        if not text:
            raise AssertionError(f"the sim worker exited with {self.popen.wait(timeout=10)}")
        parsed: dict[str, Any] = json.loads(text)
        return parsed

    def send(self, text: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(text + "\n")
        self.popen.stdin.flush()
