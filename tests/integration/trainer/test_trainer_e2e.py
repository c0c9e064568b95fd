"""End to end: the real coordinator, a worker on the real transformers backend, and `echorl trainer`.

The coordinator runs as a process on loopback, the worker (WorkerClient + TransformersBackend, loading
every snapshot the trainer publishes) as a thread here, and the trainer as its own process through the
command line. Sequential mode with refreshThreshold 0, so every rollout is sampled at the trainer's
version and the log-prob mismatch the trainer reports for the backend must be float rounding only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

import tracker_files
from echo_runtime.backends import base as backend_base
from echo_runtime.backends import seeded
from echo_runtime.backends.transformers import TransformersBackend
from echo_runtime.coordinator import client as coordinator_client
from echo_runtime.coordinator import wire
from echo_runtime.snapshots import open_store
from echo_runtime.spec.swarms import Storage

TRAINER_TOKEN, POOL_TOKEN = "trainer-token-for-e2e", "pool-token-for-e2e"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(
    url: str,
    model_dir: str,
    store_path: Path,
    cache: Path,
    stop: threading.Event,
    errors: list[BaseException],
) -> None:
    try:
        backend = TransformersBackend(model_dir, device="cpu", threads=1)
        store = open_store(Storage(type="Local", path=str(store_path)), "e2e")
        worker = coordinator_client.WorkerClient(
            url, POOL_TOKEN, pool="default", backend="transformers", device="cpu", dtype="float32"
        )
        worker.register()
        loaded = 0  # the base model is version 0
        worker.heartbeat(loaded)
        while not stop.is_set():
            lease = worker.lease(1)
            if lease.load_version is not None and lease.load_version != loaded:
                if lease.load_version > 0:
                    backend.apply_snapshot(lease.load_version, store.fetch(lease.load_version, cache), "lora")
                loaded = lease.load_version
                worker.heartbeat(loaded)
            if not lease.tasks:
                stop.wait(min(0.2, lease.retry_after_seconds or 0.2))
                continue
            for task in lease.tasks:
                assert task.sampling.key is not None  # a transformers worker draws with its lease's key
                params = backend_base.SamplingParams(
                    temperature=task.sampling.temperature, top_p=task.sampling.top_p,
                    max_new_tokens=task.sampling.max_new_tokens, keys=(seeded.parse_key(task.sampling.key),),
                )  # fmt: skip
                samples = backend.sample([task.prompt], task.group_size, params)[0]
                worker.submit(
                    task.task_id,
                    [
                        wire.RolloutIn(
                            completion=s.text, token_ids=list(s.completion_ids), logprobs=list(s.logprobs),
                            policy_version=loaded, finish_reason=s.finish_reason,
                        )
                        for s in samples
                    ],
                )  # fmt: skip
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


def test_trainer_against_the_real_coordinator_and_backend(tiny_model_dir: str, tmp_path: Path) -> None:
    store_path = tmp_path / "store"
    job = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": "e2e"},
        "spec": {
            "model": {"path": tiny_model_dir, "lora": {"rank": 4, "alpha": 8}},
            "task": {"name": "arithmetic"},
            "algorithm": {
                "groupSize": 3, "batchSize": 2, "microBatchSize": 4, "learningRate": 0.05, "maxSteps": 3,
                "sampling": {"maxNewTokens": 6},
            },
            "syncPolicy": {"mode": "Sequential", "maxStaleness": 0},
            "storage": {"type": "Local", "path": str(store_path)},
            "trainingSwarm": {
                "checkpointInterval": 2, "device": "cpu", "threads": 1,
                # As in a trainer pod: rank 0 reports its records and the coordinator's status.
                "tracking": {"reportTo": ["tensorboard"], "dir": str(tmp_path / "tracking"), "samples": 2, "samplesEvery": 1},
            },
        },
    }  # fmt: skip
    job_file, tokens_file = tmp_path / "job.yaml", tmp_path / "tokens.yaml"
    job_file.write_text(yaml.safe_dump(job))
    tokens_file.write_text(yaml.safe_dump({"trainer": TRAINER_TOKEN, "pools": {"default": POOL_TOKEN}}))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    coordinator = subprocess.Popen(
        [sys.executable, "-c", "from echo_runtime.cli.coordinator import coordinator; coordinator()",
         "--job", str(job_file), "--tokens-file", str(tokens_file), "--port", str(port), "--vocab-size", "1024",
         "--heartbeat-interval", "0.5", "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    stop, errors = threading.Event(), []
    worker = threading.Thread(
        target=_worker, args=(url, tiny_model_dir, store_path, tmp_path / "cache", stop, errors), daemon=True
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if coordinator.poll() is not None:
                output = coordinator.stdout.read().decode() if coordinator.stdout else ""
                raise AssertionError(f"the coordinator exited: {output[-3000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        worker.start()
        metrics = tmp_path / "metrics.jsonl"
        trainer = subprocess.run(
            [sys.executable, "-m", "echo_runtime.cli.trainer", "--job", str(job_file), "--coordinator", url,
             "--metrics-file", str(metrics), "--batch-timeout", "120", "--log-level", "warning"],
            env={**env, "ECHORL_TRAINER_TOKEN": TRAINER_TOKEN}, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert trainer.returncode == 0, trainer.stdout[-3000:] + trainer.stderr[-3000:]
        assert "version 0 → 3" in trainer.stdout
        status = httpx.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {TRAINER_TOKEN}"}).json()
    finally:
        stop.set()
        worker.join(timeout=30)
        coordinator.terminate()
        coordinator.wait(timeout=30)
    assert not errors, errors

    assert status["policyVersion"] == 3 and status["maxObservedStaleness"] == 0
    assert status["consumedGroups"] == 6
    store = open_store(job_spec_storage(store_path), "e2e")
    assert store.versions() == [1, 2, 3] and store.checkpoints() == [2, 3]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["policyVersion"] for r in records] == [1, 2, 3]
    for record in records:
        mismatch = record["logprobMismatch"]["transformers"]
        assert mismatch["sequences"] == 6
        # Same weights, same definition: only float rounding separates sampling from recomputation.
        assert mismatch["maxAbs"] < 1e-3 and abs(mismatch["klSeq"]) < 1e-5, record
        assert record["maxStaleness"] == 0 and record["droppedGroups"] == 0
        assert len(record["samples"]) == 2 and all(s["staleness"] == 0 for s in record["samples"])

    # The trainer's own tracker (the operator's face): its records, and the coordinator's status after each.
    logdir = tmp_path / "tracking" / "tensorboard" / "e2e"
    scalars = tracker_files.tensorboard_scalars(logdir)
    assert [s for s, _ in scalars["train/loss"]] == [1, 2, 3]
    assert [v for _, v in scalars["train/loss"]] == pytest.approx(
        [r["loss"] for r in records], rel=1e-6, abs=1e-7
    )
    consumed = dict(scalars["coordinator/consumedGroups"])
    assert consumed and max(consumed.values()) == 6 and set(consumed) <= {1, 2, 3}
    texts = tracker_files.tensorboard_texts(logdir)
    assert [s for s, _ in texts["samples"]] == [1, 2, 3]
    assert records[2]["samples"][0]["prompt"].split("\n")[0] in texts["samples"][2][1]


def job_spec_storage(path: Path) -> Storage:
    return Storage(type="Local", path=str(path))
