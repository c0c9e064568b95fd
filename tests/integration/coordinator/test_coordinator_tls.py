"""A coordinator serving TLS, and workers that verify it: a CA file, a pinned fingerprint, refusals.

Certificates are made here with the ``openssl`` command (a CA, a certificate it signs for 127.0.0.1,
and a second CA that signed nothing of the coordinator's). The coordinator runs as a real process with
``--tls-cert/--tls-key/--tls-port``: plain HTTP stays on ``--port`` (the trainer uses it, as in-cluster
pods do) and a real ``echorl worker`` joins on the TLS port, as one outside the cluster would.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from echo_runtime.coordinator import client, tls
from echo_runtime.models import build
from services import procs

pytestmark = pytest.mark.timeout(600)

TRAINER_TOKEN, POOL_TOKEN = "tls-trainer-token-0001", "tls-cpu-token-00000001"
RETRY = client.RetryPolicy(attempts=20, base=0.05, cap=0.5, deadline=10.0)


def openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@dataclass
class Pki:
    ca: Path
    other_ca: Path
    cert: Path
    key: Path
    elsewhere_cert: Path
    """Signed by ``ca`` for a name that is not 127.0.0.1 (for pinning, which checks no name)."""
    elsewhere_key: Path


def make_ca(root: Path, name: str) -> None:
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=root,
    )  # fmt: skip


def make_leaf(root: Path, ca: str, name: str, san: str) -> None:
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=root,
    )  # fmt: skip
    (root / f"{name}.ext").write_text(
        f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid,issuer\nsubjectKeyIdentifier=hash\n"
    )
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=root,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    make_ca(root, "job-ca")
    make_ca(root, "other-ca")
    make_leaf(root, "job-ca", "coordinator", "IP:127.0.0.1,DNS:localhost")
    make_leaf(root, "job-ca", "elsewhere", "DNS:coordinator.elsewhere.example")
    return Pki(
        root / "job-ca.crt",
        root / "other-ca.crt",
        root / "coordinator.crt",
        root / "coordinator.key",
        root / "elsewhere.crt",
        root / "elsewhere.key",
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build.init_model("tiny", tmp_path_factory.mktemp("tls-model") / "tiny", seed=0))


@dataclass
class Coordinator:
    root: Path
    plain: str
    secure: str
    process: procs.ManagedProcess


def write_job(root: Path, model_dir: str, steps: int) -> Path:
    job = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": "tls"},
        "spec": {
            "model": {"path": model_dir, "lora": {"rank": 4, "alpha": 8}},
            "task": {"name": "arithmetic"},
            "algorithm": {"groupSize": 2, "batchSize": 2, "microBatchSize": 4, "maxSteps": steps,
                          "sampling": {"maxNewTokens": 4}},
            "syncPolicy": {"mode": "Async", "maxStaleness": 1},
            "storage": {"type": "Local", "path": str(root / "store")},
            "trainingSwarm": {"checkpointInterval": 100, "device": "cpu", "threads": 1},
            "inferenceSwarms": [{"name": "cpu", "capacity": 2}],
        },
    }  # fmt: skip
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
CLI = [sys.executable, "-m", "echo_runtime.cli"]


def start_coordinator(root: Path, job: Path, cert: Path, key: Path) -> Coordinator:
    (root / "tokens.json").write_text(json.dumps({"trainer": TRAINER_TOKEN, "pools": {"cpu": POOL_TOKEN}}))
    port, tls_port = procs.free_ports(2)
    process = procs.ManagedProcess(
        "coordinator",
        [*CLI, "coordinator", "--job", str(job), "--tokens-file", str(root / "tokens.json"),
         "--port", str(port), "--tls-port", str(tls_port), "--tls-cert", str(cert), "--tls-key", str(key),
         "--heartbeat-interval", "0.5"],
        root / "coordinator.log", env=ENV,
    ).start()  # fmt: skip
    coordinator = Coordinator(root, f"http://127.0.0.1:{port}", f"https://127.0.0.1:{tls_port}", process)
    process.wait_healthy(lambda: httpx.get(f"{coordinator.plain}/healthz", timeout=2).status_code == 200, 120)
    return coordinator


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory, pki: Pki, model_dir: str) -> Iterator[Coordinator]:
    root = tmp_path_factory.mktemp("tls-job")
    running = start_coordinator(root, write_job(root, model_dir, steps=2), pki.cert, pki.key)
    yield running
    running.process.stop(grace=10.0)


def worker_client(url: str, verify: ssl.SSLContext | bool) -> client.WorkerClient:
    return client.WorkerClient(
        url, POOL_TOKEN, pool="cpu", backend="transformers", device="cpu", dtype="float32",
        retry=RETRY, timeout=5.0, verify=verify,
    )  # fmt: skip


def test_the_job_ca_verifies_the_tls_port_and_the_plain_port_stays_plain(
    coordinator: Coordinator, pki: Pki
) -> None:
    with worker_client(coordinator.secure, tls.client_context(coordinator.secure, ca_file=str(pki.ca))) as w:
        reply = w.register()
        assert reply.worker_id and w.worker_id == reply.worker_id
        w.leave()
    assert httpx.get(f"{coordinator.plain}/healthz", timeout=5).status_code == 200
    with pytest.raises(httpx.HTTPError):  # the plain port speaks no TLS
        httpx.get(f"{coordinator.plain.replace('http:', 'https:')}/healthz", verify=False, timeout=5)
    # The system's CAs do not include the job's: an https URL with no CA file is refused too.
    system = tls.client_context(coordinator.secure)
    with worker_client(coordinator.secure, system) as w, pytest.raises(client.Untrusted, match="refused"):
        w.register()


def test_a_wrong_ca_is_refused_at_once_with_a_clear_message(coordinator: Coordinator, pki: Pki) -> None:
    with (
        worker_client(
            coordinator.secure, tls.client_context(coordinator.secure, ca_file=str(pki.other_ca))
        ) as w,
        pytest.raises(client.Untrusted) as refused,
    ):
        w.register()
    # Untrusted, not Unavailable: refused at the first attempt instead of retried for RETRY's 20.
    assert "certificate" in refused.value.message and "--ca-file" in refused.value.message
    assert refused.value.field == "url"


def test_pinning_accepts_exactly_the_coordinators_certificate(coordinator: Coordinator, pki: Pki) -> None:
    der = ssl.PEM_cert_to_DER_cert(pki.cert.read_text())
    right = tls.fingerprint(der)
    colons = ":".join(right.removeprefix("sha256:")[i : i + 2] for i in range(0, 64, 2)).upper()
    for pin in (right, "SHA256:" + colons):
        with worker_client(coordinator.secure, tls.client_context(coordinator.secure, pinned=pin)) as w:
            assert w.register().worker_id
            w.leave()
    wrong = tls.fingerprint(ssl.PEM_cert_to_DER_cert(pki.ca.read_text()))
    with pytest.raises(tls.TLSError) as refused:
        tls.client_context(coordinator.secure, pinned=wrong)
    assert right in str(refused.value) and wrong in str(refused.value)


def test_configuration_mistakes_are_named(coordinator: Coordinator, pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(tls.TLSError, match="needs an https:// coordinator URL"):
        tls.client_context(coordinator.plain, ca_file=str(pki.ca))
    with pytest.raises(tls.TLSError, match="not both"):
        tls.client_context(coordinator.secure, ca_file=str(pki.ca), pinned="sha256:" + "0" * 64)
    with pytest.raises(tls.TLSError, match="expected sha256:<64 hex digits>"):
        tls.client_context(coordinator.secure, pinned="sha256:abc")
    with pytest.raises(tls.TLSError, match="no such file"):
        tls.client_context(coordinator.secure, ca_file=str(tmp_path / "missing.crt"))
    (tmp_path / "key.pem").write_text(pki.key.read_text())
    with pytest.raises(tls.TLSError, match="not a PEM certificate"):
        tls.client_context(coordinator.secure, ca_file=str(tmp_path / "key.pem"))
    # The coordinator refuses a key that is not its certificate's before it starts.
    proc = subprocess.run(
        [*CLI, "coordinator", "--job", str(coordinator.root / "job.yaml"), "--tokens-file",
         str(coordinator.root / "tokens.json"), "--tls-cert", str(pki.cert), "--tls-key", str(pki.elsewhere_key),
         "--no-store", "--vocab-size", "100", "--tokenizer", "none"],
        capture_output=True, text=True, env=ENV, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "--tls-cert" in proc.stderr and "private key" in proc.stderr, proc.stderr


def test_a_pinned_certificate_needs_no_matching_name(tmp_path: Path, pki: Pki, model_dir: str) -> None:
    running = start_coordinator(
        tmp_path, write_job(tmp_path, model_dir, 1), pki.elsewhere_cert, pki.elsewhere_key
    )
    try:
        by_ca = tls.client_context(running.secure, ca_file=str(pki.ca))
        with worker_client(running.secure, by_ca) as w, pytest.raises(client.Untrusted, match="refused"):
            w.register()  # signed by the job's CA, but for another name
        pin = tls.fingerprint(ssl.PEM_cert_to_DER_cert(pki.elsewhere_cert.read_text()))
        with worker_client(running.secure, tls.client_context(running.secure, pinned=pin)) as w:
            assert w.register().worker_id
    finally:
        running.process.stop(grace=10.0)


def test_a_real_worker_joins_over_tls_and_the_job_trains(coordinator: Coordinator, pki: Pki) -> None:
    root = coordinator.root
    job = root / "job.yaml"
    wrong = subprocess.run(
        [*CLI, "worker", "--coordinator", coordinator.secure, "--pool", "cpu", "--job", str(job),
         "--device", "cpu", "--threads", "1", "--tls-fingerprint", "sha256:" + "0" * 64],
        capture_output=True, text=True, env={**ENV, "ECHORL_TOKEN": POOL_TOKEN}, timeout=120, check=False,
    )  # fmt: skip
    assert wrong.returncode == 1 and "not the pinned sha256:" in wrong.stderr, wrong.stderr
    worker = procs.ManagedProcess(
        "worker",
        [*CLI, "worker", "--coordinator", coordinator.secure, "--pool", "cpu", "--job", str(job),
         "--device", "cpu", "--threads", "1", "--capacity", "2", "--cache-dir", str(root / "cache")],
        root / "worker.log", env={**ENV, "ECHORL_TOKEN": POOL_TOKEN, "ECHORL_CA_FILE": str(pki.ca)},
    ).start()  # fmt: skip
    trainer = procs.ManagedProcess(
        "trainer",
        [*CLI, "trainer", "--job", str(job), "--coordinator", coordinator.plain,
         "--metrics-file", str(root / "trainer.jsonl"), "--batch-timeout", "300"],
        root / "trainer.log", env={**ENV, "ECHORL_TRAINER_TOKEN": TRAINER_TOKEN},
    ).start()  # fmt: skip
    try:
        assert trainer.popen is not None
        code = trainer.popen.wait(timeout=400)
        assert code == 0, trainer.describe_failure(f"the trainer exited with {code}")
        records = [json.loads(line) for line in (root / "trainer.jsonl").read_text().splitlines()]
        assert [r["policyVersion"] for r in records] == [1, 2], records
        status = httpx.get(
            f"{coordinator.plain}/v1/status", headers={"Authorization": f"Bearer {TRAINER_TOKEN}"}, timeout=5
        ).json()
        assert status["policyVersion"] == 2 and status["consumedGroups"] >= 2, status
    finally:
        worker.stop(grace=10.0)
        trainer.stop(grace=10.0)


def test_a_pin_waits_for_a_coordinator_that_is_not_up_yet(pki: Pki) -> None:
    """A worker pod may start before its coordinator: the pin check waits, as the client's retries do."""
    import socket
    import threading

    (port,) = procs.free_ports(1)
    served = threading.Event()

    def serve_later() -> None:
        time.sleep(1.5)  # the first connection attempts are refused
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(pki.cert, pki.key)
        with socket.create_server(("127.0.0.1", port)) as listener:
            conn, _ = listener.accept()
            served.set()  # before the handshake, which the client's answer depends on
            with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
                pass

    thread = threading.Thread(target=serve_later, daemon=True)
    thread.start()
    pin = tls.fingerprint(ssl.PEM_cert_to_DER_cert(pki.cert.read_text()))
    context = tls.client_context(f"https://127.0.0.1:{port}", pinned=pin, wait=30.0)
    assert isinstance(context, ssl.SSLContext) and served.is_set()
    thread.join(timeout=10)
    (closed,) = procs.free_ports(1)
    with pytest.raises(tls.TLSError, match="could not read its certificate in 1 s"):
        tls.client_context(f"https://127.0.0.1:{closed}", pinned=pin, wait=1.0)
