"""``create_backend`` and friends: names, missing packages, devices."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from echo_runtime import backends


def test_unknown_backend_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown backend 'onnx'; backends: transformers, mlx, vllm"):
        backends.create_backend("onnx", tmp_path)


def test_missing_package_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "mlx_lm" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert backends.missing_packages("mlx") == ["mlx_lm"]
    assert "mlx" not in backends.available_backends()
    with pytest.raises(ImportError, match=r"pip install 'echorl\[mlx\]'\); missing: mlx_lm"):
        backends.create_backend("mlx", tmp_path)


def test_detect_device_here_is_cpu() -> None:
    assert backends.detect_device("transformers") == "cpu"
    if not backends.missing_packages("mlx"):
        assert backends.detect_device("mlx") == "cpu"
    assert backends.detect_device("vllm") == "cuda"


def test_device_checks() -> None:
    from echo_runtime.backends import transformers as torch_backend

    assert torch_backend.resolve_device("auto") == "cpu"
    with pytest.raises(ValueError, match="no CUDA device"):
        torch_backend.resolve_device("cuda")
    with pytest.raises(ValueError, match="auto, cpu, cuda, mps"):
        torch_backend.resolve_device("tpu")
    if not backends.missing_packages("mlx"):
        from echo_runtime.backends import mlx as mlx_backend

        with pytest.raises(ValueError, match="Apple Silicon"):
            mlx_backend.resolve_device("cuda")


def test_importing_the_package_imports_no_framework() -> None:
    code = "import sys, echo_runtime.backends; print(sorted(m for m in ('torch', 'mlx', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
