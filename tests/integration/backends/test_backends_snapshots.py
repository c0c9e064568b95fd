"""Applying snapshots: LoRA versions swap in place without reloading the base; full snapshots load in
place; a backend that went through many versions computes exactly what a fresh one with the last does."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BACKENDS = ["transformers", "mlx"]


def _probe(backend: Any) -> list[float]:
    prompt = backend.tokenizer.encode("What is 12 + 30?")
    completion = backend.tokenizer.encode(" 42, since 12 + 30 = 42.")
    values: list[float] = backend.score_logprobs(prompt, completion, 1.0)
    return values


def _close(a: list[float], b: list[float], tol: float = 1e-5) -> bool:
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tol


def _lora_modules(backend: Any) -> dict[str, int]:
    """Identity of every LoRA module (torch: lora_A/lora_B Linear layers; mlx: the LoRALinear wrappers)."""
    if backend.name == "transformers":
        return {
            n: id(m)
            for n, m in backend.model.named_modules()
            if n.endswith(("lora_A.default", "lora_B.default"))
        }
    return {n: id(m) for n, m in backend.model.named_modules() if type(m).__name__ == "LoRALinear"}


@pytest.mark.parametrize("name", BACKENDS)
def test_lora_versions_swap_in_place_without_reloading_the_base(
    name: str, make_backend: Callable[..., Any], lora_snapshots: dict[str, Path]
) -> None:
    backend = make_backend(name)
    base_model = backend.base_model if name == "transformers" else backend.model
    base_probe = _probe(backend)
    assert backend.loaded_version is None

    backend.apply_snapshot(1, lora_snapshots["v1"], "lora")
    modules_v1 = _lora_modules(backend)
    assert modules_v1, "the LoRA layers should be in the model"
    v1 = _probe(backend)
    backend.apply_snapshot(2, lora_snapshots["v2"], "lora")
    v2 = _probe(backend)
    assert backend.loaded_version == 2
    assert backend.base_loads == 1
    assert _lora_modules(backend) == modules_v1, "same layout: tensors copied into the same modules"
    if name == "transformers":
        assert backend.base_model is base_model
    assert not _close(v1, v2, 1e-2) and not _close(base_probe, v1, 1e-2)

    # Back to v1: exactly v1 again (nothing of v2 lingers).
    backend.apply_snapshot(3, lora_snapshots["v1"], "lora")
    assert _close(_probe(backend), v1)

    # Another layout re-wraps from the untouched base layers: equal to a fresh backend with it.
    backend.apply_snapshot(4, lora_snapshots["other"], "lora")
    fresh = make_backend(name)
    fresh.apply_snapshot(4, lora_snapshots["other"], "lora")
    assert _close(_probe(backend), _probe(fresh))
    assert backend.base_loads == 1
    backend.apply_snapshot(5, lora_snapshots["v2"], "lora")
    assert _close(_probe(backend), v2)
    assert backend.base_loads == 1


@pytest.mark.parametrize("name", BACKENDS)
def test_full_snapshots_load_in_place(
    name: str, make_backend: Callable[..., Any], lora_snapshots: dict[str, Path], full_snapshot: Path
) -> None:
    backend = make_backend(name)
    backend.apply_snapshot(1, lora_snapshots["v1"], "lora")
    v1 = _probe(backend)
    backend.apply_snapshot(2, full_snapshot, "full")
    assert backend.base_loads == 1
    fresh = make_backend(name)
    fresh.apply_snapshot(2, full_snapshot, "full")
    full = _probe(fresh)
    assert _close(_probe(backend), full)
    assert not _lora_modules(backend), "a full snapshot replaces the LoRA layers"

    # A LoRA after a full snapshot needs the original base: the one documented reload.
    backend.apply_snapshot(3, lora_snapshots["v1"], "lora")
    assert backend.base_loads == 2
    assert _close(_probe(backend), v1)


@pytest.mark.parametrize("name", BACKENDS)
def test_bad_snapshots_are_rejected_and_leave_the_version(
    name: str,
    make_backend: Callable[..., Any],
    lora_snapshots: dict[str, Path],
    tmp_path: Path,
    tiny_model: Path,
) -> None:
    backend = make_backend(name)
    backend.apply_snapshot(1, lora_snapshots["v1"], "lora")
    v1 = _probe(backend)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        backend.apply_snapshot(2, tmp_path / "missing", "lora")
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json"):
        backend.apply_snapshot(2, tmp_path, "lora")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        backend.apply_snapshot(2, tmp_path, "full")
    dora = tmp_path / "dora"
    shutil.copytree(lora_snapshots["v2"], dora)
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        backend.apply_snapshot(2, dora, "lora")

    # Weights for a layer the model does not have (layer 9 of 2), or of the wrong width.
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(lora_snapshots["v2"] / "adapter_model.safetensors"))
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(lora_snapshots["v2"], elsewhere)
    save_file(
        {k.replace("layers.1.", "layers.9."): v for k, v in tensors.items()},
        str(elsewhere / "adapter_model.safetensors"),
    )
    with pytest.raises(ValueError, match=r"layers\.9"):
        backend.apply_snapshot(2, elsewhere, "lora")
    wide = tmp_path / "wide"
    shutil.copytree(lora_snapshots["v2"], wide)
    save_file(
        {k: v.repeat(1, 2) if "lora_A" in k else v for k, v in tensors.items()},
        str(wide / "adapter_model.safetensors"),
    )
    with pytest.raises(ValueError, match="features"):
        backend.apply_snapshot(2, wide, "lora")

    # A full snapshot with a tensor of the wrong shape, or a name the model does not have.
    state = load_file(str(tiny_model / "model.safetensors"))
    bad_full = tmp_path / "bad-full"
    bad_full.mkdir()
    save_file(
        {**state, "model.norm.weight": state["model.norm.weight"][:3].clone()},
        str(bad_full / "model.safetensors"),
    )
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape"):
        backend.apply_snapshot(2, bad_full, "full")
    save_file(
        {**state, "model.extra.weight": state["model.norm.weight"].clone()},
        str(bad_full / "model.safetensors"),
    )
    with pytest.raises(ValueError, match=r"model\.extra\.weight"):
        backend.apply_snapshot(2, bad_full, "full")

    assert backend.loaded_version == 1
    assert _close(_probe(backend), v1)


@pytest.mark.parametrize("which", ["v1", "other"])
def test_mlx_adapter_directory_matches_mlx_lm(
    which: str,
    lora_snapshots: dict[str, Path],
    tmp_path: Path,
    tiny_model: Path,
    make_backend: Callable[..., Any],
) -> None:
    """The converted adapter, loaded by mlx-lm's own ``load(adapter_path=...)``, is the same policy."""
    import mlx.core as mx
    import mlx_lm

    from echo_runtime.backends import mlx as mlx_backend

    out = mlx_backend.save_mlx_adapter(lora_snapshots[which], tmp_path / "mlx-adapter", num_layers=2)
    model = mlx_lm.load(str(tiny_model), adapter_path=str(out))[0]
    backend = make_backend("mlx")
    backend.apply_snapshot(1, lora_snapshots[which], "lora")
    ids = mx.array([backend.tokenizer.encode("What is 12 + 30? 42")])
    assert float(mx.abs(model(ids) - backend.model(ids)).max()) <= 1e-6
