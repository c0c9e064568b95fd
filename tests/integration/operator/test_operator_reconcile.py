"""The operator for real: kopf, as its own service account, against a real kube-apiserver and MinIO.

One operator runs for the module; each test gets a fresh namespace. There is no kubelet or
controller-manager (envtest), so pods never run and garbage collection does not happen: children are
checked as stored, and deletion is checked through owner references and the operator's own cleanup.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography import x509
from kopf.testing import KopfRunner
from minio import Minio
from operator_kit import apply, children_of, condition, eventually, get, kubectl_ok, reasons, secret_value

from echo_operator import coordinator_tls, names
from echo_runtime.cli.operator_cmd import operator as operator_group
from services.kube import KubeApiServer
from services.minio import MinioServer

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("delete_jobs")]


def hetero(storage: str) -> str:
    return f"""
apiVersion: echorl.dev/v1alpha1
kind: InferenceSwarm
metadata: {{name: shared-pool}}
spec: {{backend: transformers, device: cpu, replicas: 2}}
---
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: hetero}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
  syncPolicy: {{mode: Async, maxStaleness: 2}}
  trainingSwarm: {{nodes: 2, processesPerNode: 2, gpusPerNode: 2, nodeSelector: {{echorl.dev/role: trainer}}}}
  inferenceSwarms:
  - name: gpu
    backend: vllm
    replicas: 3
    nodeSelector: {{nvidia.com/gpu.product: H100}}
    tolerations: [{{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}]
    resources: {{requests: {{cpu: "8"}}}}
  - {{name: cpu, threads: 2}}
  - {{name: macs, backend: mlx, external: true}}
  - {{name: shared, swarmRef: shared-pool}}
"""


EXPECTED = {
    ("ConfigMap", "hetero-config"),
    ("Secret", "hetero-tokens"),
    ("Secret", "hetero-trainer-join"),
    ("Secret", "hetero-gpu-join"),
    ("Secret", "hetero-cpu-join"),
    ("Secret", "hetero-macs-join"),
    ("Secret", "hetero-shared-join"),
    ("Secret", "hetero-storage-readonly"),
    ("Secret", "hetero-coordinator-tls"),
    ("Service", "hetero-coordinator"),
    ("Service", "hetero-coordinator-external"),
    ("Service", "hetero-trainer"),
    ("Deployment", "hetero-coordinator"),
    ("Deployment", "hetero-gpu"),
    ("Deployment", "hetero-cpu"),
    ("Deployment", "hetero-shared"),
    ("Job", "hetero-trainer"),
}


def wait_children(kube: KubeApiServer, ns: str, job: str, expected: set[tuple[str, str]]) -> dict[Any, Any]:
    def ready() -> dict[Any, Any]:
        found = children_of(kube, ns, job)
        missing = expected - set(found)
        assert not missing, f"missing {sorted(missing)}"
        return found

    return eventually(ready, timeout=30)


def env(obj: dict[str, Any]) -> dict[str, Any]:
    (c,) = obj["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_heterogeneous_job_gets_its_children_storage_and_status(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
    minio_server: MinioServer,
) -> None:
    ns = kube_namespace
    apply(kube_apiserver, ns, hetero(storage_yaml(bucket, prefix="runs")))
    found = wait_children(kube_apiserver, ns, "hetero", EXPECTED)
    job = get(kube_apiserver, ns, "echojob", "hetero")
    uid = job["metadata"]["uid"]

    for key, obj in found.items():
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "EchoJob",
            "hetero",
            uid,
            True,
        )
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "echorl-operator", key

    gpu = found[("Deployment", "hetero-gpu")]
    pod = gpu["spec"]["template"]["spec"]
    assert gpu["spec"]["replicas"] == 3
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    (c,) = pod["containers"]
    assert c["resources"] == {"requests": {"cpu": "8"}, "limits": {"nvidia.com/gpu": "1"}}
    assert env(gpu)["ECHORL_TOKEN"] == {"secretKeyRef": {"name": "hetero-gpu-join", "key": "token"}}
    assert env(gpu)["ECHORL_S3_ACCESS_KEY"]["secretKeyRef"]["name"] == "hetero-storage-readonly"
    assert found[("Deployment", "hetero-cpu")]["spec"]["replicas"] == 1  # unset: API default, field unowned
    assert found[("Deployment", "hetero-shared")]["spec"]["replicas"] == 2
    sts = found[("Job", "hetero-trainer")]
    assert sts["spec"]["parallelism"] == sts["spec"]["completions"] == 2
    assert env(sts)["MASTER_ADDR"] == f"hetero-trainer-0.hetero-trainer.{ns}.svc"
    assert env(sts)["ECHORL_S3_ACCESS_KEY"]["secretKeyRef"]["name"] == "minio-credentials"
    assert sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}

    # Join tokens: one per pool and the trainer; the coordinator gets only their digests.
    tokens = {
        role: secret_value(found[("Secret", f"hetero-{role}-join")], "token")
        for role in ("trainer", "gpu", "cpu", "macs", "shared")
    }
    assert len(set(tokens.values())) == 5 and all(len(t) >= 32 for t in tokens.values())
    digests = secret_value(found[("Secret", "hetero-tokens")], "tokens.yaml")
    for token in tokens.values():
        assert token not in digests
        assert hashlib.sha256(token.encode()).hexdigest() in digests

    # Storage: bucket and prefix marker made; the read-only key can read the prefix, not write.
    client = minio_server.client()
    marker = client.get_object(bucket, "runs/hetero/job.json").read()
    assert uid.encode() in marker
    ro = found[("Secret", "hetero-storage-readonly")]
    ro_client = Minio(
        minio_server.endpoint,
        access_key=secret_value(ro, "accessKey"),
        secret_key=secret_value(ro, "secretKey"),
        secure=False,
    )
    assert ro_client.get_object(bucket, "runs/hetero/job.json").read() == marker
    with pytest.raises(Exception, match=r"AccessDenied|Access Denied"):
        ro_client.put_object(bucket, "runs/hetero/x", io.BytesIO(b"1"), 1)
    assert names.READONLY_ACCOUNT in get(kube_apiserver, ns, "echojob", "hetero")["metadata"]["annotations"]

    # Status and Events.
    def status_written() -> dict[str, Any]:
        obj = get(kube_apiserver, ns, "echojob", "hetero")
        assert obj["status"]["mode"] == "Async" and obj["status"]["maxStaleness"] == 2
        assert [p["name"] for p in obj["status"]["pools"]] == ["gpu", "cpu", "macs", "shared"]
        assert condition(obj, "Ready")["reason"] == "CoordinatorNotReady"
        assert condition(obj, "Degraded")["status"] == "False"
        return obj

    eventually(status_written)
    assert {"ChildrenCreated", "StorageReady", "ReadOnlyCredentialsIssued"} <= reasons(
        kube_apiserver, ns, "hetero"
    )
    swarm = eventually(lambda: _swarm_used(kube_apiserver, ns))
    assert swarm["status"]["selector"] == "echorl.dev/inference-swarm=shared-pool"
    printed = kubectl_ok(kube_apiserver, "get", "-n", ns, "echojobs").stdout
    assert "Async" in printed and "ΔMAX" in printed

    # External workers: the pool has no pods, only a join Secret that gets the coordinator's address.
    assert ("Deployment", "hetero-macs") not in found
    kubectl_ok(
        kube_apiserver,
        "annotate",
        "-n",
        ns,
        "echojob/hetero",
        f"{names.EXTERNAL_URL}=http://203.0.113.7:8700",
    )
    macs = eventually(lambda: _joinable(kube_apiserver, ns))
    joined = CliRunner().invoke(
        operator_group,
        [
            "join",
            "hetero",
            "--pool",
            "macs",
            "-n",
            ns,
            "--kubeconfig",
            str(kube_apiserver.kubeconfig),
            "--print",
        ],
    )
    assert joined.exit_code == 0, joined.output
    assert f"ECHORL_TOKEN={secret_value(macs, 'token')}" in joined.output
    assert "echorl worker --job" in joined.output and "--coordinator http://203.0.113.7:8700" in joined.output
    assert "--pool macs --backend" in joined.output and "--external" in joined.output
    assert "ECHORL_S3_ACCESS_KEY=echorl" in joined.output  # the read-only key, not the job's


MACS_JOB = """
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: remote}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
  inferenceSwarms: [{{name: macs, backend: mlx, external: true}}]
"""


def test_external_workers_get_an_https_address_and_the_coordinators_own_certificate(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    ns = kube_namespace
    apply(kube_apiserver, ns, MACS_JOB.format(storage=storage_yaml(bucket)))
    found = wait_children(
        kube_apiserver,
        ns,
        "remote",
        {
            ("Secret", "remote-coordinator-tls"),
            ("Service", "remote-coordinator-external"),
            ("Deployment", "remote-coordinator"),
        },
    )
    tls = found[("Secret", "remote-coordinator-tls")]
    assert tls["type"] == "kubernetes.io/tls"
    service = found[("Service", "remote-coordinator-external")]
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("https", 8443)]
    argv = found[("Deployment", "remote-coordinator")]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[argv.index("--tls-port") + 1] == "8443"
    # No address yet (no load balancer here): the join Secret has only its token.
    assert set(get(kube_apiserver, ns, "secret", "remote-macs-join")["data"]) == {"token"}
    ca_before = secret_value(tls, "ca.crt")

    # A cloud's load-balancer controller writes the Service's address into its status; so does this test.
    kubectl_ok(
        kube_apiserver, "patch", "-n", ns, "service/remote-coordinator-external", "--subresource=status",
        "--type=merge", "-p", '{"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}]}}}',
    )  # fmt: skip

    def pinned() -> dict[str, Any]:
        secret = get(kube_apiserver, ns, "secret", "remote-macs-join")
        assert secret_value(secret, "coordinator") == "https://203.0.113.9:8443"
        served = get(kube_apiserver, ns, "secret", "remote-coordinator-tls")
        cert = x509.load_pem_x509_certificate(secret_value(served, "tls.crt").encode())
        assert "203.0.113.9" in coordinator_tls.certificate_hosts(cert)  # re-issued for the new address
        assert secret_value(secret, "fingerprint") == coordinator_tls.fingerprint(
            secret_value(served, "tls.crt")
        )
        return secret

    joinable = eventually(pinned, timeout=30)
    served = get(kube_apiserver, ns, "secret", "remote-coordinator-tls")
    assert secret_value(joinable, "ca.crt") == secret_value(served, "ca.crt") == ca_before  # the CA stays
    # The coordinator restarts with the new certificate: its pod template carries the fingerprint.
    hashes = {
        get(kube_apiserver, ns, "deployment", "remote-coordinator")["spec"]["template"]["metadata"][
            "annotations"
        ][names.SPEC_HASH]
    }
    assert "CertificateIssued" in reasons(kube_apiserver, ns, "remote")

    joined = CliRunner().invoke(
        operator_group,
        [
            "join",
            "remote",
            "--pool",
            "macs",
            "-n",
            ns,
            "--kubeconfig",
            str(kube_apiserver.kubeconfig),
            "--print",
        ],
    )
    assert joined.exit_code == 0, joined.output
    assert "--coordinator https://203.0.113.9:8443" in joined.output
    assert f"--tls-fingerprint {secret_value(joinable, 'fingerprint')}" in joined.output

    # Resyncs issue nothing new: the Secret and the coordinator's pod template stay as they are.
    version = served["metadata"]["resourceVersion"]
    time.sleep(3.5)  # longer than ECHORL_RESYNC_INTERVAL
    assert (
        get(kube_apiserver, ns, "secret", "remote-coordinator-tls")["metadata"]["resourceVersion"] == version
    )
    hashes.add(
        get(kube_apiserver, ns, "deployment", "remote-coordinator")["spec"]["template"]["metadata"][
            "annotations"
        ][names.SPEC_HASH]
    )
    assert len(hashes) == 1

    # An Ingress of the user's (annotation) presents its own certificate: the pin goes.
    kubectl_ok(
        kube_apiserver,
        "annotate",
        "-n",
        ns,
        "echojob/remote",
        f"{names.EXTERNAL_URL}=https://echo.example.com",
    )

    def unpinned() -> None:
        data = get(kube_apiserver, ns, "secret", "remote-macs-join")["data"]
        assert set(data) == {"token", "coordinator"}

    eventually(unpinned, timeout=30)


def test_a_tls_secret_of_the_users_is_served_instead_and_a_missing_one_is_reported(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    ns = kube_namespace
    text = MACS_JOB.format(storage=storage_yaml(bucket)).replace(
        "metadata: {name: remote}",
        f"metadata: {{name: remote, annotations: {{{names.TLS_SECRET}: cm-cert}}}}",
    )
    apply(kube_apiserver, ns, text)

    def missing() -> None:
        job = get(kube_apiserver, ns, "echojob", "remote")
        assert condition(job, "Degraded")["reason"] == "TLSSecretMissing", job.get("status")
        assert "cm-cert" in condition(job, "Degraded")["message"]

    eventually(missing, timeout=30)
    # What cert-manager would write: a kubernetes.io/tls Secret with the CA beside it.
    now = datetime.datetime.now(datetime.UTC)
    ca, ca_key = coordinator_tls.issue_ca("mine", ns, now)
    cert, key = coordinator_tls.issue_leaf(ca, ca_key, ("coordinator.example.org",), now)
    kubectl_ok(
        kube_apiserver, "create", "secret", "generic", "cm-cert", "-n", ns, "--type=kubernetes.io/tls",
        f"--from-literal=tls.crt={cert}", f"--from-literal=tls.key={key}", f"--from-literal=ca.crt={ca}",
    )  # fmt: skip

    def served() -> None:
        found = children_of(kube_apiserver, ns, "remote")
        assert ("Secret", "remote-coordinator-tls") not in found  # nothing issued
        pod = found[("Deployment", "remote-coordinator")]["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert volume["secret"]["secretName"] == "cm-cert"
        secret = get(kube_apiserver, ns, "secret", "remote-macs-join")
        assert secret_value(secret, "coordinator") == "https://lb.example.net:8443"
        assert secret_value(secret, "fingerprint") == coordinator_tls.fingerprint(cert)
        assert secret_value(secret, "ca.crt") == ca

    def service_up_then_served() -> None:
        if kube_apiserver.kubectl("get", "-n", ns, "service/remote-coordinator-external").returncode == 0:
            kubectl_ok(
                kube_apiserver, "patch", "-n", ns, "service/remote-coordinator-external", "--subresource=status",
                "--type=merge", "-p", '{"status": {"loadBalancer": {"ingress": [{"hostname": "lb.example.net"}]}}}',
            )  # fmt: skip
        served()

    eventually(service_up_then_served, timeout=30, interval=1.0)
    job = get(kube_apiserver, ns, "echojob", "remote")
    assert condition(job, "Degraded")["status"] == "False"


def _joinable(kube: KubeApiServer, ns: str) -> dict[str, Any]:
    secret = get(kube, ns, "secret", "hetero-macs-join")
    assert secret_value(secret, "coordinator") == "http://203.0.113.7:8700"
    return secret


def _swarm_used(kube: KubeApiServer, ns: str) -> dict[str, Any]:
    swarm = get(kube, ns, "inferenceswarm", "shared-pool")
    assert swarm["status"]["usedBy"] == ["hetero"]
    return swarm


CPU_JOB = """
apiVersion: echorl.dev/v1alpha1
kind: InferenceSwarm
metadata: {{name: cpu-pool}}
spec: {{backend: transformers, device: cpu}}
---
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: small}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
  inferenceSwarms:
  - {{name: cpu, swarmRef: cpu-pool}}
  - {{name: gpu, backend: vllm, replicas: 2}}
"""
SMALL = {("Deployment", "small-cpu"), ("Deployment", "small-gpu"), ("Job", "small-trainer")}


def test_kubectl_scale_moves_the_pools_deployment_and_reapply_changes_nothing(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    ns = kube_namespace
    text = CPU_JOB.format(storage=storage_yaml(bucket))
    apply(kube_apiserver, ns, text, "--server-side")
    wait_children(kube_apiserver, ns, "small", SMALL)
    assert get(kube_apiserver, ns, "deployment", "small-cpu")["spec"]["replicas"] == 1

    kubectl_ok(kube_apiserver, "scale", "-n", ns, "inferenceswarm/cpu-pool", "--replicas=4")
    eventually(lambda: _replicas(kube_apiserver, ns, "small-cpu", 4))
    scale = kube_apiserver.kubectl_json("get", "-n", ns, "inferenceswarm/cpu-pool", "--subresource=scale")
    assert scale["spec"]["replicas"] == 4
    assert scale["status"]["selector"] == "echorl.dev/inference-swarm=cpu-pool"
    assert "Scaled" in reasons(kube_apiserver, ns, "small")

    # Steady state: re-applying the manifest, and the operator's own resyncs, change nothing.
    time.sleep(1.0)
    before = {
        k: (o["metadata"]["resourceVersion"], o["metadata"].get("generation"))
        for k, o in children_of(kube_apiserver, ns, "small").items()
    }
    job_gen = get(kube_apiserver, ns, "echojob", "small")["metadata"]["generation"]
    diff = kube_apiserver.kubectl("diff", "--server-side", "-n", ns, "-f", "-", input=text)
    assert diff.returncode == 0, f"server-side dry run shows a diff:\n{diff.stdout}\n{diff.stderr}"
    apply(kube_apiserver, ns, text, "--server-side")
    time.sleep(3.5)  # longer than ECHORL_RESYNC_INTERVAL: at least one re-apply of every child
    after = {
        k: (o["metadata"]["resourceVersion"], o["metadata"].get("generation"))
        for k, o in children_of(kube_apiserver, ns, "small").items()
    }
    assert after == before
    assert get(kube_apiserver, ns, "echojob", "small")["metadata"]["generation"] == job_gen
    assert get(kube_apiserver, ns, "inferenceswarm", "cpu-pool")["spec"]["replicas"] == 4  # GitOps left it


def _replicas(kube: KubeApiServer, ns: str, name: str, wanted: int) -> None:
    assert get(kube, ns, "deployment", name)["spec"]["replicas"] == wanted


SHARED = """
apiVersion: echorl.dev/v1alpha1
kind: InferenceSwarm
metadata: {{name: cpu-pool}}
spec: {{backend: transformers, device: cpu, replicas: 5}}
---
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: job-a}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
  inferenceSwarms: [{{name: cpu, swarmRef: cpu-pool}}]
---
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: job-b}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
  inferenceSwarms: [{{name: cpu, swarmRef: cpu-pool}}]
"""


def test_a_shared_swarms_replicas_are_split_over_its_running_jobs(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    """spec.replicas of a shared swarm is the total: 5 over two jobs is 3 + 2; kubectl scale to 4 is
    2 + 2; suspending one gives the other all 4, resuming splits them again."""
    ns, kube = kube_namespace, kube_apiserver

    def split(a: int, b: int) -> None:
        assert (_deployment_replicas(kube, ns, "job-a-cpu"), _deployment_replicas(kube, ns, "job-b-cpu")) == (
            a,
            b,
        )

    apply(kube, ns, SHARED.format(storage=storage_yaml(bucket)))
    eventually(lambda: split(3, 2))
    kubectl_ok(kube, "scale", "-n", ns, "inferenceswarm/cpu-pool", "--replicas=4")
    eventually(lambda: split(2, 2))
    kubectl_ok(kube, "patch", "-n", ns, "echojob/job-b", "--type=merge", "-p", '{"spec": {"suspend": true}}')
    eventually(lambda: split(4, 0))
    kubectl_ok(kube, "patch", "-n", ns, "echojob/job-b", "--type=merge", "-p", '{"spec": {"suspend": false}}')
    eventually(lambda: split(2, 2))
    kubectl_ok(kube, "delete", "-n", ns, "echojob/job-a", "--wait=false")

    def b_has_them_all() -> None:
        assert _deployment_replicas(kube, ns, "job-b-cpu") == 4

    eventually(b_has_them_all)  # job-a is going: job-b runs the swarm's 4 alone


def _deployment_replicas(kube: KubeApiServer, ns: str, name: str) -> int:
    return int(get(kube, ns, "deployment", name)["spec"].get("replicas", 1))


def test_spec_changes_roll_only_their_pool_and_suspend_resumes(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    ns = kube_namespace
    apply(kube_apiserver, ns, CPU_JOB.format(storage=storage_yaml(bucket)))
    wait_children(kube_apiserver, ns, "small", SMALL)
    gen = {
        n: get(kube_apiserver, ns, "deployment", n)["metadata"]["generation"]
        for n in ("small-cpu", "small-gpu")
    }

    kubectl_ok(
        kube_apiserver,
        "patch",
        "-n",
        ns,
        "inferenceswarm/cpu-pool",
        "--type=merge",
        "-p",
        '{"spec": {"threads": 3}}',
    )

    def rolled() -> None:
        dep = get(kube_apiserver, ns, "deployment", "small-cpu")
        assert dep["metadata"]["generation"] > gen["small-cpu"]
        assert "--threads" in dep["spec"]["template"]["spec"]["containers"][0]["command"]

    eventually(rolled)
    assert get(kube_apiserver, ns, "deployment", "small-gpu")["metadata"]["generation"] == gen["small-gpu"]

    kubectl_ok(
        kube_apiserver,
        "patch",
        "-n",
        ns,
        "echojob/small",
        "--type=merge",
        "-p",
        '{"spec": {"suspend": true}}',
    )

    def suspended() -> None:
        for kind, name in (
            ("deployment", "small-cpu"),
            ("deployment", "small-gpu"),
            ("deployment", "small-coordinator"),
        ):
            assert get(kube_apiserver, ns, kind, name)["spec"]["replicas"] == 0, name
        # The trainer Job is deleted, Foreground (its pods first). Without a garbage collector here it
        # stays terminating; the e2e tier shows it gone and re-created on resume.
        trainer = kube_apiserver.kubectl("get", "-n", ns, "job", "small-trainer", "-o", "json")
        assert trainer.returncode != 0 or '"deletionTimestamp"' in trainer.stdout
        job = get(kube_apiserver, ns, "echojob", "small")
        assert condition(job, "Suspended")["status"] == "True"
        assert condition(job, "Ready")["reason"] == "Suspended"

    eventually(suspended)
    kubectl_ok(
        kube_apiserver,
        "patch",
        "-n",
        ns,
        "echojob/small",
        "--type=merge",
        "-p",
        '{"spec": {"suspend": false}}',
    )

    def resumed() -> None:
        assert get(kube_apiserver, ns, "deployment", "small-gpu")["spec"]["replicas"] == 2
        assert get(kube_apiserver, ns, "deployment", "small-cpu")["spec"]["replicas"] == 1
        assert condition(get(kube_apiserver, ns, "echojob", "small"), "Suspended")["status"] == "False"

    eventually(resumed)
    assert {"JobSuspended", "NotSuspended"} <= reasons(kube_apiserver, ns, "small")


def test_missing_references_degrade_until_they_appear(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    ns = kube_namespace
    apply(
        kube_apiserver,
        ns,
        f"""
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: waiting}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage_yaml(bucket)}
  syncPolicyRef: strict
""",
    )

    def degraded() -> None:
        job = get(kube_apiserver, ns, "echojob", "waiting")
        cond = condition(job, "Degraded")
        assert (cond["status"], cond["reason"]) == ("True", "ReferenceNotFound")
        assert "SyncPolicy 'strict'" in cond["message"]

    eventually(degraded)
    assert "ReferenceNotFound" in reasons(kube_apiserver, ns, "waiting")
    apply(
        kube_apiserver,
        ns,
        """
apiVersion: echorl.dev/v1alpha1
kind: SyncPolicy
metadata: {name: strict}
spec: {mode: Sequential, maxStaleness: 0}
""",
    )

    def recovered() -> None:
        job = get(kube_apiserver, ns, "echojob", "waiting")
        assert condition(job, "Degraded")["status"] == "False"
        assert (job["status"]["mode"], job["status"]["maxStaleness"]) == ("Sequential", 0)
        assert get(kube_apiserver, ns, "syncpolicy", "strict")["status"]["usedBy"] == ["waiting"]

    eventually(recovered)
    wait_children(kube_apiserver, ns, "waiting", {("Deployment", "waiting-default")})


def test_a_job_with_a_misspelt_task_is_refused_before_any_child(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    """The API server cannot know Echo's tasks: the operator refuses the job as its first condition,
    naming the task meant, and creates nothing (the coordinator would only fail when it started)."""
    ns = kube_namespace
    apply(
        kube_apiserver,
        ns,
        f"""
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: typo}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage_yaml(bucket)}
  task: {{name: knights_knaaves}}
""",
    )

    def refused() -> None:
        cond = condition(get(kube_apiserver, ns, "echojob", "typo"), "Degraded")
        assert (cond["status"], cond["reason"]) == ("True", "InvalidSpec"), cond
        assert "did you mean 'knights_knaves'?" in cond["message"]

    eventually(refused)
    assert "InvalidSpec" in reasons(kube_apiserver, ns, "typo")
    assert children_of(kube_apiserver, ns, "typo") == {}


def test_deletion_cleans_the_store_when_asked_and_children_are_owned(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
    minio_server: MinioServer,
) -> None:
    ns = kube_namespace
    apply(
        kube_apiserver,
        ns,
        f"""
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: doomed}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage_yaml(bucket, prefix="p", deletePolicy="Delete")}
""",
    )
    found = wait_children(
        kube_apiserver,
        ns,
        "doomed",
        {("Deployment", "doomed-default"), ("Secret", "doomed-storage-readonly")},
    )
    job = get(kube_apiserver, ns, "echojob", "doomed")
    assert names.FINALIZER in eventually(lambda: _finalizers(kube_apiserver, ns, "doomed"))
    client = minio_server.client()
    client.put_object(bucket, "p/doomed/snapshots/1/manifest.json", io.BytesIO(b"{}"), 2)
    ro = found[("Secret", "doomed-storage-readonly")]
    ro_key = secret_value(ro, "accessKey")
    uid = job["metadata"]["uid"]
    for obj in children_of(kube_apiserver, ns, "doomed").values():
        assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid]  # GC deletes them

    kubectl_ok(kube_apiserver, "delete", "-n", ns, "echojob/doomed", "--wait=false")

    def gone() -> None:
        assert kube_apiserver.kubectl("get", "-n", ns, "echojob/doomed").returncode != 0

    eventually(gone)
    assert list(client.list_objects(bucket, prefix="p/doomed/", recursive=True)) == []
    ro_client = Minio(
        minio_server.endpoint, access_key=ro_key, secret_key=secret_value(ro, "secretKey"), secure=False
    )
    with pytest.raises(Exception, match=r"InvalidAccessKeyId|access key"):
        ro_client.bucket_exists(bucket)
    assert {"SnapshotsDeleted", "ReadOnlyCredentialsRevoked"} <= reasons(kube_apiserver, ns, "doomed")


def _finalizers(kube: KubeApiServer, ns: str, name: str) -> list[str]:
    found = get(kube, ns, "echojob", name)["metadata"].get("finalizers", [])
    assert found
    return list(found)
