"""``echorl bench fidelity`` for real: the tiny model, a LoRA version exported by the trainer's policy,
transformers (CPU) and mlx sampling it, the trainer recomputing every token.

Issue 8's target: transformers-CPU vs mlx mean per-token |Δ log-prob| ≤ 1e-4 on the tiny model. Each
backend must also match the trainer's recomputation, and the version compared must really differ from
the base model (otherwise agreement would prove nothing). vLLM cannot run here and must be reported as
skipped, not silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from echo_runtime.cli.bench import bench

pytest.importorskip("mlx.core")

BOUND = 1e-4


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("fidelity")
    out = root / "fidelity.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "ECHORL_CACHE_DIR", str(root / "cache")
        )  # the tiny model is built here, not in the user's cache
        result = CliRunner().invoke(
            bench,
            [
                "fidelity",
                "--model",
                "echorl:tiny",
                "--backends",
                "transformers,mlx,vllm",
                "--prompts",
                "8",
                "--n",
                "2",
                "--max-new-tokens",
                "24",
                "--out",
                str(out),
            ],
        )
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(out.read_text())
    document["_output"] = result.output
    yield document


def test_transformers_and_mlx_agree_within_the_issue_target(report: dict[str, Any]) -> None:
    target = report["target"]
    assert target["pair"] == "transformers~mlx"
    assert target["meanAbs"] is not None and target["meanAbs"] <= BOUND, target
    assert target["met"] is True
    pair = report["pairs"]["transformers~mlx"]["logprobs"]
    assert pair["sequences"] == 2 * 8 * 2 and pair["maxAbs"] <= BOUND
    assert "target transformers~mlx mean|Δ| ≤ 0.0001" in report["_output"]


def test_every_backend_matches_the_trainers_recomputation(report: dict[str, Any]) -> None:
    assert set(report["backends"]) == {"transformers", "mlx"}
    for name, backend in report["backends"].items():
        mismatch = backend["vsTrainer"]
        assert backend["samples"] == 16 and mismatch["tokens"] == backend["tokens"] > 0, name
        assert mismatch["meanAbs"] <= BOUND and mismatch["maxAbs"] <= BOUND, (name, mismatch)
        assert abs(mismatch["klSeq"]) <= 1e-6, (name, mismatch)
        assert backend["promptTokenizationDiffers"] == 0


def test_the_compared_version_is_not_the_base_model(report: dict[str, Any]) -> None:
    assert report["policyVersion"] == 1 and report["snapshot"] == "lora"
    assert report["snapshotEffect"]["meanAbs"] > 100 * BOUND


def test_two_sample_tests_are_reported_and_vllm_is_skipped_with_a_reason(report: dict[str, Any]) -> None:
    pair = report["pairs"]["transformers~mlx"]
    for key in ("rewards", "completionLengths", "sequenceLogprobs"):
        stats = pair[key]
        assert stats["nA"] == stats["nB"] == 16
        assert 0.0 <= stats["permutationP"] <= 1.0 and 0.0 <= stats["mannWhitneyP"] <= 1.0
    assert "vllm" in report["skipped"] and report["skipped"]["vllm"]


def test_report_is_reproducible_in_its_numbers(report: dict[str, Any], tmp_path: Path) -> None:
    """Same seed, same samples: the JSON a user gets twice differs only in timings."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ECHORL_CACHE_DIR", str(Path(report["modelDir"]).parents[1]))
        result = CliRunner().invoke(
            bench,
            [
                "fidelity",
                "--backends",
                "transformers",
                "--prompts",
                "8",
                "--n",
                "2",
                "--max-new-tokens",
                "24",
                "--out",
                str(tmp_path / "again.json"),
            ],
        )
    assert result.exit_code == 0, result.output
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["backends"]["transformers"]["vsTrainer"] == report["backends"]["transformers"]["vsTrainer"]
    assert again["pairs"] == {}
