"""Hostile workers against the real thing: a coordinator process that loads the job's tokenizer, an honest
``echorl worker`` process, ``echorl trainer`` as a process, and workers built on the client library that
lie — one per attack, each in pool ``mallory`` (``maxWorkers: 3``, ``maxLeases: 2``):

* **swapper** — samples honestly, then sends the right completion text with other token ids;
* **liar** — stays on the base model and tags its rollouts with the trainer's newest version, one it
  was never told to load and never reported holding;
* **hoarder** — leases all it can and never submits (it goes first, and the others join once it is caught:
  a quarantined worker still counts against ``maxWorkers``);

while the Async job's honest worker is held (SIGSTOP) from its first published version until every
attacker holds or has answered a lease, so that however fast the machine, the job cannot run out of
steps before each attack has been tried. (The lies only the trainer can catch — made-up log-probs,
stale version claims, text not drawn from the lease's key — are tried against a real ``echorl run`` in
``tests/integration/runner/test_runner_trust.py``.)

Each attack must be caught where the design says (docs/coordinator.md, "Trust"), and nothing any of
them sent may reach an optimizer step: the trainer's per-step records name the workers whose rollouts
it trained on, and the honest worker must be there while no hostile one ever is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from echo_runtime.backends import base as backend_base
from echo_runtime.backends.transformers import TransformersBackend
from echo_runtime.coordinator import client, wire
from echo_runtime.models import build
from echo_runtime.rollout import Rollout
from services import procs

pytestmark = pytest.mark.timeout(600)

TRAINER_TOKEN, HONEST_TOKEN, MALLORY_TOKEN = (
    "hostile-trainer-token-01",
    "hostile-cpu-token-0001",
    "mallory-token-00001",
)
GROUP, BATCH, NEW_TOKENS = 3, 2, 6
RETRY = client.RetryPolicy(attempts=3, base=0.05, cap=0.5, deadline=10.0)
STEPS = 40
"""Of the Async job: enough versions, after the honest worker is let go, for the liar to claim one it
never loaded (and for a second try if its first lease runs out while it waits)."""
TASK_TIMEOUT_S = 5.0
"""Short, so that the hoarder's leases run out (and it is caught) while the job runs."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build.init_model("tiny", tmp_path_factory.mktemp("hostile-model") / "tiny", seed=0))


@pytest.fixture(scope="module")
def backend(model_dir: str) -> TransformersBackend:
    return TransformersBackend(model_dir, device="cpu", threads=1)


@dataclasses.dataclass
class Job:
    root: Path
    url: str
    procs: list[procs.ManagedProcess] = dataclasses.field(default_factory=list)

    def status(self) -> wire.StatusDocument:
        reply = httpx.get(
            f"{self.url}/v1/status", headers={"Authorization": f"Bearer {TRAINER_TOKEN}"}, timeout=5
        )
        return wire.StatusDocument.model_validate_json(reply.content)

    def hostile(self) -> client.WorkerClient:
        return client.WorkerClient(
            self.url, MALLORY_TOKEN, pool="mallory", backend="transformers", device="cpu", dtype="float32",
            capacity=64, retry=RETRY, timeout=5.0,
        )  # fmt: skip

    def records(self) -> list[dict[str, Any]]:
        path = self.root / "trainer.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@contextlib.contextmanager
def running_job(
    root: Path, model_dir: str, sync: dict[str, Any], steps: int, lease_timeout: float = 30.0
) -> Iterator[Job]:
    """Coordinator, honest worker and trainer of one job; everything stopped on the way out."""
    job = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": "hostile"},
        "spec": {
            "model": {"path": model_dir, "lora": {"rank": 4, "alpha": 8}},
            "task": {"name": "arithmetic"},
            "algorithm": {
                "groupSize": GROUP, "batchSize": BATCH, "microBatchSize": 6, "learningRate": 0.05,
                "maxSteps": steps, "sampling": {"maxNewTokens": NEW_TOKENS},
            },
            "syncPolicy": sync,
            "storage": {"type": "Local", "path": str(root / "store")},
            "trainingSwarm": {"checkpointInterval": 100, "device": "cpu", "threads": 1},
            "inferenceSwarms": [
                {"name": "cpu", "capacity": 2},
                {"name": "mallory", "capacity": 64, "maxWorkers": 3, "maxLeases": 2},
            ],
        },
    }  # fmt: skip
    (root / "job.yaml").write_text(yaml.safe_dump(job))
    tokens = {"trainer": TRAINER_TOKEN, "pools": {"cpu": HONEST_TOKEN, "mallory": MALLORY_TOKEN}}
    (root / "tokens.json").write_text(json.dumps(tokens))
    port = procs.free_ports(1)[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "echo_runtime.cli"]
    running = Job(root, f"http://127.0.0.1:{port}")
    coordinator = procs.ManagedProcess(
        "coordinator",
        [*cli, "coordinator", "--job", str(root / "job.yaml"), "--tokens-file", str(root / "tokens.json"),
         "--port", str(port), "--heartbeat-interval", "0.5", "--task-timeout", str(TASK_TIMEOUT_S),
         "--lease-timeout", str(lease_timeout)],
        root / "coordinator.log", env=env,
    )  # fmt: skip
    running.procs.append(coordinator.start())
    try:
        coordinator.wait_healthy(
            lambda: httpx.get(f"{running.url}/healthz", timeout=2).status_code == 200, 120
        )
        worker = procs.ManagedProcess(
            "worker",
            [*cli, "worker", "--coordinator", running.url, "--pool", "cpu", "--job", str(root / "job.yaml"),
             "--device", "cpu", "--threads", "1", "--capacity", "2", "--cache-dir", str(root / "cache")],
            root / "worker.log", env={**env, "ECHORL_TOKEN": HONEST_TOKEN},
        )  # fmt: skip
        running.procs.append(worker.start())
        trainer = procs.ManagedProcess(
            "trainer",
            [*cli, "trainer", "--job", str(root / "job.yaml"), "--coordinator", running.url,
             "--metrics-file", str(root / "trainer.jsonl"), "--batch-timeout", "500"],
            root / "trainer.log", env={**env, "ECHORL_TRAINER_TOKEN": TRAINER_TOKEN},
        )  # fmt: skip
        running.procs.append(trainer.start())
        yield running
    finally:
        for process in reversed(running.procs):
            process.stop(grace=10.0)


def wait_trainer(job: Job, timeout: float = 400.0) -> None:
    trainer = job.procs[-1]
    assert trainer.popen is not None
    try:
        code = trainer.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(trainer.describe_failure(f"the trainer did not finish within {timeout:.0f} s"))
    assert code == 0, trainer.describe_failure(f"the trainer exited with {code}")


def sample(backend: TransformersBackend, lock: threading.Lock, task: wire.TaskOut) -> list[Rollout]:
    params = backend_base.SamplingParams(
        temperature=task.sampling.temperature,
        top_p=task.sampling.top_p,
        max_new_tokens=task.sampling.max_new_tokens,
    )
    with lock:
        return backend.sample([task.prompt], task.group_size, params)[0]


def rollouts(samples: list[Rollout], version: int, **change: Callable[[Any], Any]) -> list[wire.RolloutIn]:
    out = []
    for s in samples:
        fields: dict[str, Any] = {
            "completion": s.text, "token_ids": list(s.completion_ids), "logprobs": list(s.logprobs),
            "policy_version": version, "finish_reason": s.finish_reason,
        }  # fmt: skip
        for name, how in change.items():
            fields[name] = how(fields[name])
        out.append(wire.RolloutIn(**fields))
    return out


@dataclasses.dataclass
class Attack:
    """What one hostile worker did and what the coordinator answered."""

    worker: str = ""
    answers: list[str] = dataclasses.field(default_factory=list)
    """``outcome`` of each accepted submission, or ``status code field`` of each refusal."""
    most_leases: int = 0
    errors: list[BaseException] = dataclasses.field(default_factory=list)
    holding: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Set once it holds a task it means to lie about."""


def attack(body: Callable[[Attack], None], stop: threading.Event) -> tuple[Attack, threading.Thread]:
    record = Attack()

    def run() -> None:
        try:
            body(record)
        except client.Unauthorized as exc:  # quarantined: the end of this worker
            record.answers.append(f"{exc.status} {exc.code} {exc.field}")
        except BaseException as exc:  # surfaced by the tests
            record.errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return record, thread


def submit(w: client.WorkerClient, record: Attack, task_id: str, body: list[wire.RolloutIn]) -> None:
    try:
        record.answers.append(w.submit(task_id, body).outcome)
    except client.CoordinatorError as exc:
        record.answers.append(f"{exc.status} {exc.code} {exc.field}")


# ------------------------------------------------------------------------------------------- scenario A
@dataclasses.dataclass
class AsyncOutcome:
    status: wire.StatusDocument
    records: list[dict[str, Any]]
    attacks: dict[str, Attack]
    fourth: httpx.Response
    """A registration past the pool's maxWorkers."""


@pytest.fixture(scope="module")
def async_job(
    tmp_path_factory: pytest.TempPathFactory, model_dir: str, backend: TransformersBackend
) -> AsyncOutcome:
    root = tmp_path_factory.mktemp("hostile-async")
    lock, stop = threading.Lock(), threading.Event()
    sync = {"mode": "Async", "maxStaleness": 1}
    # A lease timeout longer than the hold, so that the held honest worker stays the one it was.
    with running_job(root, model_dir, sync, steps=STEPS, lease_timeout=900.0) as job:

        def swapper(me: Attack) -> None:
            with job.hostile() as w:
                me.worker = w.register().worker_id
                while not stop.is_set():
                    lease = w.lease(1, wait=1.0, loaded_version=0)
                    for task in lease.tasks:
                        bump = lambda ids: [(ids[0] + 1) % 64 + 8, *ids[1:]]  # noqa: E731
                        submit(w, me, task.task_id, rollouts(sample(backend, lock, task), 0, token_ids=bump))

        def liar(me: Attack) -> None:
            with job.hostile() as w:
                me.worker = w.register().worker_id
                while not stop.is_set() and not any(a.endswith(".policyVersion") for a in me.answers):
                    seen = job.status().policy_version  # it says it holds the newest: it is told nothing
                    lease = w.lease(1, wait=1.0, loaded_version=seen)
                    seen = max(seen, lease.load_version or 0)  # a version it was told is one it may claim
                    for task in lease.tasks:
                        samples = sample(backend, lock, task)  # with the base model, whatever it says
                        me.holding.set()
                        while not stop.is_set() and job.status().policy_version <= seen:
                            time.sleep(0.05)  # until the trainer has published a version it never reported
                        submit(w, me, task.task_id, rollouts(samples, job.status().policy_version))

        def hoarder(me: Attack) -> None:
            with job.hostile() as w:
                me.worker = w.register().worker_id
                while not stop.is_set():
                    w.lease(64, loaded_version=0)
                    held = job.status().pools["mallory"].leases
                    me.most_leases = max(me.most_leases, held)
                    w.heartbeat(0)  # alive, never submitting
                    time.sleep(0.3)

        honest, trainer = job.procs[1], job.procs[2]
        until(lambda: job.status().policy_version >= 1 or not trainer.running(), 300)
        honest.pause()  # warm and trained on; the job waits for it from here
        try:
            # The hoarder goes first, alone in its pool: it holds the pool's leases (maxLeases) until
            # it is caught, not racing the others for them.
            attacks = {"hoarder": attack(hoarder, stop)}
            hoarder_id = lambda: attacks["hoarder"][0].worker  # noqa: E731
            until(lambda: any(q.id == hoarder_id() for q in job.status().quarantined), 120)
            attacks["swapper"] = attack(swapper, stop)
            until(lambda: bool(attacks["swapper"][0].answers), 120)
            attacks["liar"] = attack(liar, stop)  # its lease must not run out while the others go
            until(attacks["liar"][0].holding.is_set, 120)
            # Both registered: with the quarantined hoarder, the pool is full.
            fourth = httpx.post(
                f"{job.url}/v1/workers",
                json={"pool": "mallory", "backend": "transformers", "device": "cpu", "dtype": "float32"},
                headers={"Authorization": f"Bearer {MALLORY_TOKEN}"},
                timeout=5,
            )
        finally:
            honest.resume()
        wait_trainer(job)
        stop.set()
        for _, thread in attacks.values():
            thread.join(timeout=30)
        status = job.status()  # once nobody submits any more: the counts match what they were told
        return AsyncOutcome(status, job.records(), {k: v[0] for k, v in attacks.items()}, fourth)


def until(condition: Callable[[], bool], timeout: float) -> None:
    """Wait for ``condition``; on timeout go on, and let the assertions say what did not happen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        time.sleep(0.2)


def trained_on(records: list[dict[str, Any]]) -> set[str]:
    return {worker for r in records for worker in r["workers"]}


def test_right_text_with_other_token_ids_is_refused(async_job: AsyncOutcome) -> None:
    swapper = async_job.attacks["swapper"]
    assert not swapper.errors, swapper.errors
    refused = [
        a for a in swapper.answers if a.startswith("422 invalid rollouts[") and a.endswith(".tokenIds")
    ]
    # Refused submissions leave its leases held and running out: it ends quarantined as a hoarder.
    assert refused and swapper.answers[len(refused) :] in ([], ["403 quarantined workerId"]), swapper.answers
    rejected = async_job.status.pools["mallory"].rejected_rollouts
    assert rejected["tokenMismatch"] == len(refused)
    assert swapper.worker not in trained_on(async_job.records)


def test_a_version_never_loaded_is_refused(async_job: AsyncOutcome) -> None:
    liar = async_job.attacks["liar"]
    assert not liar.errors, liar.errors
    refused = [
        a for a in liar.answers if a.startswith("422 invalid rollouts[") and a.endswith(".policyVersion")
    ]
    # A lease that ran out while it waited for the trainer to move on is refused as not held instead.
    assert refused and set(liar.answers) <= {*refused, "409 lease_not_held taskId"}, liar.answers
    assert async_job.status.pools["mallory"].rejected_rollouts["unloadedVersion"] == len(refused)
    assert liar.worker not in trained_on(async_job.records)


def test_lease_hoarding_is_capped_by_the_pool_and_caught(async_job: AsyncOutcome) -> None:
    hoarder = async_job.attacks["hoarder"]
    assert not hoarder.errors, hoarder.errors
    assert 1 <= hoarder.most_leases <= 2  # maxLeases of pool mallory, though it asked for 64 each time
    caught = {q.id: q for q in async_job.status.quarantined}
    assert hoarder.worker in caught and "lease hoarding" in caught[hoarder.worker].reason
    assert hoarder.answers and hoarder.answers[-1] == "403 quarantined workerId"
    assert hoarder.worker not in trained_on(async_job.records)


def test_a_pool_registers_no_more_than_max_workers(async_job: AsyncOutcome) -> None:
    assert async_job.fourth.status_code == 429, async_job.fourth.text
    error = async_job.fourth.json()["error"]
    assert error["field"] == "pool" and "maxWorkers is 3" in error["message"]


def test_the_honest_worker_kept_the_job_going(async_job: AsyncOutcome) -> None:
    records = async_job.records
    assert [r["policyVersion"] for r in records] == list(range(1, STEPS + 1))
    honest = trained_on(records) - {a.worker for a in async_job.attacks.values()}
    assert len(honest) == 1 and trained_on(records) == honest
    # Its text was checked token by token against its leases' keys (echorl worker draws with them).
    (worker,) = honest
    gaps = [
        r["logprobChecks"][worker]["worstDrawGap"] for r in records if worker in r.get("logprobChecks", {})
    ]
    assert gaps and max(gaps) < 1e-3, gaps
    assert (
        async_job.status.max_observed_staleness is not None and async_job.status.max_observed_staleness <= 1
    )
