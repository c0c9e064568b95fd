"""``echorl validate``: prints every problem with its path and exits non-zero; the real executable too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from echo_runtime.cli import main

GOOD = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: demo}
spec:
  syncPolicy: {mode: Sequential, maxStaleness: 0}
"""

BAD = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: demo}
spec:
  syncPolicy: {maxStaleness: -1}
  inferenceSwarms: [{name: gpu, backend: tensorrt}]
  algorithm: {groupSize: "x"}
"""


def test_validate_accepts_a_good_manifest(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(GOOD)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "valid (EchoJob/demo)" in result.output


def test_validate_lists_each_problem_and_fails(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(BAD)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1
    assert "spec.syncPolicy.maxStaleness: must be ≥ 0, got -1" in result.output
    assert "spec.inferenceSwarms[0].backend: must be one of" in result.output
    assert "spec.algorithm.groupSize: must be an integer, got 'x'" in result.output


def test_validate_reports_unreadable_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 1
    assert "cannot read" in result.output


def test_examples_are_valid() -> None:
    examples = sorted((Path(__file__).parents[3] / "examples").glob("*.yaml"))
    assert examples, "examples/ has no manifests"
    result = CliRunner().invoke(main, ["validate", *map(str, examples)])
    assert result.exit_code == 0, result.output


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
