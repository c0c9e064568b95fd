"""``echorl model init`` / ``echorl model warmup`` through click's runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from echo_runtime.cli.model import model
from echo_runtime.models import build, resolve, warmup


@pytest.fixture(autouse=True)
def _cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ECHORL_CACHE_DIR", str(tmp_path / "cache"))


def _last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


def test_init_into_the_cache_and_into_a_directory(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(model, ["init", "--size", "tiny", "--seed", "2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(resolve.models_dir() / resolve.cache_key("tiny", seed=2))
    assert "parameters" in result.stderr

    out = tmp_path / "mine"
    result = runner.invoke(model, ["init", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out.resolve())
    assert build.read_metadata(out) is not None

    result = runner.invoke(model, ["init", "--out", str(out)])
    assert result.exit_code != 0 and "already exists" in result.output
    assert runner.invoke(model, ["init", "--size", "huge"]).exit_code == 2


def test_init_takes_a_model_name(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(model, ["init", "echorl:tiny"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == resolve.resolve_model("echorl:tiny")
    result = runner.invoke(model, ["init", "qwen-7b"])
    assert result.exit_code == 2 and "choose one of tiny, small, smollm2-135m" in result.output
    result = runner.invoke(model, ["init", "smollm2-135m", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "lives in the cache" in result.output  # refused before any download


def test_warmup_prints_progress_and_accuracy(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "warm"
    result = runner.invoke(
        model, ["warmup", "--model", "echorl:tiny", "--steps", "3", "--eval-size", "4", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out.resolve())
    assert "before: held-out accuracy" in result.stderr and "after: held-out accuracy" in result.stderr
    assert warmup.read_record(out) is not None

    result = runner.invoke(model, ["warmup", "--model", "echorl:tiny", "--steps", "2"])
    assert result.exit_code == 0, result.output
    cached = resolve.models_dir() / resolve.cache_key("tiny", seed=0, warmup_steps=2, task="arithmetic")
    assert _last_line(result.stdout) == str(cached)
    assert "after: held-out accuracy" in result.stderr


def test_warmup_errors_are_clear(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        model, ["warmup", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1 and "does not exist" in result.output
    result = runner.invoke(model, ["warmup", "--model", str(tmp_path)])
    assert result.exit_code == 2 and "--out is required" in result.output
    result = runner.invoke(model, ["warmup", "--model", "echorl:tiny", "--lr", "0.1"])
    assert result.exit_code == 2 and "--out" in result.output
    result = runner.invoke(model, ["warmup", "--model", "echorl:big", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "echorl:tiny, echorl:small" in result.output
