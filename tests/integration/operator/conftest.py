"""Fixtures for the operator's integration tests against the real kube-apiserver (and MinIO).

``echorl_system`` applies ``manifests/`` (kustomize: CRDs, namespace, RBAC, the operator Deployment —
only stored: envtest runs no pods). ``operator_kubeconfig`` is a
kubeconfig holding a real token of the ``echorl-operator`` service account (TokenRequest API), so the
operator under test runs with exactly the RBAC that ``manifests/common/rbac.yaml`` and
``manifests/cluster-wide.yaml`` grant.
``start_operator`` runs the operator for real in this process with :class:`kopf.testing.KopfRunner`;
``operator`` is one such run per module (a module that needs other settings defines its own),
``delete_jobs`` removes a test's EchoJobs afterwards and ``bucket`` is a test's own snapshot bucket.
``kueue`` is a real Kueue manager (:mod:`services.kueue`) on the same API server, per module, with
its webhooks registered and ``waitForPodsReady`` on: :data:`KUEUE_PODS_READY`, or the module's own
``KUEUE_PODS_READY``. Per module, so its webhooks (which fail closed on every Pod, Deployment and Job)
are registered only while a module that queues jobs runs, and each module's Kueue has its settings.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner
from operator_kit import service_account_kubeconfig

from services.kube import KubeApiServer
from services.kueue import Kueue, WaitForPodsReady, start_kueue
from services.minio import MinioServer
from services.procs import free_ports

REPO = pathlib.Path(__file__).resolve().parents[3]
KUEUE_PODS_READY = WaitForPodsReady(timeout_s=600)
"""Long: envtest runs no pods, so an admitted job here never gets ready; none of those tests keeps one
admitted this long. test_operator_kueue_pods_ready.py sets a short one (its ``KUEUE_PODS_READY``)."""
SA = "system:serviceaccount:echorl-system:echorl-operator"

StartOperator = Callable[..., contextlib.AbstractContextManager[KopfRunner]]


@pytest.fixture(scope="session")
def echorl_system(kube_apiserver: KubeApiServer) -> None:
    """``kubectl apply --server-side -k manifests/`` (what a cluster admin runs)."""
    proc = kube_apiserver.kubectl(
        "apply", "--server-side", "--force-conflicts", "-k", str(REPO / "manifests"), timeout=120
    )
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="session")
def operator_kubeconfig(
    kube_apiserver: KubeApiServer, echorl_system: None, tmp_path_factory: pytest.TempPathFactory
) -> pathlib.Path:
    """A kubeconfig that authenticates as the operator's service account."""
    path = tmp_path_factory.mktemp("operator") / "operator.kubeconfig"
    return service_account_kubeconfig(kube_apiserver, "echorl-system", "echorl-operator", path)


@pytest.fixture(scope="session")
def start_operator(operator_kubeconfig: pathlib.Path) -> StartOperator:
    """``with start_operator(ECHORL_X=...) as runner:`` — the operator running as its service account.

    ``namespaces=[...]`` runs it as the namespaced install does (kopf's ``--namespace``, once each)
    instead of ``--all-namespaces``; ``kubeconfig=`` runs it as another identity.
    """

    @contextlib.contextmanager
    def run(
        *, namespaces: Sequence[str] = (), kubeconfig: pathlib.Path | None = None, **env: str
    ) -> Iterator[KopfRunner]:
        settings = {
            "KUBECONFIG": str(kubeconfig or operator_kubeconfig),
            "ECHORL_STATUS_INTERVAL": "0.5",
            "ECHORL_STATUS_WRITE_INTERVAL": "2",  # moving figures reach status within a test's patience
            "ECHORL_RESYNC_INTERVAL": "3",
            "ECHORL_COORDINATOR_URL": "http://127.0.0.1:9/{job}",  # nothing listens: coordinator not up
            "ECHORL_BEHIND_GRACE": "0.5",
            "ECHORL_RESTART_COOLDOWN": "60",
            "ECHORL_METRICS_PORT": "0",  # several operators run in this process, one after another
            **env,
        }
        scope = [f"--namespace={ns}" for ns in namespaces] or ["--all-namespaces"]
        args = ["run", "--standalone", *scope, "-m", "echo_operator.handlers"]
        with KopfRunner(args, env=settings, timeout=30) as runner:
            yield runner
        assert runner.exception is None, runner.output[-4000:]

    return run


@pytest.fixture
def storage_secret(kube_apiserver: KubeApiServer, kube_namespace: str, minio_server: MinioServer) -> str:
    """A Secret ``minio-credentials`` with the test MinIO's credentials, in the test's namespace."""
    proc = kube_apiserver.kubectl(
        "create",
        "secret",
        "generic",
        "minio-credentials",
        "-n",
        kube_namespace,
        f"--from-literal=accessKey={minio_server.access_key}",
        f"--from-literal=secretKey={minio_server.secret_key}",
    )
    assert proc.returncode == 0, proc.stderr
    return "minio-credentials"


def storage_block(minio_server: MinioServer, bucket: str, **extra: Any) -> str:
    """The ``storage:`` mapping of a job that uses the test MinIO, as flow YAML."""
    fields = {
        "type": "S3",
        "endpoint": minio_server.endpoint,
        "secure": False,
        "bucket": bucket,
        "credentialsSecret": "minio-credentials",
        **extra,
    }
    return yaml.safe_dump(fields, default_flow_style=True, width=1000).strip()


@pytest.fixture
def storage_yaml(minio_server: MinioServer, request: pytest.FixtureRequest) -> Callable[..., str]:
    """``storage_yaml(bucket, **extra)`` → the job's storage mapping as flow YAML."""
    return lambda bucket, **extra: storage_block(minio_server, bucket, **extra)


@pytest.fixture(scope="module")
def operator(start_operator: StartOperator, minio_server: MinioServer) -> Iterator[KopfRunner]:
    with start_operator() as runner:
        yield runner


@pytest.fixture
def delete_jobs(kube_apiserver: KubeApiServer, kube_namespace: str) -> Iterator[None]:
    """Delete the test's EchoJobs afterwards: the namespace itself never goes away in envtest."""
    yield
    kube_apiserver.kubectl("delete", "echojobs", "--all", "-n", kube_namespace, "--wait=false")


@pytest.fixture
def bucket(minio_server: MinioServer, kube_namespace: str) -> Iterator[str]:
    """A bucket named after the test's namespace, emptied and removed afterwards."""
    client = minio_server.client()
    name = kube_namespace[:40].rstrip("-") + "-snap"
    yield name
    if client.bucket_exists(name):
        for obj in client.list_objects(name, recursive=True):
            client.remove_object(name, obj.object_name or "")
        client.remove_bucket(name)


@pytest.fixture(scope="module")
def kueue(
    kube_apiserver: KubeApiServer,
    testbin_dir: pathlib.Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Kueue]:
    """Kueue's manager, as cluster admin, with its CRDs installed and its webhooks registered
    (:mod:`services.kueue`), for the module; waitForPodsReady as the module's ``KUEUE_PODS_READY``
    says, else :data:`KUEUE_PODS_READY`."""
    webhook, health = free_ports(2)
    manager = start_kueue(
        testbin_dir,
        kube_apiserver.kubeconfig,
        tmp_path_factory.mktemp("kueue"),
        kube_apiserver.kubectl,
        ports=(webhook, health),
        wait_for_pods_ready=getattr(request.module, "KUEUE_PODS_READY", KUEUE_PODS_READY),
    )
    try:
        yield manager
    finally:
        manager.stop()
