"""Fixtures for the backend tests: the tiny model built into a temporary directory, and snapshots of it.

``tiny_model`` (session)
    ``init_model("tiny", seed=0)`` built into a session temp dir (Echo's user cache is not touched).
``lora_snapshots`` (session)
    ``{"v1": dir, "v2": dir, "other": dir}``: peft adapter directories written by
    ``PeftModel.save_pretrained`` with random, clearly nonzero ``A`` and ``B``. ``v1`` and ``v2`` share a
    layout (q/v/down projections, rank 4, alpha 8); ``other`` has a different one (rank 2 on all linear
    layers, rsLoRA), so switching to it re-wraps.
``full_snapshot`` (session)
    The tiny model's state dict, perturbed so that its distributions are far from uniform, saved as two
    safetensors shards with ``model.safetensors.index.json`` and without the tied ``lm_head.weight``.
``make_backend`` (function)
    ``make_backend("transformers" | "mlx", **options)`` → a fresh backend on ``tiny_model`` (CPU, one
    torch thread: on a shared 2-core machine, torch's two OpenMP threads run ~20x slower than one; the
    process-wide thread count is restored afterwards).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from echo_runtime import backends
from echo_runtime.backends import base
from echo_runtime.models import build

LORA_TARGETS = ["q_proj", "v_proj", "down_proj"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build.init_model("tiny", tmp_path_factory.mktemp("backends-model") / "tiny", seed=0)


def _write_lora(model_dir: Path, out: Path, *, seed: int, config: dict[str, Any]) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # peft probes a deprecated transformers attribute
        peft_model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    peft_model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def lora_snapshots(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("backends-lora")
    same = {"r": 4, "lora_alpha": 8, "target_modules": LORA_TARGETS}
    other = {
        "r": 2,
        "lora_alpha": 4,
        "use_rslora": True,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    }
    return {
        "v1": _write_lora(tiny_model, root / "v1", seed=1, config=same),
        "v2": _write_lora(tiny_model, root / "v2", seed=2, config=same),
        "other": _write_lora(tiny_model, root / "other", seed=3, config=other),
    }


@pytest.fixture(scope="session")
def full_snapshot(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import load_file, save_file

    state = load_file(str(tiny_model / "model.safetensors"))
    generator = torch.Generator().manual_seed(7)
    perturbed = {}
    for key, tensor in sorted(state.items()):
        noise = torch.randn(tensor.shape, generator=generator) * 0.05
        # Larger embeddings make the (tied) output logits spread out: a sharper policy tests more.
        perturbed[key] = tensor * 5.0 + noise if "embed_tokens" in key else tensor + noise
    perturbed.pop("lm_head.weight", None)
    out = tmp_path_factory.mktemp("backends-full")
    keys = sorted(perturbed)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for name, shard_keys in shards.items():
        save_file({k: perturbed[k].contiguous() for k in shard_keys}, str(out / name))
        weight_map.update(dict.fromkeys(shard_keys, name))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


@pytest.fixture
def make_backend(tiny_model: Path) -> Iterator[Callable[..., base.Backend]]:
    threads = torch.get_num_threads()

    def make(name: str, **options: Any) -> base.Backend:
        options.setdefault("threads", 1)
        return backends.create_backend(name, tiny_model, device="cpu", **options)

    try:
        yield make
    finally:
        torch.set_num_threads(threads)
