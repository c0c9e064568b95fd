"""A real coordinator process on a loopback port, and real simulated-worker processes.

``coordinator_factory(mode=..., **settings)`` writes a job manifest and a tokens file under the test's
tmp dir, starts ``python -m echo_runtime.coordinator`` (the same code as ``echorl coordinator``) as a
:class:`services.procs.ManagedProcess`, waits for ``/healthz`` and returns a
:class:`coordinator_procs.RunningCoordinator` (``url``, ``trainer()``, ``worker()``, ``status()``,
``kill()``, ``start()``). ``spawn_worker(url, mode)`` starts ``sim_worker.py`` (see there) as another
process. Everything is stopped after the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from coordinator_procs import (
    POOL_TOKEN,
    REPO,
    SIM_WORKER,
    TRAINER_TOKEN,
    RunningCoordinator,
    SimWorker,
    job_yaml,
)

from services import procs


@pytest.fixture
def coordinator_factory(tmp_path: Path) -> Iterator[Callable[..., RunningCoordinator]]:
    running: list[RunningCoordinator] = []

    def make(
        mode: str = "Async",
        *,
        max_staleness: int = 1,
        group_size: int = 2,
        batch_size: int = 2,
        buffer_size: int | None = None,
        refresh: int = 0,
        lease_timeout: float = 30.0,
        heartbeat_interval: float = 1.0,
        use_store: bool = False,
        start: bool = True,
        task: str = "arithmetic",
        extra: tuple[str, ...] = (),
    ) -> RunningCoordinator:
        name = f"job{len(running)}"
        store = tmp_path / "store"
        job_path = tmp_path / f"{name}.yaml"
        job_path.write_text(
            job_yaml(name, store, mode, max_staleness, group_size, batch_size, buffer_size, refresh, task)
        )
        tokens = tmp_path / "tokens.json"
        tokens.write_text(json.dumps({"trainer": TRAINER_TOKEN, "pools": {"cpu": POOL_TOKEN}}))
        port = procs.free_ports(1)[0]
        argv = [
            sys.executable,
            "-m",
            "echo_runtime.coordinator",
            "--job",
            str(job_path),
            "--tokens-file",
            str(tokens),
            "--vocab-size",
            "100",
            "--tokenizer",
            "none",  # the sim workers send synthetic token ids; the check has tests of its own
            "--port",
            str(port),
            "--lease-timeout",
            str(lease_timeout),
            "--heartbeat-interval",
            str(heartbeat_interval),
            "--log-level",
            "info",
            *extra,
        ]
        if not use_store:
            argv.append("--no-store")
        coordinator = RunningCoordinator(argv, port, tmp_path / f"{name}.log", store, name)
        running.append(coordinator)
        return coordinator.start() if start else coordinator

    yield make
    for coordinator in running:
        coordinator.stop()


@pytest.fixture
def spawn_worker() -> Iterator[Callable[..., SimWorker]]:
    started: list[SimWorker] = []

    def spawn(url: str, mode: str, capacity: int = 2) -> SimWorker:
        env = {**os.environ, "PYTHONPATH": str(REPO / "runtime")}
        popen = subprocess.Popen(
            [sys.executable, str(SIM_WORKER), url, POOL_TOKEN, mode, str(capacity)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        worker = SimWorker(popen)
        started.append(worker)
        return worker

    yield spawn
    for worker in started:
        if worker.popen.poll() is None:
            worker.popen.kill()
        worker.popen.wait(timeout=10)
