"""``echorl bench`` without a model: the group, backend parsing, and errors a user can act on."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from echo_runtime.bench import fidelity_run
from echo_runtime.cli.bench import bench


def test_bench_is_a_group_with_fidelity() -> None:
    result = CliRunner().invoke(bench, ["--help"])
    assert result.exit_code == 0 and "fidelity" in result.output
    result = CliRunner().invoke(bench, ["fidelity", "--help"])
    assert result.exit_code == 0
    for option in ("--model", "--backends", "--prompts", "--n", "--out", "--snapshot", "--warmup-steps"):
        assert option in result.output


def test_parse_backends() -> None:
    parsed = fidelity_run.parse_backends("transformers, mlx,transformers:cuda,vllm")
    assert [(b.name, b.device, b.label) for b in parsed] == [
        ("transformers", "cpu", "transformers"),
        ("mlx", "cpu", "mlx"),
        ("transformers", "cuda", "transformers:cuda"),
        ("vllm", "cuda", "vllm"),
    ]
    with pytest.raises(ValueError, match="unknown backend 'onnx'"):
        fidelity_run.parse_backends("onnx")
    with pytest.raises(ValueError, match="listed twice"):
        fidelity_run.parse_backends("mlx,mlx")
    with pytest.raises(ValueError, match="no backends given"):
        fidelity_run.parse_backends(" , ")


def test_an_unknown_backend_is_a_clear_cli_error() -> None:
    result = CliRunner().invoke(bench, ["fidelity", "--backends", "tensorrt"])
    assert result.exit_code == 1
    assert "unknown backend 'tensorrt'; backends: transformers, mlx, vllm" in result.output


def test_target_verdict() -> None:
    pairs = {"mlx~transformers": {"logprobs": {"meanAbs": 2e-4}}}
    assert fidelity_run._target(pairs) == {
        "pair": "transformers~mlx",
        "meanAbsBound": 1e-4,
        "meanAbs": 2e-4,
        "met": False,
    }
    assert fidelity_run._target({})["met"] is None


def test_one_sample_per_backend_is_refused_before_any_model_loads() -> None:
    result = CliRunner().invoke(bench, ["fidelity", "--prompts", "1", "--n", "1", "--model", "/nonexistent"])
    assert result.exit_code == 1
    assert "prompts × n must be at least 2" in result.output and "got 1 × 1" in result.output


def test_bench_without_scipy_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_scipy(name: str, *args: object, **kwargs: object) -> object:
        if name == "scipy" or name.startswith("scipy."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    result = CliRunner().invoke(bench, ["fidelity", "--backends", "transformers"])
    assert result.exit_code == 1
    assert "pip install 'echorl[bench]'" in result.output
