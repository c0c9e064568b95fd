"""What the files of a snapshot are, and how to write and read them so the round trip is bit-exact.

``lora``: a peft adapter folder, ``adapter_model.safetensors`` + ``adapter_config.json``: exactly
what ``PeftModel.save_pretrained`` writes and what ``PeftModel.from_pretrained`` and vLLM's LoRA
loader read.

``full``: a whole state dict in safetensors, Hugging Face layout: ``model.safetensors``, or for
large models shards ``model-00001-of-0000N.safetensors`` plus ``model.safetensors.index.json``
(``{"metadata": {"total_size": …}, "weight_map": {tensor name: shard}}``).

Invariant: ``load_*(save_*(tensors))`` returns the same names, dtypes, shapes and bytes. Tensors
that share memory (tied embeddings) are written as separate copies, because safetensors stores no
aliasing; non-contiguous tensors are made contiguous; nothing is ever cast.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from echo_runtime.snapshots.manifest import Kind

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
FULL_WEIGHTS = "model.safetensors"
FULL_INDEX = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 2 * 1024**3
_METADATA = {"format": "pt"}


@dataclasses.dataclass(frozen=True)
class LoraAdapter:
    """A loaded adapter: its peft config (as JSON) and its tensors."""

    config: dict[str, Any]
    tensors: dict[str, torch.Tensor]


def save_peft_adapter(
    model: Any, out_dir: str | os.PathLike[str], state: Mapping[str, torch.Tensor] | None = None
) -> Path:
    """Write a ``peft.PeftModel``'s adapter (weights + config) to ``out_dir`` and return it; ``state``
    (the model's parameters by name, whole) replaces the model's own tensors, as for a sharded model."""
    out = Path(out_dir)
    if state is None:
        model.save_pretrained(str(out), safe_serialization=True)
    else:
        model.save_pretrained(str(out), safe_serialization=True, state_dict=dict(state))
    missing = [n for n in (ADAPTER_WEIGHTS, ADAPTER_CONFIG) if not (out / n).is_file()]
    if missing:
        raise RuntimeError(f"peft did not write {', '.join(missing)} into {out}")
    return out


def save_lora_adapter(
    tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any], out_dir: str | os.PathLike[str]
) -> Path:
    """Write adapter ``tensors`` and a peft ``config`` (``LoraConfig.to_dict()``) in peft's layout."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(storable(tensors), str(out / ADAPTER_WEIGHTS), metadata=_METADATA)
    (out / ADAPTER_CONFIG).write_text(
        json.dumps(dict(config), indent=2, sort_keys=True, default=_json_default)
    )
    return out


def load_lora_adapter(path: str | os.PathLike[str]) -> LoraAdapter:
    """Read an adapter folder written by :func:`save_lora_adapter` or :func:`save_peft_adapter`."""
    folder = Path(path)
    return LoraAdapter(
        config=json.loads((folder / ADAPTER_CONFIG).read_text()),
        tensors=safetensors.torch.load_file(str(folder / ADAPTER_WEIGHTS)),
    )


def save_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    out_dir: str | os.PathLike[str],
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> list[Path]:
    """Write a full state dict, sharded when it exceeds ``max_shard_bytes``; return the files written.

    Shards are filled greedily in the state dict's order; a tensor larger than the limit gets a
    shard of its own.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, shard in _plan(state_dict, max_shard_bytes):
        if isinstance(shard, bytes):
            (out / name).write_bytes(shard)
        else:
            safetensors.torch.save_file(shard, str(out / name), metadata=_METADATA)
        written.append(out / name)
    return written


def serialise_state_dict(
    state_dict: Mapping[str, torch.Tensor], *, max_shard_bytes: int = DEFAULT_SHARD_BYTES
) -> list[tuple[str, bytes]]:
    """The files :func:`save_state_dict` writes, as ``(name, bytes)`` in memory, byte for byte."""
    return [
        (name, shard if isinstance(shard, bytes) else safetensors.torch.save(shard, metadata=_METADATA))
        for name, shard in _plan(state_dict, max_shard_bytes)
    ]


def plan_files(
    sizes: Sequence[tuple[str, int]], max_shard_bytes: int = DEFAULT_SHARD_BYTES
) -> tuple[list[tuple[str, list[str]]], bytes | None]:
    """Which tensors each file of a full state dict holds, from ``(name, bytes)`` in state-dict order:
    ``[(file name, names)]`` and the index's bytes (None when one file holds them all). Files are filled
    greedily; a tensor larger than the limit gets a file of its own."""
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes: must be ≥ 1, got {max_shard_bytes}")
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes:
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    if len(shards) == 1:
        return [(FULL_WEIGHTS, shards[0])], None
    files = [
        (f"model-{i:05d}-of-{len(shards):05d}.safetensors", names) for i, names in enumerate(shards, start=1)
    ]
    weight_map = {name: file for file, names in files for name in names}
    index = {"metadata": {"total_size": sum(size for _, size in sizes)}, "weight_map": weight_map}
    return files, json.dumps(index, indent=2).encode()


def _plan(
    state_dict: Mapping[str, torch.Tensor], max_shard_bytes: int
) -> list[tuple[str, dict[str, torch.Tensor] | bytes]]:
    """File name → the tensors it holds (or, for the index, its bytes)."""
    tensors = storable(state_dict)
    sizes = [(name, t.numel() * t.element_size()) for name, t in tensors.items()]
    files, index = plan_files(sizes, max_shard_bytes)
    planned: list[tuple[str, dict[str, torch.Tensor] | bytes]] = [
        (file, {name: tensors[name] for name in names}) for file, names in files
    ]
    if index is not None:
        planned.append((FULL_INDEX, index))
    return planned


def save_state_dict_streamed(
    sizes: Sequence[tuple[str, int]],
    fetch: Callable[[str], torch.Tensor],
    out_dir: str | os.PathLike[str] | None,
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> list[Path]:
    """:func:`save_state_dict`'s files, with each tensor asked of ``fetch`` only when its file is written
    and let go after, so that at most one file's tensors are held at once (a sharded trainer gathers
    them). ``out_dir`` None: every ``fetch`` is made and nothing written (the other ranks of a gather)."""
    files, index = plan_files(sizes, max_shard_bytes)
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    written = []
    for file, names in files:
        tensors = storable({name: fetch(name) for name in names})
        if out is not None:
            safetensors.torch.save_file(tensors, str(out / file), metadata=_METADATA)
            written.append(out / file)
        del tensors
    if out is not None and index is not None:
        (out / FULL_INDEX).write_bytes(index)
        written.append(out / FULL_INDEX)
    return written


def load_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a state dict written by :func:`save_state_dict` (single file or sharded)."""
    folder = Path(path)
    index_path = folder / FULL_INDEX
    if not index_path.is_file():
        return safetensors.torch.load_file(str(folder / FULL_WEIGHTS))
    weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        state.update(safetensors.torch.load_file(str(folder / shard)))
    if set(state) != set(weight_map):
        missing = sorted(set(weight_map) - set(state))[:5]
        extra = sorted(set(state) - set(weight_map))[:5]
        raise ValueError(f"{index_path}: shards do not match the index (missing {missing}, unlisted {extra})")
    return state


def detect_kind(path: str | os.PathLike[str]) -> Kind:
    """``lora`` for an adapter folder, ``full`` for a state dict folder."""
    folder = Path(path)
    if (folder / ADAPTER_CONFIG).is_file():
        return "lora"
    if (folder / FULL_WEIGHTS).is_file() or (folder / FULL_INDEX).is_file():
        return "full"
    raise ValueError(f"{folder}: neither a peft adapter ({ADAPTER_CONFIG}) nor a state dict ({FULL_WEIGHTS})")


def storable(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous tensors that share no memory with each other (copies where they did); on the CPU
    the others are the tensors themselves, not copies."""
    seen: set[tuple[torch.device, int]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        t = tensor.detach()
        storage = (t.device, t.untyped_storage().data_ptr())
        if t.numel() and storage in seen:
            t = t.clone()
        seen.add(storage)
        out[name] = t.to("cpu").contiguous()
    return out


def _json_default(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"cannot write {type(value).__name__} into {ADAPTER_CONFIG}")
