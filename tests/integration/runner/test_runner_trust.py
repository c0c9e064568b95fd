"""Workers that lie, joining the external pool of a real ``echorl run``; an honest one beside them.

``echorl run`` runs the coordinator and the trainer (Async, Δmax 2) of a job whose only pool,
``volunteers``, is external: every worker joins it from outside with the pool's join token, as a
volunteer's machine would. An honest ``echorl worker --external`` process keeps the job going; three
workers built on the client library lie in the ways only the trainer can catch, each with log-probs
or text the coordinator cannot tell from honest ones:

* the **fabricator** claims the version it holds but makes up its log-probs (−0.01 everywhere);
* the **patient liar** claims, for every group, a version older than the newest (reported as held, so
  the coordinator accepts it) with log-probs all 0.0: the check must recompute with the weights of the
  version each group claims, whatever its staleness;
* the **chooser** is the real worker loop (:class:`echo_runtime.worker.loop.Worker`): it loads every
  version it is told to from the store, so its log-probs are *exact*, but it does not draw with its
  lease's key: of three completions sampled with the operating system's randomness it submits the one
  it likes best. Only the token check against the lease's key (``backends/seeded.py``) can see that.

Once the fabricator and the chooser have a group in the buffer and the patient liar knows an older
version to claim, the honest worker is held (SIGSTOP), so the batches hold their groups and the trainer
has to check them (and versions wait, so the patient's claim stays within Δmax); it is let go once all
three are quarantined. Then: every
liar quarantined for the reason the design gives, none of their groups in any optimizer step (the
trainer's per-step lineage, ``workers``), none trained before its conviction, and the honest external
worker in the steps and never quarantined. (Every other ``echorl run`` of the suite checks its honest
workers' rollouts the same way: a false alarm there would leave the job without workers.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from echo_runtime import snapshots, spec
from echo_runtime.backends import base as backend_base
from echo_runtime.backends.transformers import TransformersBackend
from echo_runtime.coordinator import client, wire
from echo_runtime.models import build
from echo_runtime.models.prompts import Prompt, PromptStyle
from echo_runtime.rollout import Rollout
from echo_runtime.worker.loop import Worker
from services import procs

pytestmark = pytest.mark.timeout(600)

STEPS, BOUND, GROUP, BATCH, NEW_TOKENS = 16, 2, 3, 2, 6
RETRY = client.RetryPolicy(attempts=3, base=0.05, cap=0.5, deadline=10.0)


@dataclasses.dataclass
class Liar:
    """What one lying worker did and what the coordinator answered."""

    worker: str = ""
    answers: list[str] = dataclasses.field(default_factory=list)
    """``outcome`` of each accepted submission, or ``status code field`` of each refusal."""
    errors: list[BaseException] = dataclasses.field(default_factory=list)
    buffered: threading.Event = dataclasses.field(default_factory=threading.Event)


class Chooser(TransformersBackend):
    """Exact log-probs of text it chose: the best (most likely) of three completions sampled with the
    operating system's randomness, never with the lease's key."""

    def sample(
        self, prompts: Sequence[Prompt], n: int, params: backend_base.SamplingParams
    ) -> list[list[Rollout]]:
        tries = [
            super(Chooser, self).sample(
                prompts, n, dataclasses.replace(params, keys=None, seed=secrets.randbits(63))
            )
            for _ in range(3)
        ]
        return [
            [max((t[p][r] for t in tries), key=lambda s: sum(s.logprobs)) for r in range(n)]
            for p in range(len(prompts))
        ]


@dataclasses.dataclass
class Run:
    root: Path
    url: str
    tokens: dict[str, Any]

    def status(self) -> wire.StatusDocument:
        reply = httpx.get(
            f"{self.url}/v1/status", headers={"Authorization": f"Bearer {self.tokens['trainer']}"}, timeout=5
        )
        return wire.StatusDocument.model_validate_json(reply.content)

    def client(self, capacity: int = 2) -> client.WorkerClient:
        return client.WorkerClient(
            self.url, self.tokens["pools"]["volunteers"], pool="volunteers", backend="transformers",
            device="cpu", dtype="float32", capacity=capacity, external=True, retry=RETRY, timeout=5.0,
        )  # fmt: skip

    def caught(self, liar: Liar) -> bool:
        try:
            return any(q.id == liar.worker for q in self.status().quarantined)
        except httpx.HTTPError:  # the run has ended: the assertions say what did not happen
            return True

    def last_status(self) -> wire.StatusDocument:
        """The last status document ``echorl run`` recorded (``metrics.jsonl``), once the run is over."""
        records = [json.loads(line) for line in (self.root / "metrics.jsonl").read_text().splitlines()]
        last = [r for r in records if r.get("kind") == "status"][-1]
        return wire.StatusDocument.model_validate(
            {k: v for k, v in last.items() if k not in ("kind", "time")}
        )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build.init_model("tiny", tmp_path_factory.mktemp("trust-model") / "tiny", seed=0))


@contextlib.contextmanager
def echorl_run(
    root: Path, model_dir: str
) -> Iterator[tuple[Run, procs.ManagedProcess, procs.ManagedProcess]]:
    """``echorl run`` of a job whose one pool is external, and an honest external worker joined to it."""
    job = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": "trust"},
        "spec": {
            "model": {"path": model_dir, "lora": {"rank": 4, "alpha": 8}},
            "task": {"name": "arithmetic", "evalEvery": 0},
            "algorithm": {
                "groupSize": GROUP, "batchSize": BATCH, "microBatchSize": 6, "learningRate": 0.05,
                "maxSteps": STEPS, "sampling": {"maxNewTokens": NEW_TOKENS},
            },
            "syncPolicy": {"mode": "Async", "maxStaleness": BOUND},
            "storage": {"type": "Local", "path": str(root / "store")},
            "trainingSwarm": {"checkpointInterval": 100, "device": "cpu", "threads": 1},
            "inferenceSwarms": [{"name": "volunteers", "external": True, "capacity": 2, "maxWorkers": 4}],
        },
    }  # fmt: skip
    (root / "job.yaml").write_text(yaml.safe_dump(job))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "echo_runtime.cli"]
    run_dir = root / "run"
    run = procs.ManagedProcess(
        "echorl-run",
        [*cli, "run", str(root / "job.yaml"), "--no-progress", "--run-dir", str(run_dir)],
        root / "run.log",
        env=env,
    ).start()
    honest: procs.ManagedProcess | None = None
    try:
        # The join command `echorl run` prints for the external pool names the coordinator's address.
        found: list[str] = []

        def joined() -> bool:
            found[:] = re.findall(r"--coordinator (http://127\.0\.0\.1:\d+)", run.log_path.read_text())
            return bool(found) and (run_dir / "tokens.json").exists()

        run.wait_healthy(joined, 300, interval=0.2)
        tokens = json.loads((run_dir / "tokens.json").read_text())
        honest = procs.ManagedProcess(
            "honest-worker",
            [*cli, "worker", "--coordinator", found[0], "--pool", "volunteers", "--job", str(run_dir / "job.yaml"),
             "--external", "--device", "cpu", "--threads", "1", "--capacity", "2", "--cache-dir",
             str(root / "honest-cache")],
            root / "honest-worker.log", env={**env, "ECHORL_TOKEN": tokens["pools"]["volunteers"]},
        ).start()  # fmt: skip
        yield Run(run_dir, found[0], tokens), run, honest
    finally:
        if honest is not None:
            honest.stop(grace=10.0)
        run.stop(grace=20.0)


def until(condition: Callable[[], bool], timeout: float) -> None:
    """Wait for ``condition``; on timeout go on, and let the assertions say what did not happen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        time.sleep(0.2)


def start(body: Callable[[Liar], None]) -> tuple[Liar, threading.Thread]:
    record = Liar()

    def go() -> None:
        try:
            body(record)
        except client.Unauthorized as exc:  # quarantined: the end of this worker
            record.answers.append(f"{exc.status} {exc.code} {exc.field}")
        except BaseException as exc:  # surfaced by the test
            record.errors.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return record, thread


def submit(w: client.WorkerClient, me: Liar, task_id: str, body: list[wire.RolloutIn]) -> None:
    try:
        me.answers.append(w.submit(task_id, body).outcome)
    except client.CoordinatorError as exc:
        me.answers.append(f"{exc.status} {exc.code} {exc.field}")
    if me.answers[-1] == "buffered":
        me.buffered.set()


def rollouts(
    samples: list[Rollout], version: int, logprobs: Callable[[int], list[float]]
) -> list[wire.RolloutIn]:
    return [
        wire.RolloutIn(
            completion=s.text,
            token_ids=list(s.completion_ids),
            logprobs=logprobs(len(s.logprobs)),
            policy_version=version,
            finish_reason=s.finish_reason,
        )
        for s in samples
    ]


def test_liars_in_an_external_pool_never_reach_a_step_and_the_honest_worker_is_never_caught(
    tmp_path: Path, model_dir: str
) -> None:
    lock, stop, claimable = threading.Lock(), threading.Event(), threading.Event()
    base_model = TransformersBackend(model_dir, device="cpu", threads=1)
    claims: list[tuple[int, int]] = []
    """The patient liar's (claimed version, newest published version) at each submission."""

    def draw(task: wire.TaskOut) -> list[Rollout]:
        params = backend_base.SamplingParams(
            temperature=task.sampling.temperature, top_p=task.sampling.top_p,
            max_new_tokens=task.sampling.max_new_tokens,
        )  # fmt: skip
        with lock:
            return base_model.sample([wire.plain_prompt(task.prompt)], task.group_size, params)[0]

    with echorl_run(tmp_path, model_dir) as (run, echorl, honest):

        def fabricator(me: Liar) -> None:
            with run.client() as w:
                me.worker = w.register().worker_id
                held = 0
                while not stop.is_set():
                    lease = w.lease(2, wait=1.0, loaded_version=held)
                    if lease.load_version is not None:
                        held = lease.load_version  # says it loads it, keeps sampling the base model
                        w.heartbeat(held)
                    for task in lease.tasks:
                        submit(w, me, task.task_id, rollouts(draw(task), held, lambda n: [-0.01] * n))

        def patient(me: Liar) -> None:
            with run.client(capacity=1) as w:
                me.worker = w.register().worker_id
                reported: set[int] = set()
                while not stop.is_set():
                    seen = run.status().policy_version  # reports every version it sees: all claimable
                    w.heartbeat(seen)
                    reported.add(seen)
                    if not any(seen - BOUND <= v < seen for v in reported):
                        time.sleep(0.1)  # patient: it leases only once it knows an older version to claim
                        continue
                    claimable.set()
                    for task in w.lease(1, wait=1.0, loaded_version=seen).tasks:
                        samples = draw(task)
                        newest = w.heartbeat(max(reported)).policy_version  # the trainer may be ahead
                        older = [v for v in reported if newest - BOUND <= v < newest]
                        if older:  # else the window moved on meanwhile: the lease lapses (rarely)
                            claims.append((max(older), newest))
                            submit(w, me, task.task_id, rollouts(samples, max(older), lambda n: [0.0] * n))

        def chooser(me: Liar) -> None:
            job = spec.load_job(run.root / "job.yaml")
            backend = Chooser(
                model_dir, device="cpu", threads=1, prompt_style=PromptStyle.from_task(job.spec.task)
            )
            w = run.client()
            store = snapshots.open_store(job.spec.storage, job.name)
            loop = Worker(backend, w, store, run.root.parent / "chooser-cache", capacity=2)
            original = w.submit

            def watched(task_id: str, body: Sequence[wire.RolloutIn | dict[str, Any]]) -> wire.SubmitReply:
                me.worker = w.worker_id or ""
                reply = original(task_id, body)
                me.answers.append(reply.outcome)
                if reply.outcome == "buffered":
                    me.buffered.set()
                return reply

            w.submit = watched  # type: ignore[method-assign,assignment]
            try:
                loop.run()
            finally:
                w.close()

        liars = {"fabricator": start(fabricator), "patient": start(patient), "chooser": start(chooser)}
        # The honest worker alone could finish the run's versions before the patient liar, which must
        # see versions pass and then share the sampler with the others, buffers a claim (CI saw it):
        # it is held once the others have buffered and the patient knows a version to claim. Versions
        # then wait for the liars' groups, so the patient's window stays open until it submits.
        until(lambda: liars["fabricator"][0].buffered.is_set() and liars["chooser"][0].buffered.is_set(), 240)
        until(claimable.is_set, 240)
        honest.pause()  # the batches now hold the liars' groups: the trainer has to check them
        until(lambda: all(liar.buffered.is_set() for liar, _ in liars.values()), 240)
        try:
            until(lambda: all(run.caught(liar) for liar, _ in liars.values()), 120)
        finally:
            honest.resume()
        assert echorl.popen is not None
        code = echorl.popen.wait(timeout=400)
        assert code == 0, echorl.describe_failure(f"echorl run exited with {code}")
        stop.set()
        for _, thread in liars.values():
            thread.join(timeout=30)
    status = run.last_status()
    records = [json.loads(line) for line in (run.root / "trainer.jsonl").read_text().splitlines()]
    assert [r["policyVersion"] for r in records] == list(range(1, STEPS + 1))
    trained_on = {w for r in records for w in r["workers"]}
    quarantined = {q.id: q for q in status.quarantined}
    reasons = {
        "fabricator": "behaviour log-probs disagree",
        "patient": "behaviour log-probs disagree",
        "chooser": "text not drawn from its lease's key",
    }
    for name, (liar, _) in liars.items():
        assert not liar.errors, (name, liar.errors)
        assert "buffered" in liar.answers, (name, liar.answers)  # the coordinator cannot tell
        assert liar.worker in quarantined, (name, liar.answers, status.quarantined)
        conviction = quarantined[liar.worker]
        assert reasons[name] in conviction.reason and "weights of version" in conviction.reason, (
            name,
            conviction,
        )
        assert conviction.trained_groups == 0, (name, conviction)  # every group of it checked first
        assert liar.worker not in trained_on, name  # the lineage: none of its groups in any step
        assert any(liar.worker in r.get("quarantinedWorkers", []) for r in records), name
    assert claims and all(claimed < newest for claimed, newest in claims)  # every patient claim stale
    assert any(v < r["policyVersion"] - 1 for r in records for v in r.get("checkedVersions", []))
    # The honest external worker trained every step and was never caught; its text was its keys' draws.
    (worker,) = trained_on
    assert worker not in quarantined and all(worker not in r.get("quarantinedWorkers", []) for r in records)
    assert {w.id: w.external for w in status.workers}.get(worker) is True
    gaps = [
        r["logprobChecks"][worker]["worstDrawGap"] for r in records if worker in r.get("logprobChecks", {})
    ]
    assert gaps and max(gaps) < 1e-3, gaps
