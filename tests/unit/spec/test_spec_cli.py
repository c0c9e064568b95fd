"""``echorl validate``: prints every problem with its path and exits non-zero; the real executable too.

Without ``--local`` it checks a file for a cluster (the API server's rules, cluster-only ones included);
``--local`` checks it for ``echorl run``. Agreement with the real API server, file by file:
tests/integration/operator/test_operator_validate_agrees.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from echo_runtime.cli import main

REPO = Path(__file__).parents[3]
INVALID = sorted((REPO / "tests" / "data" / "invalid-manifests").glob("*.yaml"))
VALID = sorted((REPO / "tests" / "data" / "valid-manifests").glob("*.yaml"))

GOOD = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: demo}
spec:
  syncPolicy: {mode: Sequential, maxStaleness: 0}
"""

CLUSTER_GOOD = """apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData: {accessKey: a, secretKey: b}
---
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: demo}
spec:
  model: {path: Qwen/Qwen3-0.6B}
  storage: {type: S3, endpoint: "minio:9000", bucket: echorl, credentialsSecret: creds}
"""

BAD = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: demo}
spec:
  syncPolicy: {maxStaleness: -1}
  inferenceSwarms: [{name: gpu, backend: tensorrt}]
  algorithm: {groupSize: "x"}
"""


def test_validate_local_accepts_a_good_local_manifest(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(GOOD)
    result = CliRunner().invoke(main, ["validate", "--local", str(path)])
    assert result.exit_code == 0, result.output
    assert "valid for echorl run (EchoJob/demo)" in result.output


def test_validate_checks_for_a_cluster_by_default(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(GOOD)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1
    assert "spec.storage: required in a cluster" in result.output
    assert "spec.model.path: required in a cluster" in result.output


def test_validate_skips_and_lists_other_kinds(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(CLUSTER_GOOD)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "valid (EchoJob/demo; skipped Secret/creds)" in result.output


def test_validate_lists_each_problem_and_fails(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(BAD)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1
    assert "spec.syncPolicy.maxStaleness: must be ≥ 0, got -1" in result.output
    assert "spec.inferenceSwarms[0].backend: must be one of" in result.output
    assert "spec.algorithm.groupSize: must be an integer, got 'x'" in result.output


TASK_MISTAKES = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: typo}
spec:
  task: {name: knights_knaaves}
---
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: option}
spec:
  task: {name: knights_knaves, options: {min_peeple: 3}}
"""


@pytest.mark.parametrize("local", [True, False], ids=["local", "cluster"])
def test_validate_names_an_unknown_task_and_an_unknown_option(tmp_path: Path, local: bool) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(TASK_MISTAKES)
    result = CliRunner().invoke(main, ["validate", *(["--local"] if local else []), str(path)])
    assert result.exit_code == 1, result.output
    assert "spec.task.name: unknown task 'knights_knaaves': did you mean 'knights_knaves'?" in result.output
    assert (
        "spec.task.options: task 'knights_knaves': unknown option 'min_peeple'; allowed options: "
        in result.output
    )


def test_validate_local_needs_a_plugin_task_installed_here(tmp_path: Path) -> None:
    """A name like no built-in may be a plugin of the cluster's images, but `echorl run` runs it here."""
    path = tmp_path / "job.yaml"
    path.write_text(GOOD + "  task: {name: countdown}\n")
    result = CliRunner().invoke(main, ["validate", "--local", str(path)])
    assert result.exit_code == 1, result.output
    assert "demo: spec.task.name: unknown task 'countdown': built-in tasks are" in result.output
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER_GOOD + "  task: {name: countdown}\n")
    result = CliRunner().invoke(main, ["validate", str(cluster)])
    assert result.exit_code == 0, result.output


def test_validate_reports_unreadable_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 1
    assert "cannot read" in result.output


def test_examples_are_valid_for_echorl_run() -> None:
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples, "examples/ has no manifests"
    result = CliRunner().invoke(main, ["validate", "--local", *map(str, examples)])
    assert result.exit_code == 0, result.output


def test_cluster_examples_are_valid_for_a_cluster() -> None:
    examples = sorted((REPO / "manifests" / "examples").glob("*.yaml"))
    names = {p.name for p in examples}
    assert {"cpu-job.yaml", "shared-sync-policy.yaml", "hpa-shared-pool.yaml"} <= names
    result = CliRunner().invoke(main, ["validate", *map(str, examples)])
    assert result.exit_code == 0, result.output
    assert "skipped HorizontalPodAutoscaler/shared-cpu" in result.output


def test_valid_corpus_is_accepted() -> None:
    assert VALID
    result = CliRunner().invoke(main, ["validate", *map(str, VALID)])
    assert result.exit_code == 0, result.output


def _header(path: Path, key: str) -> list[str]:
    prefix = f"# {key}: "
    return [line[len(prefix) :] for line in path.read_text().splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_corpus_is_rejected_on_the_named_field(path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    problems = [line.strip().split("] ")[-1] for line in result.output.splitlines()[1:]]
    fields = _header(path, "echorl")
    assert fields, f"{path.name} names no field"
    for field in fields:
        assert any(p.startswith(f"{field}: ") for p in problems), result.output
    for text in _header(path, "not"):
        assert text not in result.output


def test_installed_executable_runs(tmp_path: Path) -> None:
    exe = shutil.which("echorl", path=str(Path(sys.executable).parent)) or shutil.which("echorl")
    assert exe, "the echorl console script is not installed"
    path = tmp_path / "job.yaml"
    path.write_text(BAD)
    proc = subprocess.run([exe, "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "spec.syncPolicy.maxStaleness" in proc.stderr


def test_every_subcommand_has_help() -> None:
    runner = CliRunner()
    for name in main.list_commands(None):  # type: ignore[arg-type]
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "Usage:" in result.output


def test_worker_refuses_tensor_parallelism_outside_vllm(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: demo}\n")
    result = CliRunner().invoke(
        main,
        ["worker", "--coordinator", "http://127.0.0.1:9", "--token", "t", "--job", str(job),
         "--backend", "transformers", "--tensor-parallel-size", "2"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--tensor-parallel-size is for --backend vllm only" in result.output
