"""The e2e tier: Echo installed on the real test cluster (``kube_cluster``) with ``kubectl apply -k``.

``echorl_installed`` (session) applies a kustomize overlay of ``manifests/`` and ``manifests/dev/`` (its dev MinIO) that only swaps image
names (the ones ``scripts/images.sh`` built, by content hash) and the pull policy (``Never``: there
is no registry), then waits until the operator and the dev MinIO are rolled out. The operator runs
in its own pod, as its own service account, with the RBAC of ``manifests/common/rbac.yaml``
(the cluster-wide install).

``cluster_kueue`` (session) runs Kueue's manager inside the cluster's network namespace, as the cluster
admin, for the tests that queue jobs through it: its own webhooks registered with the cluster's API
server (which calls them on the namespace's loopback, where both run) and ``waitForPodsReady`` on
(:data:`KUEUE_PODS_READY`).

``e2e`` (function) gives a test a fresh namespace with the dev MinIO's credentials in it and the
helpers of :class:`e2e_kit.E2E`; the namespace is deleted afterwards (the real namespace controller
removes everything in it).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from e2e_kit import E2E, Installed

from services.cluster import Cluster
from services.install import overlay
from services.kueue import Kueue, WaitForPodsReady, start_kueue

ROLLOUT_TIMEOUT_S = 300
KUEUE_PODS_READY = WaitForPodsReady(timeout_s=300, backoff_base_s=5, backoff_max_s=60)
"""Five minutes for an admitted job's pods to get ready: comfortably more than a job takes on this node
(its images are local), so only a job that cannot get ready is evicted and requeued."""


@pytest.fixture(scope="session")
def echorl_installed(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """manifests/ applied (CRDs, namespace, RBAC, operator, dev MinIO) and rolled out."""
    where = overlay(kube_cluster.images, tmp_path_factory.mktemp("overlay"))
    rendered = kube_cluster.kubectl("kustomize", str(where), check=True).stdout
    # The overlay swaps images and pull policy only: every container runs an image built here.
    used = re.findall(r"^\s+image: (\S+)$", rendered, re.MULTILINE)
    assert used and all(ref.startswith("localhost/echorl/") for ref in used), used
    kube_cluster.kubectl("apply", "--server-side", "-k", str(where), check=True, timeout=180)
    for deployment in ("echorl-operator", "minio"):
        kube_cluster.kubectl(
            "-n", "echorl-system", "rollout", "status", f"deployment/{deployment}",
            f"--timeout={ROLLOUT_TIMEOUT_S}s", check=True, timeout=ROLLOUT_TIMEOUT_S + 30,
        )  # fmt: skip
    yield Installed(kube_cluster)


@pytest.fixture(scope="session")
def cluster_kueue(kube_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    """Kueue's manager as a process inside the cluster's namespace (its loopback there), like the
    cluster's other control-plane processes."""
    manager = start_kueue(
        kube_cluster.bin_dir,
        kube_cluster.kubeconfig,
        tmp_path_factory.mktemp("kueue"),
        kube_cluster.kubectl,
        wrap=kube_cluster.ns.argv,
        env=kube_cluster.env(),
        wait_for_pods_ready=KUEUE_PODS_READY,
    )
    try:
        yield manager
    finally:
        manager.stop()


@pytest.fixture
def e2e(echorl_installed: Installed, request: pytest.FixtureRequest) -> Iterator[E2E]:
    """A fresh namespace (with the dev MinIO's credentials) and the helpers to drive a test."""
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower().removeprefix("test_"))[:40].strip("-")
    kit = E2E(echorl_installed.cluster, f"e2e-{name}"[:50].strip("-"))
    kit.create_namespace()
    try:
        yield kit
    finally:
        if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
            kit.dump()
        kit.delete_namespace()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)
