"""A worker outside the cluster joins a job over TLS and is the one that trains it.

The worker is a process on the host, inside the cluster's network namespace (where a machine on the
cluster's network would be), started by ``echorl operator join`` with the admin kubeconfig: it reads
the pool's join Secret and reaches the coordinator only through ``<job>-coordinator-external``, whose
one port is TLS. There is no cloud here, so the test does what a load-balancer controller does: it
writes the Service's address (its cluster IP, which kube-proxy routes) into the Service's status.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_kit import E2E, published
from test_e2e_echojob import echojob

pytestmark = pytest.mark.timeout(1500)


def secret_data(e2e: E2E, name: str) -> dict[str, str]:
    data = e2e.json("get", "secret", name).get("data") or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def host_env(e2e: E2E, home: Path) -> dict[str, str]:
    """The environment of a process on the host: the admin kubeconfig, this interpreter's ``echorl``."""
    env = e2e.cluster.env()
    env.update(
        HOME=str(home),
        ECHORL_CACHE_DIR=str(home / "cache"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def in_netns(
    e2e: E2E, argv: list[str], env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        e2e.cluster.ns.argv(argv), env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def handshake(
    e2e: E2E, host: str, port: int, ca: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """A TLS handshake from inside the namespace that trusts ``ca`` and checks ``host`` as the name."""
    code = (
        "import socket, ssl, sys\n"
        f"ctx = ssl.create_default_context(cadata={ca!r})\n"
        f"with socket.create_connection(({host!r}, {port}), timeout=10) as s:\n"
        f"    with ctx.wrap_socket(s, server_hostname={host!r}) as t:\n"
        "        print(t.version())\n"
    )
    return in_netns(e2e, [sys.executable, "-c", code], env, timeout=60)


def test_a_worker_outside_the_cluster_joins_over_tls_and_trains_the_job(e2e: E2E, tmp_path: Path) -> None:
    job = echojob(
        "remote",
        max_steps=8,
        inferenceSwarms=[{"name": "ext", "backend": "transformers", "device": "cpu", "external": True}],
    )
    e2e.apply(job)
    service = e2e.until("the external Service", lambda: e2e.json("get", "svc", "remote-coordinator-external"))
    ports = [(p["name"], p["port"]) for p in service["spec"]["ports"]]
    assert ports == [("https", 8443)], ports  # nothing in clear text leaves the cluster
    address = service["spec"]["clusterIP"]
    # What a cloud's load-balancer controller would write.
    patch = {"status": {"loadBalancer": {"ingress": [{"ip": address}]}}}
    e2e.kubectl(
        "patch", "svc", "remote-coordinator-external", "--subresource=status", "--type=merge", "-p",
        json.dumps(patch),
    )  # fmt: skip
    url = f"https://{address}:8443"
    # The operator sees the address at its next pass (≤ its resync interval) and re-issues the
    # certificate for it; the coordinator restarts with it.
    join = e2e.until(
        "the join Secret's https address and pin",
        lambda: (
            (d := secret_data(e2e, "remote-ext-join")).get("coordinator") == url and "fingerprint" in d and d
        ),
        timeout=180,
    )
    e2e.note(f"join Secret: {url}, {join['fingerprint']}")
    home = tmp_path / "host"
    home.mkdir()
    env = host_env(e2e, home)

    def serving_the_pinned_certificate() -> bool:
        try:
            der = in_netns(
                e2e,
                [sys.executable, "-c", (
                    "import ssl, socket, hashlib\n"
                    "ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE\n"
                    f"with socket.create_connection(({address!r}, 8443), timeout=5) as s:\n"
                    f"    with ctx.wrap_socket(s) as t: print('sha256:' + hashlib.sha256(t.getpeercert(True)).hexdigest())\n"
                )],
                env,
                timeout=30,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return False
        return der.stdout.strip() == join["fingerprint"]

    e2e.until("the coordinator serving the pinned certificate", serving_the_pinned_certificate, timeout=300)

    # The job's CA verifies it with a host-name check too: the address is in the certificate.
    ok = handshake(e2e, address, 8443, join["ca.crt"], env)
    assert ok.returncode == 0 and ok.stdout.strip().startswith("TLSv1."), ok.stderr
    served = secret_data(e2e, "remote-coordinator-tls")
    assert served["ca.crt"] == join["ca.crt"]

    # A wrong CA and a wrong pin are refused at once, with the reason, before any token is sent.
    manifest = home / "job.yaml"
    manifest.write_text(e2e.json("get", "configmap", "remote-config")["data"]["job.yaml"])
    (home / "other-ca.pem").write_text(_other_ca(served["ca.crt"]))
    for flag, value, reason in (
        (
            "--ca-file",
            str(home / "other-ca.pem"),
            "its TLS certificate was refused (unable to get local issuer",
        ),
        ("--tls-fingerprint", "sha256:" + "0" * 64, "not the pinned sha256:" + "0" * 64),
    ):
        refused = in_netns(
            e2e,
            ["echorl", "worker", "--job", str(manifest), "--coordinator", url, "--pool", "ext",
             "--token", "not-sent", flag, value, "--external"],
            env,
            timeout=120,
        )  # fmt: skip
        assert refused.returncode == 1, (flag, refused.stdout, refused.stderr)
        assert reason in refused.stderr, (flag, refused.stderr)
        e2e.note(f"{flag} refused: {refused.stderr.strip().splitlines()[-1]}")

    # The real thing: `echorl operator join`, on the host, as the pool's only worker.
    minio = e2e.kubectl(
        "-n", "echorl-system", "get", "svc", "minio", "-o", "jsonpath={.spec.clusterIP}", namespaced=False
    )
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        e2e.cluster.ns.argv(
            ["echorl", "operator", "join", "remote", "--pool", "ext", "-n", e2e.namespace,
             "--backend", "transformers", "--device", "cpu", "--store-endpoint", f"{minio}:9000"]
        ),
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        done = e2e.wait_condition("remote", "Succeeded")
        assert done["status"] == "True", done
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(30)
        log.close()
    text = (tmp_path / "worker.log").read_text()
    e2e.note("worker log tail:\n" + "\n".join(text.splitlines()[-5:]))
    assert f"through {url} (pinned certificate {join['fingerprint']})" in text, text[-3000:]
    assert e2e.job("remote")["status"]["policyVersion"] == 8
    assert e2e.pods("echorl.dev/job=remote,echorl.dev/component=inference") == []  # no worker pod at all
    store = e2e.store("remote/")
    assert sorted(published(store, "remote")) == list(range(1, 9))
    # Every step trained on groups of the one worker there was: the one outside.
    records = {
        int(name.split("/")[2]): body
        for name, body in store.items()
        if name.endswith("/trainer-record.json") and body is not None
    }
    assert sorted(records) == list(range(1, 9)), sorted(records)
    workers = {w for r in records.values() for w in r["workers"]}
    e2e.note(f"trainer records 1..8 all from {workers}")
    assert len(workers) == 1 and all(sum(r["workers"].values()) > 0 for r in records.values())


def _other_ca(not_this: str) -> str:
    """A CA that is not the job's (made the way the operator makes one)."""
    import datetime

    from echo_operator import coordinator_tls

    ca, _ = coordinator_tls.issue_ca("someone-else", "elsewhere", datetime.datetime.now(datetime.UTC))
    assert ca != not_this
    return ca
