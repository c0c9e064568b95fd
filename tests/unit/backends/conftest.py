"""Fixtures for the backends' unit tests: synthetic snapshot directories, no model.

``write_adapter`` (function)
    ``write_adapter(name, config=..., modules=..., rank=4, in_dim=8, out_dim=6)`` → a peft-style adapter
    directory under ``tmp_path`` with ``adapter_config.json`` (``config`` merged over a plain LoRA config)
    and ``adapter_model.safetensors`` holding ``lora_A``/``lora_B`` for each module path, under peft's
    ``base_model.model.`` prefix.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

PLAIN_LORA: dict[str, Any] = {
    "peft_type": "LORA",
    "r": 4,
    "lora_alpha": 8,
    "target_modules": ["q_proj", "v_proj"],
    "bias": "none",
    "use_dora": False,
    "use_rslora": False,
    "rank_pattern": {},
    "alpha_pattern": {},
    "modules_to_save": None,
    "fan_in_fan_out": False,
    "lora_bias": False,
}

DEFAULT_MODULES = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj")


@pytest.fixture
def write_adapter(tmp_path: Path) -> Callable[..., Path]:
    def write(
        name: str = "adapter",
        *,
        config: dict[str, Any] | None = None,
        modules: Sequence[str] = DEFAULT_MODULES,
        rank: int | dict[str, int] = 4,
        in_dim: int = 8,
        out_dim: int = 6,
    ) -> Path:
        out = tmp_path / name
        out.mkdir()
        rng = np.random.default_rng(0)
        tensors = {}
        for module in modules:
            r = rank[module] if isinstance(rank, dict) else rank
            prefix = f"base_model.model.{module}"
            tensors[f"{prefix}.lora_A.weight"] = rng.standard_normal((r, in_dim)).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = rng.standard_normal((out_dim, r)).astype(np.float32)
        save_file(tensors, str(out / "adapter_model.safetensors"))
        (out / "adapter_config.json").write_text(json.dumps({**PLAIN_LORA, **(config or {})}))
        return out

    return write
