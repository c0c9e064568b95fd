"""Echo's built-in models: small Qwen3-architecture causal LMs with a tokenizer trained on the tasks.

No model hub is reachable on the project's machines, so tests and the CPU demo use models Echo builds
itself. They are ordinary Hugging Face checkpoints: the same loading code serves them and any real model.

Promises of :func:`init_model`:

* The output directory holds ``config.json`` (``model_type: qwen3``), ``model.safetensors`` (float32),
  ``generation_config.json``, ``tokenizer.json`` / ``tokenizer_config.json`` and ``echorl-model.json``
  (what was built: size, seed, build version, parameter count). ``AutoModelForCausalLM``,
  ``AutoTokenizer`` and ``mlx_lm.load`` load it from the directory.
* **Deterministic.** The same size and seed give byte-identical ``model.safetensors`` and
  ``tokenizer.json`` (on the same versions of torch/transformers/tokenizers); a different seed gives
  different weights. The tokenizer depends only on the size's vocabulary size and the task corpus, not
  on the seed, so every seed of one size shares a tokenizer.
* The global torch RNG state is left as it was.

:data:`BUILD_VERSION` names the recipe; it is part of the cache key (see :mod:`echo_runtime.models.resolve`),
so changing a size or the tokenizer recipe must bump it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from echo_runtime.models import tokenizer as tok

BUILD_VERSION: Final = 1
"""Version of the build recipe (sizes, tokenizer, initialisation); bump it when any of them changes."""

METADATA_FILE: Final = "echorl-model.json"
"""Written last into a built directory: what was built. Its presence marks a complete build."""

MAX_POSITIONS: Final = 2048
"""Context length of the built-in models (rotary embeddings: no parameters depend on it)."""

_COMMON: Final[dict[str, Any]] = {
    "hidden_act": "silu",
    "max_position_embeddings": MAX_POSITIONS,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_cache": True,
}

SIZES: Final[dict[str, dict[str, Any]]] = {
    # 525,056 parameters. Measured on 2 CPU cores (one torch thread): a training step on 64 arithmetic
    # sequences ~0.05 s, sampling 64 rollouts ~0.05 s; supervised warm-up at lr 3e-3 learns 2-digit +/-
    # to ~0.8 greedy held-out accuracy in 1600-2400 steps. The CPU demo's policy.
    "tiny": {
        **_COMMON,
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
    },
    # 11,114,112 parameters: ~13x the CPU cost of tiny per step (~0.65 s per 64-sequence training step)
    # and, measured, no faster to learn arithmetic per step; for larger tasks and GPU runs.
    "small": {
        **_COMMON,
        "vocab_size": 2048,
        "hidden_size": 384,
        "intermediate_size": 1152,
        "num_hidden_layers": 6,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 64,
    },
}
"""``Qwen3Config`` keyword arguments of each built-in size."""


def check_size(size: str) -> str:
    """``size`` itself, or a ValueError naming the sizes that exist."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; built-in sizes: {', '.join(SIZES)}")
    return size


def qwen3_config(size: str, eos_token_id: int) -> Any:
    """The ``transformers.Qwen3Config`` of a built-in size."""
    from transformers import Qwen3Config

    return Qwen3Config(
        **SIZES[check_size(size)],
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        dtype="float32",
        architectures=["Qwen3ForCausalLM"],
    )


def count_parameters(model: Any) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def init_model(size: str, out_dir: str | Path, seed: int = 0, *, overwrite: bool = False) -> Path:
    """Build a freshly initialised model of ``size`` with its tokenizer into ``out_dir``; return it.

    The directory is written in a temporary sibling and renamed into place, so a reader never sees a
    half-written build. An existing ``out_dir`` is an error unless ``overwrite`` is set.
    """
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    generation_config_class: Any = GenerationConfig

    check_size(size)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass overwrite=True / --overwrite to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)

    tokenizer = tok.train_tokenizer(SIZES[size]["vocab_size"])
    eos_id = tokenizer.token_to_id(tok.EOS_TOKEN)
    if eos_id is None:  # cannot happen: the BPE trainer adds it as a special token
        raise RuntimeError(f"the trained tokenizer lacks {tok.EOS_TOKEN}")
    config = qwen3_config(size, eos_id)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = Qwen3ForCausalLM(config)
    model = model.to(torch.float32)
    model.eval()
    # Only the special tokens: sampling settings belong to the job (``Sampling``), not to the checkpoint.
    model.generation_config = generation_config_class(
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id
    )

    tmp = make_temp_dir(out)
    try:
        save_model(model, tmp)
        tok.save_tokenizer(tokenizer, tmp, model_max_length=MAX_POSITIONS)
        metadata = {
            "name": f"echorl:{size}",
            "size": size,
            "seed": seed,
            "build_version": BUILD_VERSION,
            "parameters": count_parameters(model),
            "vocab_size": config.vocab_size,
            "warmup": None,
        }
        write_json(tmp / METADATA_FILE, metadata)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def make_temp_dir(out: Path) -> Path:
    """A fresh hidden sibling of ``out`` to build in (then ``os.replace`` it onto ``out``).

    Made world-readable (0755), since ``mkdtemp``'s private 0700 would otherwise stick to the result.
    """
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)
    return tmp


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Silence transformers' progress bars (shard writing/loading) for the duration; restore after."""
    from transformers.utils import logging as _hf_logging

    hf_logging: Any = _hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def save_model(model: Any, out_dir: str | Path) -> None:
    """``model.save_pretrained`` as one ``model.safetensors`` (plus config and generation config), quietly."""
    with quiet_progress():
        model.save_pretrained(str(out_dir), safe_serialization=True, max_shard_size="100GB")


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as stable, indented JSON (sorted keys, trailing newline)."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_metadata(model_dir: str | Path) -> dict[str, Any] | None:
    """The ``echorl-model.json`` of a built-in model directory, or None for any other directory."""
    path = Path(model_dir) / METADATA_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None
