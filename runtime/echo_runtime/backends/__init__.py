"""Inference backends behind one interface (:class:`echo_runtime.backends.base.Backend`).

* ``transformers`` — torch on CPU, CUDA or MPS; the default (:mod:`echo_runtime.backends.transformers`).
* ``mlx`` — mlx-lm on Apple Silicon, and slowly on Linux CPU (:mod:`echo_runtime.backends.mlx`).
* ``vllm`` — vLLM on CUDA; not exercised by CI (:mod:`echo_runtime.backends.vllm`).

Promises: importing this package imports no ML framework; :func:`create_backend` imports only the one
asked for, and an unknown name or a missing package is a clear error that says what to install.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Final

from echo_runtime.backends import base

BACKENDS: Final = ("transformers", "mlx", "vllm")
"""Backend names, as the manifest's ``InferenceSwarm.backend`` spells them."""

_PACKAGES: Final[dict[str, tuple[str, ...]]] = {
    "transformers": ("torch", "transformers", "peft"),
    "mlx": ("mlx", "mlx_lm"),
    "vllm": ("vllm",),
}
_HINTS: Final[dict[str, str]] = {
    "transformers": "the transformers backend needs torch, transformers and peft (installed with echorl)",
    "mlx": "the mlx backend needs the `mlx` extra (pip install 'echorl[mlx]')",
    "vllm": "the vllm backend needs CUDA and the `vllm` extra (pip install 'echorl[vllm]')",
}
_CLASSES: Final[dict[str, str]] = {
    "transformers": "TransformersBackend",
    "mlx": "MlxBackend",
    "vllm": "VllmBackend",
}


def check_backend(name: str) -> str:
    """``name`` if it is a backend, else a ValueError listing the backends."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; backends: {', '.join(BACKENDS)}")
    return name


def missing_packages(name: str) -> list[str]:
    """The packages backend ``name`` needs that are not installed (empty when it can be created)."""
    return [p for p in _PACKAGES[check_backend(name)] if importlib.util.find_spec(p) is None]


def available_backends() -> list[str]:
    """Backends whose packages are installed (vLLM still needs CUDA at creation time)."""
    return [name for name in BACKENDS if not missing_packages(name)]


def detect_device(backend: str = "transformers") -> str:
    """The device ``device="auto"`` picks for ``backend``: ``cuda``, ``mps`` or ``cpu``."""
    check_backend(backend)
    if backend == "vllm":
        return "cuda"
    if missing_packages(backend):
        raise ImportError(_HINTS[backend])
    module = importlib.import_module(f"echo_runtime.backends.{backend}")
    device: str = module.detect_device()
    return device


def create_backend(
    name: str,
    model_path: str | Path,
    device: str = "auto",
    dtype: str | None = None,
    threads: int | None = None,
    **options: Any,
) -> base.Backend:
    """A ready backend ``name`` with ``model_path`` (a local directory, hub id or ``echorl:<size>``) loaded.

    ``options`` go to the backend's constructor (e.g. ``max_batch_rows``; ``max_lora_rank`` for vLLM).
    """
    missing = missing_packages(name)
    if missing:
        raise ImportError(f"{_HINTS[name]}; missing: {', '.join(missing)}")
    module = importlib.import_module(f"echo_runtime.backends.{name}")
    backend: base.Backend = getattr(module, _CLASSES[name])(model_path, device, dtype, threads, **options)
    return backend
