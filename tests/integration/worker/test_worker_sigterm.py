"""``echorl worker`` on SIGTERM, as real processes: a coordinator on a loopback port and one worker
that samples with the built-in tiny model (transformers backend, CPU, one thread).

The worker loop promises (``echo_runtime/worker/loop.py``): on SIGTERM it finishes the group in hand,
submits it, leaves the swarm (its other leases go back to the queue at once) and exits 0. The tests
read the outcome only through the coordinator's API (``GET /v1/status``, ``GET /metrics``), the
worker's exit code, its log and its timing file (``--metrics``):

* ``test_sigterm_mid_sampling_submits_the_lease_in_hand``: SIGTERM while the worker samples a full
  lease (``--capacity 4``, long completions). It exits 0 within :data:`EXIT_BOUND_S`, the coordinator
  no longer lists it, it holds no lease, and every task it leased was submitted exactly once (none
  released, the buffer holds exactly the groups the worker counts as submitted).
* ``test_sigterm_releases_leases_held_but_not_sampled``: the worker holds a full lease it cannot sample
  yet (the coordinator announced a version the snapshot store does not list yet, as an eventually
  consistent S3 listing can), SIGTERM. It exits 0 at once and those leases are back in the queue the
  moment it has exited — released, not expired: lease and task timeouts are ten minutes and the
  coordinator counts no expired worker — and the next worker that leases gets them without a new
  prompt being drawn. The groups it finished before were submitted and counted once.
* ``test_a_lease_held_while_the_store_lags_is_sampled_once_the_version_appears``: the same held lease,
  then version 1 is published into the store as the trainer publishes it (its LoRA adapter, through
  the store's ``publish``). The worker loads version 1 and samples and submits the very tasks it held
  — none re-issued, no new prompt drawn — each counted once. A worker that dropped the held tasks
  would never be leased anything again (the coordinator counts them against its capacity until the
  ten-minute task timeout), so it would load version 1 and then idle.

Both fail if the worker skips ``leave()``: it would stay listed (heartbeats every two minutes keep a
silent worker registered for the ten-minute lease timeout) and its held leases would stay leased.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from echo_runtime import snapshots, spec
from echo_runtime.coordinator import auth, client, wire
from services import procs

pytestmark = pytest.mark.timeout(240)  # a hang fails with a traceback, well before the suite's limit

T = TypeVar("T")
POOL = "cpu"
CAPACITY = 4
"""Tasks per lease (the worker's ``--capacity`` and the pool's ``capacity``): sampled as one batch."""
GROUP_SIZE = 4
LEASE_TIMEOUT_S = 600.0
"""Lease and task timeout: far longer than a test, so no lease can come back by expiry."""
HEARTBEAT_S = 120.0
"""Heartbeat interval: after the first beat a worker is silent unless it leases or submits."""
EXIT_BOUND_S = 30.0
"""How long a worker may take from SIGTERM to exit: finish one batch of long completions, submit it."""
IDLE_EXIT_BOUND_S = 15.0
"""How long a worker with nothing in hand may take from SIGTERM to exit (leave, interpreter exit)."""
START_TIMEOUT_S = 120.0
"""Starting a worker: import torch and transformers, load the model, register, lease (busy 2 cores)."""
CATCH_UP_S = 30.0
"""How long a worker holding a lease may take, once its version is listed, to load it (a LoRA adapter of
the tiny model) and sample and submit the lease (short completions)."""
RETRY = client.RetryPolicy(attempts=5, base=0.05, cap=0.5, deadline=10.0)
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ECHORL_THREADS": "1"}


def job_manifest(name: str, store: Path, max_staleness: int, max_new_tokens: int, buffer_size: int) -> str:
    job = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": "echorl:tiny"},
            "task": {"name": "arithmetic"},
            "algorithm": {
                "groupSize": GROUP_SIZE,
                # One lease fills a batch: the coordinator paces leases to what the next steps can
                # consume, so with Δmax 0 a worker can hold a whole lease only if a batch is that big.
                "batchSize": CAPACITY,
                "sampling": {"maxNewTokens": max_new_tokens},
            },
            "syncPolicy": {"mode": "Async", "maxStaleness": max_staleness, "bufferSize": buffer_size},
            "storage": {"type": "Local", "path": str(store)},
            "inferenceSwarms": [{"name": POOL, "capacity": CAPACITY}],
        },
    }
    return json.dumps(job)  # JSON is YAML


@dataclasses.dataclass
class Swarm:
    """One job's coordinator process, at most one ``echorl worker`` process, and their files."""

    root: Path
    env: dict[str, str]
    job_path: Path
    tokens: dict[str, Any]
    url: str
    coordinator: procs.ManagedProcess
    worker: procs.ManagedProcess | None = None

    @property
    def worker_metrics(self) -> Path:
        return self.root / "worker.jsonl"

    def start_worker(self) -> procs.ManagedProcess:
        argv = [
            sys.executable,
            "-m",
            "echo_runtime.cli",
            "worker",
            "--coordinator",
            self.url,
            "--pool",
            POOL,
            "--backend",
            "transformers",
            "--job",
            str(self.job_path),
            "--device",
            "cpu",
            "--threads",
            "1",
            "--capacity",
            str(CAPACITY),
            "--metrics",
            str(self.worker_metrics),
            "--cache-dir",
            str(self.root / "worker-cache"),
        ]
        env = {**self.env, "ECHORL_TOKEN": self.tokens["pools"][POOL]}  # as `echorl run` passes it
        self.worker = procs.ManagedProcess("worker", argv, self.root / "worker.log", env=env).start()
        return self.worker

    def status(self) -> wire.StatusDocument:
        headers = {"Authorization": f"Bearer {self.tokens['trainer']}"}
        reply = httpx.get(f"{self.url}/v1/status", headers=headers, timeout=5.0)
        reply.raise_for_status()
        return wire.StatusDocument.model_validate_json(reply.content)

    def metrics(self) -> dict[str, float]:
        """The coordinator's Prometheus gauges and counters, without the prefix (``tasks_leased``,
        ``tasks_reissued_total``, ``workers[cpu]``, ``requests_rejected_total`` summed over labels)."""
        reply = httpx.get(f"{self.url}/metrics", timeout=5.0)
        reply.raise_for_status()
        values: dict[str, float] = {"requests_rejected_total": 0.0}
        for family in text_string_to_metric_families(reply.text):
            for sample in family.samples:
                name = sample.name.removeprefix("echorl_coordinator_")
                if name.startswith("staleness"):
                    continue
                if name == "requests_rejected_total":
                    values[name] += sample.value
                elif "pool" in sample.labels:
                    values[f"{name}[{sample.labels['pool']}]"] = sample.value
                else:
                    values[name] = sample.value
        return values

    def worker_log(self) -> str:
        return (self.root / "worker.log").read_text(errors="replace")

    def worker_records(self) -> list[dict[str, Any]]:
        if not self.worker_metrics.exists():
            return []
        lines = self.worker_metrics.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def wait_for(self, what: str, check: Callable[[], T | None], timeout: float) -> T:
        """Poll ``check`` until it returns something truthy; fail with the worker's log tail if the
        worker exits first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            assert self.worker is not None
            if not self.worker.running():
                pytest.fail(self.worker.describe_failure(f"exited while waiting for {what}"))
            if time.monotonic() > deadline:
                pytest.fail(self.worker.describe_failure(f"no {what} within {timeout:.0f} s"))
            time.sleep(0.05)

    def holding_full_lease(self) -> dict[str, float] | None:
        metrics = self.metrics()
        return metrics if metrics["tasks_leased"] == CAPACITY else None

    def hold_a_lease_the_store_lags(self) -> dict[str, float]:
        """Start from a worker (with ``maxStaleness: 0``) that leased its first lease; announce version 1
        without a snapshot in the store, as a lagging (eventually consistent) store listing looks to a
        worker, and wait until the worker holds a full lease of tasks that need version 1 and has found
        that version missing. Returns the coordinator's metrics at that point.

        With Δmax = 0 the lease after the announcement is tagged minVersion 1; its reply tells the worker
        to load version 1, which the store does not list. No heartbeat tells it anything before then:
        the first one (sent at start) is answered, the next one is two minutes away."""
        # Drawn, not necessarily still held: with a small buffer the first lease may be sampled,
        # submitted and followed by no other (a full buffer pauses leasing) between two polls.
        leased = lambda: self.metrics()["tasks_created_total"] >= CAPACITY  # noqa: E731
        self.wait_for("first lease", leased, START_TIMEOUT_S)
        self.wait_for("first heartbeat", lambda: [w.loaded_version for w in self.status().workers] == [0], 30)
        with client.TrainerClient(self.url, self.tokens["trainer"], retry=RETRY) as trainer:
            assert trainer.announce(1).policy_version == 1

        def stuck_with_full_lease() -> dict[str, float] | None:
            # loop.py's VersionNotYetVisible: leased, version 1 not in the store
            stuck = "policy version 1 is not in the snapshot store yet" in self.worker_log()
            return self.holding_full_lease() if stuck else None

        return self.wait_for("lease held without sampling", stuck_with_full_lease, 60)

    def sigterm_worker(self) -> tuple[int, float]:
        """SIGTERM the worker process (only it, as a kubelet or Ctrl-C would); its exit code and the
        seconds it took to exit."""
        assert self.worker is not None and self.worker.popen is not None
        sent = time.monotonic()
        os.kill(self.worker.pid, signal.SIGTERM)
        try:
            code = self.worker.popen.wait(timeout=EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(self.worker.describe_failure(f"still running {EXIT_BOUND_S:.0f} s after SIGTERM"))
        return code, time.monotonic() - sent


@dataclasses.dataclass(frozen=True)
class TinyModel:
    cache: Path
    """An Echo cache (``ECHORL_CACHE_DIR``) holding the built model."""
    vocab_size: int


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """``echorl:tiny``, built once for this module (seconds) into a temporary Echo cache."""
    from echo_runtime.models import resolve

    cache = tmp_path_factory.mktemp("echorl-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ECHORL_CACHE_DIR", str(cache))
        mp.setenv("HF_HUB_OFFLINE", "1")
        path = Path(resolve.resolve_model("echorl:tiny"))
    return TinyModel(cache, int(json.loads((path / "config.json").read_text())["vocab_size"]))


@pytest.fixture
def start_swarm(tmp_path: Path, tiny_model: TinyModel) -> Iterator[Callable[..., Swarm]]:
    """``start_swarm(max_staleness=, max_new_tokens=[, buffer_size=])``: a job manifest, fresh join
    tokens and a healthy coordinator; every process is stopped afterwards (SIGKILL after a grace
    period)."""
    started: list[procs.ManagedProcess] = []
    swarms: list[Swarm] = []

    def start(*, max_staleness: int, max_new_tokens: int, buffer_size: int = 32) -> Swarm:
        env = {
            **os.environ,
            **ONE_THREAD,
            "ECHORL_CACHE_DIR": str(tiny_model.cache),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        job_path = tmp_path / "job.yaml"
        manifest = job_manifest("sigterm", tmp_path / "store", max_staleness, max_new_tokens, buffer_size)
        job_path.write_text(manifest)
        tokens = auth.generate([POOL])  # what `echorl run` writes
        tokens_path = tmp_path / "tokens.json"
        tokens_path.write_text(json.dumps(tokens))
        port = procs.free_ports(1)[0]
        argv = [
            sys.executable,
            "-m",
            "echo_runtime.cli",
            "coordinator",
            "--job",
            str(job_path),
            "--tokens-file",
            str(tokens_path),
            "--port",
            str(port),
            "--lease-timeout",
            str(LEASE_TIMEOUT_S),
            "--task-timeout",
            str(LEASE_TIMEOUT_S),
            "--heartbeat-interval",
            str(HEARTBEAT_S),
            # What it would read from the model's config.json, minus importing torch to find it.
            "--vocab-size",
            str(tiny_model.vocab_size),
        ]
        coordinator = procs.ManagedProcess("coordinator", argv, tmp_path / "coordinator.log", env=env)
        started.append(coordinator.start())
        url = f"http://127.0.0.1:{port}"
        coordinator.wait_healthy(lambda: httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200, 60)
        swarm = Swarm(tmp_path, env, job_path, tokens, url, coordinator)
        swarms.append(swarm)
        return swarm

    try:
        yield start
    finally:
        for swarm in swarms:
            if swarm.worker is not None:
                swarm.worker.stop(grace=5.0)
        for process in started:
            process.stop(grace=5.0)


def test_sigterm_mid_sampling_submits_the_lease_in_hand(start_swarm: Callable[..., Swarm]) -> None:
    # Long completions (a random tiny model rarely says EOS): one lease of 4 groups x 4 rollouts takes
    # seconds to sample, so the SIGTERM lands while the worker is sampling its lease.
    swarm = start_swarm(max_staleness=1, max_new_tokens=256)
    worker = swarm.start_worker()
    before = swarm.wait_for("full lease", swarm.holding_full_lease, START_TIMEOUT_S)
    samples_before = sum(r["event"] == "sample" for r in swarm.worker_records())
    assert [w.pool for w in swarm.status().workers] == [POOL]

    code, seconds = swarm.sigterm_worker()

    after, status = swarm.metrics(), swarm.status()
    log = swarm.worker_log()
    assert code == 0, worker.describe_failure("exit code after SIGTERM")
    assert seconds < EXIT_BOUND_S
    assert "signal 15: finishing the group in hand" in log, log[-3000:]
    # It left: no longer listed, and it holds nothing.
    assert status.workers == [] and status.pools[POOL].workers == 0
    assert after[f"workers[{POOL}]"] == 0
    assert after["tasks_leased"] == 0
    # The lease in hand was sampled to the end and submitted, not released and not dropped.
    records = swarm.worker_records()
    assert records and records[-1]["event"] == "exit", records[-3:]
    samples = [r for r in records if r["event"] == "sample"]
    assert len(samples) > samples_before, "the batch in hand at SIGTERM was never submitted"
    assert samples[-1]["groups"] == CAPACITY
    assert after["tasks_reissued_total"] == 0
    assert after["tasks_pending"] == 0
    assert after["buffer_groups"] >= before["buffer_groups"] + CAPACITY
    # Counted once: the buffer holds exactly the groups the worker submitted, every rollout once, and
    # every task drawn is accounted for.
    submitted_rollouts = records[-1]["rollouts"]
    assert submitted_rollouts == sum(r["groups"] for r in samples) * GROUP_SIZE
    assert after["buffer_groups"] * GROUP_SIZE == submitted_rollouts == after["rollouts_accepted_total"]
    assert status.buffer.groups == after["buffer_groups"]
    assert after["tasks_created_total"] == after["buffer_groups"]
    assert after["groups_dropped_stale_total"] == 0
    assert after["requests_rejected_total"] == 0
    assert after["workers_expired_total"] == 0


def test_sigterm_releases_leases_held_but_not_sampled(start_swarm: Callable[..., Swarm]) -> None:
    # Δmax = 0: once the coordinator announces version 1 every new lease needs version 1 loaded.
    swarm = start_swarm(max_staleness=0, max_new_tokens=8)
    worker = swarm.start_worker()
    # The worker cannot load version 1: it keeps the lease and retries.
    held = swarm.hold_a_lease_the_store_lags()
    assert "holding the lease and retrying" in swarm.worker_log()  # loop.py: leased, version not loadable
    samples = sum(r["event"] == "sample" for r in swarm.worker_records())
    time.sleep(1.0)  # held, not sampled: the same lease a second later, nothing sampled meanwhile
    before = swarm.metrics()
    assert before["tasks_leased"] == CAPACITY and before["tasks_reissued_total"] == 0
    assert before["tasks_created_total"] == held["tasks_created_total"]
    assert sum(r["event"] == "sample" for r in swarm.worker_records()) == samples
    assert [w.pool for w in swarm.status().workers] == [POOL]

    code, seconds = swarm.sigterm_worker()

    after, status = swarm.metrics(), swarm.status()
    assert code == 0, worker.describe_failure("exit code after SIGTERM")
    assert seconds < IDLE_EXIT_BOUND_S  # nothing in hand: it only leaves
    # Every lease it held is back in the queue at once: released by leave, not by expiry.
    assert after["tasks_leased"] == 0
    assert after["tasks_pending"] == before["tasks_pending"] + CAPACITY
    assert after["tasks_reissued_total"] == CAPACITY
    assert after["workers_expired_total"] == 0
    assert status.workers == [] and status.pools[POOL].workers == 0
    assert after[f"workers[{POOL}]"] == 0
    # The groups it finished before were submitted once each (version 0 at t_train 1 with Δmax 0: too
    # stale, so dropped and counted, or buffered if submitted before the announcement and then dropped).
    records = swarm.worker_records()
    assert records and records[-1]["event"] == "exit", records[-3:]
    submitted_groups = sum(r["groups"] for r in records if r["event"] == "sample")
    assert submitted_groups >= CAPACITY
    assert records[-1]["rollouts"] == submitted_groups * GROUP_SIZE
    assert after["groups_dropped_stale_total"] + after["buffer_groups"] == submitted_groups
    assert after["tasks_created_total"] == submitted_groups + after["tasks_pending"]
    assert after["requests_rejected_total"] == 0
    # Back in the queue means leasable: the next worker gets them, and no new prompt is drawn for it.
    with client.WorkerClient(
        swarm.url,
        swarm.tokens["pools"][POOL],
        pool=POOL,
        backend="transformers",
        device="cpu",
        dtype="float32",
        capacity=CAPACITY,
        retry=RETRY,
    ) as other:
        assert len(other.lease(CAPACITY).tasks) == CAPACITY
        again = swarm.metrics()
        assert again["tasks_created_total"] == after["tasks_created_total"]
        assert (
            again["tasks_leased"] == CAPACITY and again["tasks_pending"] == after["tasks_pending"] - CAPACITY
        )
        other.leave()


def test_a_lease_held_while_the_store_lags_is_sampled_once_the_version_appears(
    start_swarm: Callable[..., Swarm], tiny_model: TinyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from echo_runtime.trainer.policy import load_policy

    # bufferSize = one lease: the version-0 groups fill the buffer until the announcement drops them, so
    # the only lease after it is the held one, and once that is submitted the buffer is full again and
    # nothing more is leased or drawn: every counter below is exact.
    swarm = start_swarm(max_staleness=0, max_new_tokens=8, buffer_size=CAPACITY)
    # Version 1 as the trainer writes it (trainer/loop.py `_publish`): the trainable policy of the job's
    # model spec exports its snapshot files (a LoRA adapter), published later through the store's API.
    # Built before the worker starts, so that it does not compete with it for the two cores.
    job = spec.load_job(swarm.job_path)
    monkeypatch.setenv("ECHORL_CACHE_DIR", str(tiny_model.cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    policy = load_policy(job.spec.model, job.spec.task)
    files = policy.export_snapshot(tmp_path / "version-1")
    kind, base_model = policy.snapshot_kind, job.spec.model.path
    del policy
    store = snapshots.open_store(job.spec.storage, job.name)  # the store the worker reads
    assert kind == "lora" and store.latest_version() is None

    worker = swarm.start_worker()
    held = swarm.hold_a_lease_the_store_lags()
    before = swarm.worker_records()
    assert [r for r in before if r["event"] == "load"] == []
    assert all(r["version"] == 0 for r in before if r["event"] == "sample")
    submitted_before = sum(r["groups"] for r in before if r["event"] == "sample")
    assert held["tasks_reissued_total"] == 0 and held["tasks_pending"] == 0
    assert held["buffer_groups"] == 0  # the version-0 groups went when version 1 was announced

    store.publish(1, files, kind=kind, base_model=base_model)
    published = time.monotonic()

    def sampled_at_version_1() -> list[dict[str, Any]] | None:
        records = swarm.worker_records()[len(before) :]
        return records if any(r["event"] == "sample" and r["version"] == 1 for r in records) else None

    new = swarm.wait_for("the held lease sampled at version 1", sampled_at_version_1, CATCH_UP_S)
    caught_up = time.monotonic() - published
    # It loaded version 1 (once), then sampled the held lease at it: one batch of the full lease.
    assert [(r["event"], r["version"]) for r in new] == [("load", 1), ("sample", 1)], new
    assert new[1]["groups"] == CAPACITY
    assert new[1]["rollouts"] == (submitted_before + CAPACITY) * GROUP_SIZE
    after = swarm.metrics()
    # The same tasks: none went back to the queue, no prompt was drawn for them, none is still leased.
    assert after["tasks_reissued_total"] == 0
    assert after["tasks_created_total"] == held["tasks_created_total"]
    assert after["tasks_leased"] == 0 and after["tasks_pending"] == 0
    # Submitted once each, all admitted at version 1 (staleness 0): the buffer holds exactly the lease.
    assert after["buffer_groups"] == CAPACITY
    assert after["rollouts_accepted_total"] == held["rollouts_accepted_total"] + CAPACITY * GROUP_SIZE
    assert after["groups_dropped_stale_total"] == held["groups_dropped_stale_total"]
    assert after["tasks_created_total"] == after["buffer_groups"] + after["groups_dropped_stale_total"]
    assert after["groups_dropped_stale_total"] == submitted_before  # every version-0 group, once
    assert after["requests_rejected_total"] == 0
    status = swarm.status()
    assert status.policy_version == 1 and status.buffer.groups == CAPACITY
    assert [w.pool for w in status.workers] == [POOL]

    # Nothing more happens: the full buffer pauses leasing (the worker retries every second), and
    # nothing is submitted twice.
    time.sleep(1.5)
    assert swarm.metrics() == after
    assert swarm.worker_records()[len(before) :] == new
    code, _ = swarm.sigterm_worker()
    assert code == 0, worker.describe_failure("exit code after SIGTERM")
    final = swarm.metrics()
    assert final["tasks_reissued_total"] == 0  # it left holding nothing
    assert final["buffer_groups"] == CAPACITY and final["tasks_created_total"] == after["tasks_created_total"]
    assert caught_up < CATCH_UP_S
