"""One validation: ``echorl validate`` and the real API server (with the CRDs) accept and reject the same files.

Three corpora go through both: every file of the repo's ``examples/`` and ``manifests/`` that holds an
Echo object (the local-only ``examples/`` files are rejected by both: they have no S3 storage),
``tests/data/valid-manifests/`` (files both must accept: numbers and nulls as kubectl sends them, the
longest name) and ``tests/data/invalid-manifests/``, one invalid case per file. Each of those names, in its header, the
field path ``echorl validate`` reports (``# echorl:``), text of the API server's error (``# apiserver:``)
and text neither may print (``# not:``, for a second, misleading error about a field never set). The API
server is asked with ``kubectl apply --dry-run=server``: every admission step runs, nothing is stored.
"""

from __future__ import annotations

import pathlib
import subprocess

import pytest
from click.testing import CliRunner, Result

from echo_runtime import spec
from echo_runtime.cli import main
from services.kube import KubeApiServer

pytestmark = pytest.mark.services

REPO = pathlib.Path(__file__).resolve().parents[3]
INVALID = sorted((REPO / "tests" / "data" / "invalid-manifests").glob("*.yaml"))
VALID = sorted((REPO / "tests" / "data" / "valid-manifests").glob("*.yaml"))


def _has_echo_objects(path: pathlib.Path) -> bool:
    try:
        return bool(spec.read_file(path).manifests)
    except spec.ManifestError:
        return True  # invalid, so certainly meant as one of ours


# Files of other kinds only (the operator's Deployment, RBAC, a kustomization) are left out, except the
# cluster examples: `echorl validate` skips their documents, kubectl may not know their kinds.
REPO_FILES = sorted(
    p
    for folder in ("examples", "manifests")
    for p in (REPO / folder).rglob("*.yaml")
    if _has_echo_objects(p) or p.parent == REPO / "manifests" / "examples"
)


def header(path: pathlib.Path, key: str) -> list[str]:
    prefix = f"# {key}: "
    return [line[len(prefix) :] for line in path.read_text().splitlines() if line.startswith(prefix)]


def echorl_validate(path: pathlib.Path) -> Result:
    return CliRunner().invoke(main, ["validate", str(path)])


def server_apply(kube: KubeApiServer, namespace: str, path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return kube.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))


@pytest.fixture(scope="module")
def namespace(kube_apiserver: KubeApiServer, echorl_system: None) -> str:
    """One namespace for the whole module: a server-side dry run stores nothing in it."""
    name = "validate-agrees"
    proc = kube_apiserver.kubectl("create", "namespace", name)
    assert proc.returncode == 0 or "AlreadyExists" in proc.stderr, proc.stderr
    return name


def test_the_corpora_are_there() -> None:
    assert len(INVALID) >= 20 and len(VALID) >= 3
    names = {p.relative_to(REPO).as_posix() for p in REPO_FILES}
    for shipped in (
        "cpu-job.yaml",
        "shared-sync-policy.yaml",
        "hpa-shared-pool.yaml",
        "heterogeneous-job.yaml",
    ):
        assert f"manifests/examples/{shipped}" in names
    assert "examples/quickstart.yaml" in names
    for path in INVALID:
        assert header(path, "echorl") and header(path, "apiserver"), f"{path.name}: header incomplete"


@pytest.mark.parametrize("path", REPO_FILES, ids=[p.relative_to(REPO).as_posix() for p in REPO_FILES])
def test_repo_manifests_get_the_same_verdict(
    kube_apiserver: KubeApiServer, namespace: str, path: pathlib.Path
) -> None:
    cli, server = echorl_validate(path), server_apply(kube_apiserver, namespace, path)
    assert (cli.exit_code == 0) == (server.returncode == 0), (
        f"echorl validate exit {cli.exit_code}:\n{cli.output}\nkube-apiserver rc {server.returncode}:\n"
        f"{server.stdout}{server.stderr}"
    )
    if path.parent.name == "examples" and path.parent.parent.name == "manifests":
        assert cli.exit_code == 0, cli.output  # the shipped cluster examples are valid on both sides
    if path.parent == REPO / "examples":
        local = CliRunner().invoke(main, ["validate", "--local", str(path)])
        assert local.exit_code == 0, local.output  # and `echorl run` takes every local example


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_valid_manifests_are_accepted_by_both(
    kube_apiserver: KubeApiServer, namespace: str, path: pathlib.Path
) -> None:
    cli, server = echorl_validate(path), server_apply(kube_apiserver, namespace, path)
    assert cli.exit_code == 0, cli.output
    assert server.returncode == 0, server.stderr


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_manifests_are_rejected_by_both(
    kube_apiserver: KubeApiServer, namespace: str, path: pathlib.Path
) -> None:
    cli, server = echorl_validate(path), server_apply(kube_apiserver, namespace, path)
    assert cli.exit_code == 1, f"echorl validate accepted it:\n{cli.output}"
    assert server.returncode != 0, f"kube-apiserver accepted it:\n{server.stdout}"
    problems = [line.strip() for line in cli.output.splitlines()[1:]]
    for field in header(path, "echorl"):
        assert any(p.split("] ")[-1].startswith(f"{field}: ") for p in problems), cli.output
    for text in header(path, "apiserver"):
        assert text in server.stderr, server.stderr
    for text in header(path, "not"):
        assert text not in cli.output, cli.output
        assert text not in server.stderr, server.stderr
