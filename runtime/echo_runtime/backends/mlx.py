"""The ``mlx`` backend: mlx-lm on Apple Silicon (Metal) and, slowly but exactly, on Linux CPU.

Promises:

* **Same checkpoint, same numbers.** The base is the same Hugging Face directory the other backends read
  (``mlx_lm.utils.load_model``, told the RoPE base mlx-lm's Llama would miss: :func:`rope_overrides`);
  in float32 its log-probs match the ``transformers`` backend's within 1e-4 on the tiny model (measured
  ~1e-6), for the base, a LoRA snapshot and a full snapshot; on SmolLM2 the trainer's within 1.5e-4 a
  token (``docs/benchmarks/trust.md``), far below the log-prob check's bound.
* **LoRA is converted, not merged.** A peft adapter becomes mlx-lm's own LoRA format: each target
  ``nn.Linear`` is wrapped once in ``mlx_lm.tuner.lora.LoRALinear`` with peft's scale, and
  ``lora_a = A.T``, ``lora_b = B.T`` (mlx multiplies ``x @ lora_a @ lora_b``). That computes exactly
  peft's ``W x + s · B A x`` without touching the base weights, so switching versions copies two small
  matrices per module and the base is never reloaded (:attr:`MlxBackend.base_loads` stays 1). An adapter
  with a different layout re-wraps from the untouched base layers. :func:`save_mlx_adapter` writes the
  converted adapter as an ``mlx_lm`` adapter directory (``adapters.safetensors`` + ``adapter_config.json``)
  for use with mlx-lm's own tools.
* **Full snapshots** are copied into the model's parameters in place (through the model's ``sanitize``,
  which drops e.g. a tied ``lm_head.weight``). A LoRA snapshot after a full one reloads the base from disk,
  as in the ``transformers`` backend.
* **Sampling** is a KV-cached decoding loop. Rows (prompt × sample) are grouped by prompt length, so no
  row is ever padded and the model's standard causal cache applies to any mlx-lm architecture. The
  token is drawn from ``softmax(logits / T)`` within the top-p nucleus; the log-prob reported is
  ``log_softmax(logits / T)`` of the same float32 logits. ``params.seed`` fixes the samples via an
  explicit ``mx.random`` key (the global mlx RNG is not used).
* ``threads`` is accepted for interface symmetry and ignored: mlx picks its own CPU parallelism.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx  # type: ignore[import-not-found,import-untyped,unused-ignore]
from mlx.nn.layers.linear import Linear  # type: ignore[import-not-found,import-untyped,unused-ignore]
from mlx.nn.layers.quantized import QuantizedLinear  # type: ignore[import-not-found,import-untyped,unused-ignore]
from mlx.utils import tree_flatten, tree_unflatten  # type: ignore[import-not-found,import-untyped,unused-ignore]

from echo_runtime.backends import base, sampling, snapshot_files
from echo_runtime.models import prompts
from echo_runtime.models.prompts import Prompt
from echo_runtime.rollout import Rollout

_log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_ROWS = 64
"""Rows decoded together (rows of one prompt length); more are split into sequential chunks."""

_DTYPES: dict[str, Any] = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def detect_device() -> str:
    """``mps`` (the Metal GPU) when mlx sees one, else ``cpu``."""
    return "mps" if mx.metal.is_available() else "cpu"


def resolve_device(device: str) -> str:
    if device == "auto":
        return detect_device()
    if device == "cpu":
        return "cpu"
    if device == "mps":
        if not mx.metal.is_available():
            raise ValueError("device 'mps' was asked for but mlx sees no Metal GPU (use 'auto' or 'cpu')")
        return "mps"
    raise ValueError(f"the mlx backend runs on Apple Silicon ('mps') or CPU ('cpu'), got device {device!r}")


def dtype_name(dtype: Any) -> str:
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    return str(dtype).removeprefix("mlx.core.")


def log_softmax(logits: Any, temperature: float) -> Any:
    """``log_softmax(logits.float32 / temperature)`` over the last axis: the log-prob definition in mlx."""
    scaled = logits.astype(mx.float32) / temperature
    return scaled - mx.logsumexp(scaled, axis=-1, keepdims=True)


def top_p_filter(scaled: Any, top_p: float) -> Any:
    """``scaled`` logits with every token outside the top-p nucleus set to ``-inf`` (as in the torch
    backend: keep the most likely tokens while the mass before them is short of ``top_p``)."""
    if top_p >= 1.0:
        return scaled
    order = mx.argsort(-scaled, axis=-1)
    ordered = mx.take_along_axis(scaled, order, axis=-1)
    probs = mx.softmax(ordered, axis=-1)
    before = mx.cumsum(probs, axis=-1) - probs
    drop_sorted = before >= top_p
    keep_first = mx.arange(drop_sorted.shape[-1]) == 0
    drop_sorted = mx.logical_and(drop_sorted, mx.logical_not(keep_first))
    drop = mx.take_along_axis(drop_sorted, mx.argsort(order, axis=-1), axis=-1)
    return mx.where(drop, mx.array(float("-inf"), dtype=scaled.dtype), scaled)


def rope_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """What mlx-lm must be told of a ``config.json`` that transformers 5 wrote: RoPE settings live in
    ``rope_parameters`` there, while mlx-lm's Llama reads ``rope_theta`` (defaulting to 10000) and
    ``rope_scaling``. Without this a Llama trained with another base (SmolLM2: 100000) runs in mlx with
    the wrong positions, its log-probs tenths of a nat off the trainer's, and the trainer quarantines
    the honest worker. Empty when the config says ``rope_theta`` itself or has no ``rope_parameters``."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or "rope_theta" in config:
        return {}
    out: dict[str, Any] = {}
    if "rope_theta" in params:
        out["rope_theta"] = params["rope_theta"]
    if params.get("rope_type", "default") != "default" and "rope_scaling" not in config:
        out["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    return out


def load_safetensors(file: Path) -> dict[str, Any]:
    """``{key: mx.array}`` of a safetensors file (mlx reads bfloat16 natively)."""
    loaded: Any = mx.load(str(file))
    if not isinstance(loaded, dict):
        raise ValueError(f"{file} is not a safetensors file of named tensors")
    return loaded


def parameters(model: Any) -> dict[str, Any]:
    """``{dotted name: array}`` of a model's parameters."""
    flat: Any = tree_flatten(model.parameters())
    return dict(flat)


def convert_peft_adapter(adapter: snapshot_files.LoraAdapter, tensors: dict[str, Any]) -> dict[str, Any]:
    """peft tensors -> ``{"<module>.lora_a": A.T, "<module>.lora_b": B.T}`` (mlx-lm's LoRALinear names)."""
    converted: dict[str, Any] = {}
    for module in adapter.modules:
        converted[f"{module.path}.lora_a"] = mx.transpose(tensors[module.key_a])
        converted[f"{module.path}.lora_b"] = mx.transpose(tensors[module.key_b])
    return converted


def save_mlx_adapter(peft_dir: Path, out_dir: Path, num_layers: int) -> Path:
    """Write the peft adapter in ``peft_dir`` as an mlx-lm adapter directory (``mlx_lm.load(...,
    adapter_path=out_dir)`` then computes the same policy). mlx-lm's format has one rank, one scale and one
    set of per-layer keys for the last ``n`` layers, so adapters outside that shape are a ValueError."""
    tensors = load_safetensors(peft_dir / snapshot_files.ADAPTER_WEIGHTS)
    adapter = snapshot_files.read_lora_adapter(peft_dir, {k: list(v.shape) for k, v in tensors.items()})
    ranks = {m.rank for m in adapter.modules}
    scales = {m.scaling for m in adapter.modules}
    if len(ranks) != 1 or len(scales) != 1:
        raise ValueError(
            f"{peft_dir}: mlx-lm adapters need one rank and one scale, got ranks {sorted(ranks)} "
            f"and scales {sorted(scales)}"
        )
    placed: set[tuple[int, str]] = set()
    for module in adapter.modules:
        parts = module.path.split(".")
        at = parts.index("layers") if "layers" in parts else -1
        if at < 0 or at + 2 >= len(parts) or not parts[at + 1].isdigit():
            raise ValueError(f"{peft_dir}: {module.path} is not inside a numbered transformer layer")
        placed.add((int(parts[at + 1]), ".".join(parts[at + 2 :])))
    layers = {layer for layer, _ in placed}
    keys = {key for _, key in placed}
    if placed != {(layer, key) for layer in layers for key in keys} or layers != set(
        range(num_layers - len(layers), num_layers)
    ):
        raise ValueError(
            f"{peft_dir}: mlx-lm adapters adapt the same modules in each of the last n layers; "
            f"this adapter adapts layers {sorted(layers)} of {num_layers}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "adapters.safetensors"), convert_peft_adapter(adapter, tensors))
    config = {
        "fine_tune_type": "lora",
        "num_layers": len(layers),
        "lora_parameters": {"rank": ranks.pop(), "scale": scales.pop(), "dropout": 0.0, "keys": sorted(keys)},
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out_dir


class MlxBackend:
    """:class:`~echo_runtime.backends.base.Backend` on mlx-lm."""

    name = "mlx"

    def __init__(
        self,
        model_path: str | Path,
        device: str = "auto",
        dtype: str | None = None,
        threads: int | None = None,
        *,
        max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        prompt_style: prompts.PromptStyle | None = None,
    ) -> None:
        from echo_runtime.models import load as model_load
        from echo_runtime.models import resolve

        del threads  # mlx chooses its own CPU parallelism
        if dtype is not None and dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        self.model_path = Path(resolve.resolve_model(str(model_path)))
        self.device = resolve_device(device)
        self._stream_device = mx.gpu if self.device == "mps" else mx.cpu
        self._dtype_override = dtype
        self.max_batch_rows = max_batch_rows
        self.base_loads = 0
        """How many times the base model was read from disk (1 unless a LoRA followed a full snapshot)."""
        self.tokenizer: Any = model_load.load_tokenizer(str(self.model_path))
        self.eos_ids = sampling.eos_token_ids(self.model_path, self.tokenizer)
        self.prompt_style = prompt_style if prompt_style is not None else prompts.PromptStyle()
        """How prompts become ids (the job's ``task.promptFormat`` / ``systemPrompt``)."""
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.model: Any = self._load_base()
        self.dtype = dtype_name(self._param_dtype())
        # The base's structure, recorded once: snapshots are checked against it before anything changes.
        self._base_shapes = {k: tuple(v.shape) for k, v in parameters(self.model).items()}
        self._base_linears: dict[str, tuple[int, ...] | None] = {
            name: tuple(m.weight.shape) if isinstance(m, Linear) else None
            for name, m in self.model.named_modules()
            if isinstance(m, Linear | QuantizedLinear)
        }
        self._lora_layout: tuple[tuple[str, int, float], ...] | None = None
        self._lora_paths: list[str] = []
        self._base_modified = False
        self._version: int | None = None

    # -----------------------------------------------------------------------------------------------
    # Weights

    def _load_base(self) -> Any:
        from mlx_lm.utils import load_model  # type: ignore[import-not-found,import-untyped,unused-ignore]

        config = json.loads((Path(self.model_path) / "config.json").read_text(encoding="utf-8"))
        model, _config = load_model(self.model_path, lazy=False, model_config=rope_overrides(config))
        if self._dtype_override is not None:
            model.set_dtype(_DTYPES[self._dtype_override])
        model.eval()
        mx.eval(model.parameters())
        self.base_loads += 1
        return model

    def _param_dtype(self) -> Any:
        return next(iter(parameters(self.model).values())).dtype

    @property
    def loaded_version(self) -> int | None:
        return self._version

    def apply_snapshot(self, version: int, path: Path, kind: base.SnapshotKind) -> None:
        started = time.perf_counter()
        snapshot_files.check_snapshot_dir(Path(path), kind)
        with mx.stream(self._stream_device):
            if kind == "lora":
                self._apply_lora(Path(path))
            else:
                self._apply_full(Path(path))
        self._version = version
        _log.info(
            "applied %s snapshot v%d from %s in %.3f s", kind, version, path, time.perf_counter() - started
        )

    def _modules(self) -> dict[str, Any]:
        return dict(self.model.named_modules())

    def _unwrap(self) -> None:
        """Put the original linear layers back in place of the LoRA wrappers."""
        if not self._lora_paths:
            return
        modules = self._modules()
        self.model.update_modules(tree_unflatten([(p, modules[p].linear) for p in self._lora_paths]))
        self._lora_paths = []
        self._lora_layout = None

    def _check_lora(self, adapter: snapshot_files.LoraAdapter, tensors: dict[str, Any]) -> None:
        """Every adapted module is a linear layer of the base, with A/B shapes that fit it."""
        for module in adapter.modules:
            weight_shape = self._base_linears.get(module.path)
            if weight_shape is None:
                raise ValueError(
                    f"LoRA snapshot {adapter.path} adapts {module.path}, which is not a linear layer of the mlx "
                    f"model ({type(self.model).__module__})"
                )
            out_dim, in_dim = tensors[module.key_b].shape[0], tensors[module.key_a].shape[1]
            if weight_shape is not None and weight_shape != (out_dim, in_dim):
                raise ValueError(
                    f"LoRA snapshot {adapter.path}: {module.path} maps {in_dim} -> {out_dim} features, the "
                    f"model's layer has weight shape {weight_shape}"
                )

    def _wrap(self, adapter: snapshot_files.LoraAdapter) -> None:
        from mlx_lm.tuner.lora import LoRALinear  # type: ignore[import-not-found,import-untyped,unused-ignore]

        modules = self._modules()
        wrapped = [
            (m.path, LoRALinear.from_base(modules[m.path], r=m.rank, scale=m.scaling))
            for m in adapter.modules
        ]
        self.model.update_modules(tree_unflatten(wrapped))
        self._lora_paths = [m.path for m in adapter.modules]
        self._lora_layout = adapter.layout

    def _apply_lora(self, path: Path) -> None:
        # Everything that can be checked is checked before the model changes, so a bad snapshot leaves the
        # backend at its previous version.
        tensors = load_safetensors(path / snapshot_files.ADAPTER_WEIGHTS)
        adapter = snapshot_files.read_lora_adapter(path, {k: list(v.shape) for k, v in tensors.items()})
        self._check_lora(adapter, tensors)
        if self._base_modified:
            self._lora_paths = []
            self._lora_layout = None
            self.model = self._load_base()
            self._base_modified = False
        if adapter.layout != self._lora_layout:
            self._unwrap()
            self._wrap(adapter)
        current = parameters(self.model)
        updates = [(k, v.astype(current[k].dtype)) for k, v in convert_peft_adapter(adapter, tensors).items()]
        self.model.update(tree_unflatten(updates))
        mx.eval(self.model.parameters())

    def _apply_full(self, path: Path) -> None:
        weights: dict[str, Any] = {}
        for file in snapshot_files.full_weight_files(path):
            weights.update(load_safetensors(file))
        if hasattr(self.model, "sanitize"):
            weights = self.model.sanitize(weights)
        unexpected = sorted(set(weights) - set(self._base_shapes))
        if unexpected:
            raise ValueError(f"full snapshot {path} has tensors the model does not have: {unexpected[:5]}")
        missing = sorted(set(self._base_shapes) - set(weights))
        if missing:
            raise ValueError(f"full snapshot {path} lacks tensors of the model: {missing[:5]}")
        for key, value in weights.items():
            if tuple(value.shape) != self._base_shapes[key]:
                raise ValueError(
                    f"full snapshot {path}: {key} has shape {tuple(value.shape)}, the model's is "
                    f"{self._base_shapes[key]}"
                )
        self._unwrap()
        current = parameters(self.model)
        self.model.update(tree_unflatten([(k, v.astype(current[k].dtype)) for k, v in weights.items()]))
        mx.eval(self.model.parameters())
        self._base_modified = True

    # -----------------------------------------------------------------------------------------------
    # Log-probs and sampling

    def encode(self, prompt: Prompt) -> list[int]:
        """The prompt ids this backend samples from (:func:`echo_runtime.backends.sampling.encode_prompt`)."""
        return sampling.encode_prompt(self.tokenizer, prompt, self.prompt_style)

    def score_logprobs(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float
    ) -> list[float]:
        from echo_runtime.backends.logprobs import check_temperature

        if not prompt_ids:
            raise ValueError("prompt_ids must hold at least one token")
        if not completion_ids:
            return []
        temperature = check_temperature(temperature)
        with mx.stream(self._stream_device):
            ids = mx.array([[*prompt_ids, *completion_ids]])
            start = len(prompt_ids) - 1
            logits = self.model(ids)[0, start : start + len(completion_ids), :]
            logp = log_softmax(logits, temperature)
            chosen = mx.take_along_axis(logp, mx.array(list(completion_ids))[:, None], axis=-1)[:, 0]
            values: Any = chosen.tolist()
        return [float(v) for v in values]

    def sample(self, prompts: Sequence[Prompt], n: int, params: base.SamplingParams) -> list[list[Rollout]]:
        sampling.check_request(prompts, n, params)
        encoded = [self.encode(p) for p in prompts]
        by_length: dict[int, list[int]] = defaultdict(list)
        for row, ids in enumerate(ids for ids in encoded for _ in range(n)):
            by_length[len(ids)].append(row)
        results: dict[int, Rollout] = {}
        draws = sampling.seeded_rows(params.keys, len(prompts), n)
        with mx.stream(self._stream_device):
            key = mx.random.key(sampling.resolve_seed(params.seed))
            for length in sorted(by_length):
                rows = by_length[length]
                for start in range(0, len(rows), self.max_batch_rows):
                    chunk = rows[start : start + self.max_batch_rows]
                    key, sub = mx.random.split(key)
                    prompt_rows = [encoded[row // n] for row in chunk]
                    keyed = None if draws is None else [draws[row] for row in chunk]
                    tokens, values = self._decode(prompt_rows, params, sub, keyed)
                    for row, row_tokens, row_values in zip(chunk, tokens, values, strict=True):
                        results[row] = sampling.finish(
                            self.tokenizer, encoded[row // n], row_tokens, row_values, self.eos_ids
                        )
        return [[results[p * n + i] for i in range(n)] for p in range(len(prompts))]

    def _decode(
        self,
        rows: list[list[int]],
        params: base.SamplingParams,
        key: Any,
        keyed: list[tuple[int, int]] | None = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample up to ``max_new_tokens`` for equal-length rows; every row's stream, possibly past its EOS.
        ``keyed``: per row its ``(key, row in its group)`` for seeded draws (:mod:`.seeded`)."""
        from mlx_lm.models.cache import make_prompt_cache  # type: ignore[import-not-found,import-untyped,unused-ignore]

        cache = make_prompt_cache(self.model)
        eos = mx.array(sorted(self.eos_ids))
        done = mx.zeros((len(rows),), dtype=mx.bool_)
        logits = self.model(mx.array(rows), cache=cache)[:, -1, :]
        tokens: list[Any] = []
        values: list[Any] = []
        for step in range(params.max_new_tokens):
            logp = log_softmax(logits, params.temperature)
            scaled = top_p_filter(logits.astype(mx.float32) / params.temperature, params.top_p)
            if keyed is not None:  # the distribution mlx computes, drawn by the shared inverse CDF
                import numpy as np
                import torch

                from echo_runtime.backends import seeded

                probs = torch.from_numpy(np.array(mx.softmax(scaled, axis=-1), copy=True))
                u = seeded.uniforms([k for k, _ in keyed], [r for _, r in keyed], step)
                token = mx.array(seeded.draw(probs, u).numpy())
            else:
                key, sub = mx.random.split(key)
                token = mx.random.categorical(scaled, axis=-1, key=sub)
            chosen = mx.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
            done = mx.logical_or(done, mx.any(token[:, None] == eos[None, :], axis=-1))
            mx.eval(token, chosen, done)
            tokens.append(token)
            values.append(chosen)
            if bool(mx.all(done).item()) or step + 1 == params.max_new_tokens:
                break
            logits = self.model(token[:, None], cache=cache)[:, -1, :]
        token_rows: Any = mx.stack(tokens, axis=-1).tolist()
        value_rows: Any = mx.stack(values, axis=-1).tolist()
        return token_rows, value_rows
