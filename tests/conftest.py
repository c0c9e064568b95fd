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

Any test that uses one of these fixtures is marked ``services`` automatically, so
``pytest -m "not services"`` runs only the fast tests and builds nothing. When service tests are
selected, ``scripts/testbin.sh`` runs once right after collection (outside any per-test timeout);
if it fails, every fixture that needs a binary fails with the script's output.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # makes `services.*` importable

from services import procs
from services.kube import KubeApiServer, start_kube_apiserver
from services.minio import MinioBucket, MinioServer, bucket_name, empty_and_remove_bucket, start_minio

REPO_ROOT = procs.REPO_ROOT
CRDS_DIR = REPO_ROOT / "crds"
SERVICE_FIXTURES = frozenset({"minio_server", "minio", "kube_apiserver", "kube_namespace", "testbin_dir"})

_testbin: Path | procs.ServiceError | None = None


# ---------------------------------------------------------------------------------------------
# Hooks


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses a service fixture ``services`` (before ``-m`` deselects)."""
    for item in items:
        if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)


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
