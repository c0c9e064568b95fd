"""peft → mlx-lm adapter conversion on synthetic adapters (the real-model check is in the integration tests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from echo_runtime.backends import mlx as mlx_backend  # noqa: E402
from echo_runtime.backends import snapshot_files  # noqa: E402

LAST_LAYER = ("model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj")


def test_tensors_are_transposed_to_lora_a_and_lora_b(write_adapter: Callable[..., Path]) -> None:
    path = write_adapter()
    tensors = mlx_backend.load_safetensors(path / snapshot_files.ADAPTER_WEIGHTS)
    adapter = snapshot_files.read_lora_adapter(path, {k: list(v.shape) for k, v in tensors.items()})
    converted = mlx_backend.convert_peft_adapter(adapter, tensors)
    q = "model.layers.0.self_attn.q_proj"
    assert sorted(converted) == sorted(
        f"{m}.{w}" for m in (q, q.replace("q_proj", "v_proj")) for w in ("lora_a", "lora_b")
    )
    peft_a = np.array(tensors[f"base_model.model.{q}.lora_A.weight"])
    assert np.array_equal(np.array(converted[f"{q}.lora_a"]), peft_a.T)
    assert converted[f"{q}.lora_b"].shape == (4, 6)


def test_save_mlx_adapter_writes_mlx_lm_config(write_adapter: Callable[..., Path], tmp_path: Path) -> None:
    out = mlx_backend.save_mlx_adapter(write_adapter(modules=LAST_LAYER), tmp_path / "out", num_layers=2)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config == {
        "fine_tune_type": "lora",
        "num_layers": 1,
        "lora_parameters": {
            "rank": 4,
            "scale": 2.0,
            "dropout": 0.0,
            "keys": ["self_attn.q_proj", "self_attn.v_proj"],
        },
    }
    assert (out / "adapters.safetensors").is_file()


def test_adapters_mlx_lm_cannot_express_are_refused(
    write_adapter: Callable[..., Path], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="last n layers"):  # layer 0 of 2 is not "the last n"
        mlx_backend.save_mlx_adapter(write_adapter("first"), tmp_path / "a", num_layers=2)
    mixed = write_adapter(
        "mixed",
        config={"rank_pattern": {"v_proj": 2}},
        modules=LAST_LAYER,
        rank={LAST_LAYER[0]: 4, LAST_LAYER[1]: 2},
    )
    with pytest.raises(ValueError, match="one rank and one scale"):
        mlx_backend.save_mlx_adapter(mixed, tmp_path / "b", num_layers=2)
