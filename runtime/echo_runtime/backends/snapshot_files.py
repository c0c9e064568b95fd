"""Reading snapshot directories without any ML framework: which files, which LoRA layout, which scale.

A **LoRA snapshot** is a peft adapter directory, as ``PeftModel.save_pretrained`` writes it:
``adapter_config.json`` + ``adapter_model.safetensors`` with keys such as
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``.
A **full snapshot** is a directory of safetensors shard(s) of the whole state dict under Hugging Face
names, with ``model.safetensors.index.json`` when there is more than one shard.

Promises:

* :func:`read_lora_adapter` accepts exactly the adapters every backend can apply the same way: plain LoRA
  on linear layers (``lora_A``/``lora_B`` pairs), optionally rsLoRA and per-module rank/alpha patterns.
  Anything that changes the forward computation in other ways (DoRA, LoRA bias, ``fan_in_fan_out``,
  ``modules_to_save``, trainable tokens, embedding LoRA, layer replication, parameter targets) is a
  ValueError that names the setting, rather than a silently different policy.
* :attr:`LoraAdapter.layout` identifies everything about an adapter except its weight values: two
  adapters with equal layouts can be swapped by copying tensors into the same LoRA modules.
* :func:`full_weight_files` lists a full snapshot's shard files (from the index when there is one), and
  fails with the directory's name when there are none or the index names a missing file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

ADAPTER_CONFIG: Final = "adapter_config.json"
ADAPTER_WEIGHTS: Final = "adapter_model.safetensors"
FULL_INDEX: Final = "model.safetensors.index.json"
PEFT_PREFIX: Final = "base_model.model."

_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.(?P<adapter>[\w-]+))?\.weight$")

# adapter_config.json settings whose non-default value changes the forward pass beyond plain LoRA.
_UNSUPPORTED: Final[dict[str, Any]] = {
    "use_dora": False,
    "lora_bias": False,
    "fan_in_fan_out": False,
    "modules_to_save": None,
    "trainable_token_indices": None,
    "layer_replication": None,
    "target_parameters": None,
    "use_qalora": False,
    "alora_invocation_tokens": None,
}


@dataclasses.dataclass(frozen=True)
class LoraModule:
    """One adapted linear layer: ``y = W x + scaling * B (A x)``."""

    path: str
    """Module path in the base model, e.g. ``model.layers.0.self_attn.q_proj``."""
    rank: int
    scaling: float
    key_a: str
    """Key of ``A`` (``[rank, in_features]``) in ``adapter_model.safetensors``."""
    key_b: str
    """Key of ``B`` (``[out_features, rank]``) in ``adapter_model.safetensors``."""


@dataclasses.dataclass(frozen=True)
class LoraAdapter:
    """A peft LoRA adapter directory, parsed and checked."""

    path: Path
    config: Mapping[str, Any]
    modules: tuple[LoraModule, ...]

    @property
    def weights_file(self) -> Path:
        return self.path / ADAPTER_WEIGHTS

    @property
    def layout(self) -> tuple[tuple[str, int, float], ...]:
        """(module path, rank, scaling) of every adapted module, sorted: equal layouts swap in place."""
        return tuple(sorted((m.path, m.rank, m.scaling) for m in self.modules))

    @property
    def max_rank(self) -> int:
        return max(m.rank for m in self.modules)


def check_snapshot_dir(path: Path, kind: Literal["lora", "full"]) -> Path:
    """``path`` if it is a directory holding a snapshot of ``kind``, else an error naming what is missing."""
    if kind not in ("lora", "full"):
        raise ValueError(f"snapshot kind must be 'lora' or 'full', got {kind!r}")
    if not path.is_dir():
        raise FileNotFoundError(f"snapshot directory {path} does not exist")
    if kind == "lora":
        for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            if not (path / name).is_file():
                raise FileNotFoundError(
                    f"LoRA snapshot {path} has no {name} (a peft adapter directory needs both "
                    f"{ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})"
                )
    else:
        full_weight_files(path)
    return path


def full_weight_files(path: Path) -> list[Path]:
    """The safetensors shards of a full snapshot, in a stable order."""
    index = path / FULL_INDEX
    if index.is_file():
        data = json.loads(index.read_text(encoding="utf-8"))
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map")
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shard(s) missing from {path}: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"full snapshot {path} holds no *.safetensors file")
    return files


def module_path(peft_key: str) -> tuple[str, Literal["A", "B"]]:
    """``(module path in the base model, "A" | "B")`` of a peft LoRA tensor key; ValueError otherwise."""
    match = _LORA_KEY.match(peft_key)
    if match is None:
        raise ValueError(
            f"{peft_key!r} is not a LoRA A/B weight (embedding LoRA, biases and other extras "
            f"are not supported)"
        )
    module = match["module"]
    if module.startswith(PEFT_PREFIX):
        module = module[len(PEFT_PREFIX) :]
    which: Literal["A", "B"] = "A" if match["which"] == "A" else "B"
    return module, which


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """peft's rank/alpha pattern lookup: the first pattern that matches a dotted suffix of ``module``."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def scaling(alpha: float, rank: int, use_rslora: bool) -> float:
    """peft's LoRA scale: ``alpha / rank``, or ``alpha / sqrt(rank)`` with rsLoRA."""
    return alpha / math.sqrt(rank) if use_rslora else alpha / rank


def read_lora_adapter(path: Path, tensor_shapes: Mapping[str, Sequence[int]]) -> LoraAdapter:
    """Parse the peft adapter in ``path`` given its tensors' shapes (``{key: shape}``, read by the caller
    with whatever framework it uses, or by :func:`safetensors_shapes`)."""
    check_snapshot_dir(path, "lora")
    config = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{path / ADAPTER_CONFIG} is not a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise ValueError(f"{path}: only LoRA adapters are supported, got peft_type={peft_type!r}")
    for name, default in _UNSUPPORTED.items():
        value = config.get(name, default)
        if value not in (default, None, False, [], {}):
            raise ValueError(
                f"{path}: adapter_config.json sets {name}={value!r}; Echo's backends apply plain "
                f"LoRA on linear layers only, so {name} must be left at {default!r}"
            )
    if config.get("bias", "none") != "none":
        raise ValueError(
            f"{path}: adapter_config.json sets bias={config['bias']!r}; only 'none' is supported"
        )

    pairs: dict[str, dict[str, str]] = {}
    for key in tensor_shapes:
        module, which = module_path(key)
        pairs.setdefault(module, {})[which] = key
    if not pairs:
        raise ValueError(f"{path / ADAPTER_WEIGHTS} holds no LoRA weights")

    alpha = float(config.get("lora_alpha", 8))
    use_rslora = bool(config.get("use_rslora", False))
    rank_pattern = config.get("rank_pattern") or {}
    alpha_pattern = config.get("alpha_pattern") or {}
    modules = []
    for module, keys in sorted(pairs.items()):
        if set(keys) != {"A", "B"}:
            raise ValueError(
                f"{path}: module {module} has lora_{''.join(keys)} but not both lora_A and lora_B"
            )
        shape_a, shape_b = tuple(tensor_shapes[keys["A"]]), tuple(tensor_shapes[keys["B"]])
        if len(shape_a) != 2 or len(shape_b) != 2 or shape_a[0] != shape_b[1]:
            raise ValueError(f"{path}: module {module} has mismatched LoRA shapes A{shape_a} B{shape_b}")
        rank = int(shape_a[0])
        declared = int(_pattern_value(rank_pattern, module, config.get("r", rank)))
        if declared != rank:
            raise ValueError(
                f"{path}: module {module} has rank {rank} in its weights but {declared} in the config"
            )
        module_alpha = float(_pattern_value(alpha_pattern, module, alpha))
        modules.append(
            LoraModule(module, rank, scaling(module_alpha, rank, use_rslora), keys["A"], keys["B"])
        )
    return LoraAdapter(path=path, config=config, modules=tuple(modules))


def safetensors_shapes(file: Path) -> dict[str, list[int]]:
    """``{key: shape}`` of a safetensors file, from its JSON header alone (no tensor is read)."""
    with file.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        if size <= 0 or size > 100_000_000:
            raise ValueError(f"{file} is not a safetensors file (header size {size})")
        header = json.loads(handle.read(size))
    return {key: list(meta["shape"]) for key, meta in header.items() if key != "__metadata__"}
