"""Shared pytest fixtures: the real services the suite runs against (see docs/testing.md).

Fixtures
--------
``minio_server`` (session)
    A real MinIO server: ``endpoint`` (``host:port``), ``url``, ``access_key``, ``secret_key``,
    ``client()`` (a new ``minio.Minio``), ``env()`` (AWS_* variables), ``process``.
``minio`` (function)
    A fresh, uniquely named bucket on that server: ``bucket``, ``client`` (``minio.Minio``),
    ``endpoint``, ``access_key``, ``secret_key``, ``server``. Emptied and removed afterwards.
``kube_apiserver`` (session)
    etcd + kube-apiserver, envtest style: ``url``, ``kubeconfig`` (admin, ``system:masters``),
    ``unprivileged_kubeconfig`` (user ``echorl-test-user``, no groups, so RBAC denies by default),
    ``kubectl(*args)`` -> ``CompletedProcess``, ``api_client(unprivileged=False)``,
    ``install_crds(*paths)``. Every YAML under the repo's ``crds/`` is applied and Established
    before the fixture is handed out.
``kube_namespace`` (function)
    A fresh namespace name on ``kube_apiserver``; deleted afterwards (it stays ``Terminating``:
    there is no namespace controller).
``kube_cluster`` (session)
    A real one-node cluster (control plane, kubelet + containerd + runc, kube-proxy, CoreDNS, kwok)
    inside a network namespace of its own with no route out: ``kubectl(*args)``, ``kubectl_json``,
    ``run(argv)`` (inside the namespace), ``crictl(*args)``, ``images``, ``containment()``. Torn
    down at the end; the session fails if anything of it is left on the host.

Any test that uses one of these fixtures is marked ``services`` automatically, so
``pytest -m "not services"`` runs only the fast tests and builds nothing; tests that use
``kube_cluster`` are also marked ``e2e``. When service tests are selected, ``scripts/testbin.sh``
runs once right after collection (outside any per-test timeout), and ``scripts/images.sh`` too when
an e2e test is; if either fails, every fixture that needs it fails with the script's output.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # makes `services.*` importable

from services import cluster as test_cluster
from services import procs
from services.kube import KubeApiServer, start_kube_apiserver
from services.minio import MinioBucket, MinioServer, bucket_name, empty_and_remove_bucket, start_minio

# Containment: the tracker libraries phone home unless told not to (MLflow's usage telemetry, W&B's
# Sentry error reports). Nothing a test starts may try an address outside loopback: every process of
# the session, and every child, inherits these.
TRACKER_QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "WANDB_ERROR_REPORTING": "false"}
os.environ.update(TRACKER_QUIET)

REPO_ROOT = procs.REPO_ROOT
CRDS_DIR = REPO_ROOT / "crds"
SERVICE_FIXTURES = frozenset(
    {"minio_server", "minio", "kube_apiserver", "kube_namespace", "testbin_dir", "kube_cluster", "e2e_images"}
)
E2E_FIXTURES = frozenset({"kube_cluster", "e2e_images"})

_testbin: Path | procs.ServiceError | None = None
_images: Path | procs.ServiceError | None = None
_images_build: test_cluster.ImagesBuild | None = None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e: runs on the real one-node test cluster (kube_cluster; root, images built by scripts/images.sh)",
    )


# ---------------------------------------------------------------------------------------------
# Hooks


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses a service fixture ``services`` (before ``-m`` deselects)."""
    for item in items:
        used = getattr(item, "fixturenames", ())
        if SERVICE_FIXTURES.intersection(used):
            item.add_marker(pytest.mark.services)
        if E2E_FIXTURES.intersection(used):
            item.add_marker(pytest.mark.e2e)
    # The e2e tier last: its cluster starts once the other tiers are done and holds the machine only
    # for as long as it is needed (a session fixture lives until the end anyway).
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build/locate the service binaries once, before any test runs, if a selected test needs them."""
    global _testbin
    if session.config.option.collectonly or not any(
        item.get_closest_marker("services") for item in session.items
    ):
        return
    log_path = procs.testbin_cache_root() / "last-run.log"
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not os.environ.get("ECHORL_TESTBIN_DIR"):
        reporter.write_line(
            f"echorl: running scripts/testbin.sh (instant when cached; a first build takes ~8-10 min; "
            f"log: {log_path})"
        )
    start = time.monotonic()
    try:
        _testbin = procs.run_testbin(log_path=log_path)
    except procs.ServiceError as exc:
        _testbin = exc
    if reporter is not None and isinstance(_testbin, Path):
        reporter.write_line(f"echorl: test binaries in {_testbin} ({time.monotonic() - start:.1f} s)")
    if isinstance(_testbin, Path) and any(item.get_closest_marker("e2e") for item in session.items):
        _build_images(reporter)


def _build_images(reporter: object | None) -> None:
    """Start building (or finding) the e2e images, in the background, before any test runs.

    The e2e tier runs last, so a cold build (many minutes, mostly disk) overlaps the other tiers;
    the ``e2e_images`` fixture waits for it.
    """
    global _images_build
    if os.environ.get("ECHORL_E2E_IMAGES"):
        return
    log_path = test_cluster.cache_root() / "images" / "last-run.log"
    write = getattr(reporter, "write_line", None)
    if write is not None:
        write(
            f"echorl: scripts/images.sh runs in the background (instant when cached; a first build takes "
            f"~30 min; log: {log_path})"
        )
    os.environ.setdefault("ECHORL_TESTBIN_DIR", str(_testbin))
    _images_build = test_cluster.ImagesBuild.start(log_path)


def _wait_images() -> Path | procs.ServiceError:
    global _images
    given = os.environ.get("ECHORL_E2E_IMAGES")  # an image list a previous scripts/images.sh wrote
    if _images is None and given:
        _images = (
            Path(given)
            if Path(given).is_file()
            else procs.ServiceError(f"$ECHORL_E2E_IMAGES={given}: no such file")
        )
    if _images is None:
        if _images_build is None:
            _build_images(None)
        assert _images_build is not None
        try:
            _images = _images_build.wait()
        except procs.ServiceError as exc:
            _images = exc
    return _images


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def testbin_dir() -> Path:
    """The directory with ``minio``, ``etcd``, ``kube-apiserver`` and ``kubectl``."""
    global _testbin
    if _testbin is None:  # e.g. the hook did not run because the test was not marked
        try:
            _testbin = procs.run_testbin()
        except procs.ServiceError as exc:
            _testbin = exc
    if isinstance(_testbin, procs.ServiceError):
        pytest.fail(f"test service binaries unavailable:\n{_testbin}", pytrace=False)
    return _testbin


@pytest.fixture(scope="session")
def minio_server(testbin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MinioServer]:
    """A real MinIO server for the whole session."""
    server = start_minio(testbin_dir, tmp_path_factory.mktemp("minio"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def minio(minio_server: MinioServer, request: pytest.FixtureRequest) -> Iterator[MinioBucket]:
    """A fresh bucket (and a client) for one test; emptied and removed afterwards."""
    client = minio_server.client()
    name = bucket_name(request.node.name)
    client.make_bucket(name)
    try:
        yield MinioBucket(server=minio_server, bucket=name, client=client)
    finally:
        empty_and_remove_bucket(client, name)


@pytest.fixture(scope="session")
def kube_apiserver(testbin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    """etcd + kube-apiserver for the whole session, with the repo's CRDs installed and Established."""
    server = start_kube_apiserver(testbin_dir, tmp_path_factory.mktemp("kube"))
    try:
        if CRDS_DIR.is_dir():
            server.install_crds(CRDS_DIR)
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube_namespace(kube_apiserver: KubeApiServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test (created with the admin identity, deleted afterwards)."""
    from kubernetes import client

    name = bucket_name(request.node.name)[:63].strip("-")
    with kube_apiserver.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        try:
            yield name
        finally:
            core.delete_namespace(name)


@pytest.fixture(scope="session")
def e2e_images(testbin_dir: Path) -> Path:
    """The JSON list of images ``scripts/images.sh`` built (name → reference)."""
    images = _wait_images()
    if isinstance(images, procs.ServiceError):
        pytest.fail(f"e2e images unavailable:\n{images}", pytrace=False)
    return images


@pytest.fixture(scope="session")
def kube_cluster(
    testbin_dir: Path, e2e_images: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[test_cluster.Cluster]:
    """The real one-node cluster in its own network namespace; nothing of it may outlive the session."""
    try:
        cluster = test_cluster.start_cluster(testbin_dir, tmp_path_factory.mktemp("kube-cluster"), e2e_images)
    except procs.ServiceError as exc:
        pytest.fail(f"the test cluster did not start:\n{exc}", pytrace=False)
    try:
        yield cluster
    finally:
        left = cluster.stop()
        if left:
            pytest.fail("the test cluster left this on the host:\n" + "\n".join(left), pytrace=False)
