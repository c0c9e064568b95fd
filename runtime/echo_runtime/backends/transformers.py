"""The ``transformers`` backend: any Hugging Face causal LM on CPU, CUDA or MPS — Echo's default.

Promises:

* **The base model is loaded once.** :attr:`TransformersBackend.base_loads` counts loads from disk; it
  stays 1 across any number of LoRA versions. The first LoRA snapshot wraps the base with peft (LoRA
  layers injected into the same module objects); later versions copy their tensors into those LoRA
  modules in place. Only an adapter with a different layout (other target modules, ranks or scales)
  re-wraps, and even then the base is unwrapped, not reloaded. A full snapshot copies its state dict into
  the base parameters in place. The one reload: a LoRA snapshot applied after a full snapshot needs the
  original base back (LoRA deltas are relative to it), so that case reads the base from disk again.
* **Exact behaviour log-probs.** Sampling is a hand-rolled KV-cached decoding loop over a left-padded batch
  (explicit position ids, so padding never shifts a row's positions). At every step the token is drawn
  from ``softmax(logits / T)`` restricted to the top-p nucleus, and the reported log-prob is
  :func:`echo_runtime.backends.logprobs.token_logprobs` of the *same* logits: the definition the trainer
  and :meth:`score_logprobs` use. Sampled log-probs equal re-scored ones up to float rounding (~1e-6 in
  float32; in bfloat16 the cached and uncached forward passes round differently, ~1e-3).
* **Batched:** all ``len(prompts) * n`` rows decode together, in chunks of at most ``max_batch_rows``.
  A completion stops at its first EOS; the batch stops when every row has.
* **Seeded:** a given ``params.seed`` fixes the samples of a call (same prompts, n, params, weights and
  device); sampling uses its own ``torch.Generator`` and leaves the global RNG alone.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from echo_runtime.backends import base, logprobs, sampling, seeded, snapshot_files
from echo_runtime.models import prompts
from echo_runtime.models.prompts import Prompt
from echo_runtime.rollout import Rollout

_log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_ROWS = 256
"""Rows (prompt × sample) decoded together; more are split into sequential chunks."""


def detect_device() -> str:
    """``cuda`` when torch sees a CUDA device, else ``mps`` on Apple Silicon, else ``cpu``."""
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def resolve_device(device: str) -> str:
    """``device`` with ``auto`` resolved; a ValueError naming the choices for anything unknown or absent."""
    if device == "auto":
        return detect_device()
    if device not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device must be one of auto, cpu, cuda, mps; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but torch sees no CUDA device (use 'auto' or 'cpu')")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device 'mps' was asked for but torch sees no Apple GPU (use 'auto' or 'cpu')")
    return device


class TransformersBackend:
    """:class:`~echo_runtime.backends.base.Backend` on ``transformers`` + ``peft``."""

    name = "transformers"

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

        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        self.model_path = Path(resolve.resolve_model(str(model_path)))
        self.device = resolve_device(device)
        self.dtype = dtype if dtype is not None else sampling.model_dtype(self.model_path)
        self.max_batch_rows = max_batch_rows
        self.base_loads = 0
        """How many times the base model was read from disk (1 unless a LoRA followed a full snapshot)."""
        self.tokenizer: Any = model_load.load_tokenizer(str(self.model_path))
        self.eos_ids = sampling.eos_token_ids(self.model_path, self.tokenizer)
        self.prompt_style = prompt_style if prompt_style is not None else prompts.PromptStyle()
        """How prompts become ids (the job's ``task.promptFormat`` / ``systemPrompt``)."""
        self.pad_id = int(self.tokenizer.pad_token_id)
        self._model_load = model_load
        self.base_model: torch.nn.Module = self._load_base()
        # The base's structure, recorded once: snapshots are checked against it before anything changes.
        self._base_shapes = {k: tuple(v.shape) for k, v in self.base_model.state_dict().items()}
        self._alias_groups = _alias_groups(self.base_model)
        self._base_linears = {
            name: (module.out_features, module.in_features)
            for name, module in self.base_model.named_modules()
            if isinstance(module, torch.nn.Linear)
        }
        self._peft: Any = None
        self._lora_layout: tuple[tuple[str, int, float], ...] | None = None
        self._base_modified = False
        self._version: int | None = None

    # -----------------------------------------------------------------------------------------------
    # Weights

    def _load_base(self) -> torch.nn.Module:
        model: torch.nn.Module = self._model_load.load_causal_lm(
            str(self.model_path), self.dtype, self.device
        )
        model.requires_grad_(False)
        self.base_loads += 1
        return model

    @property
    def model(self) -> torch.nn.Module:
        """The module a forward pass goes through: the peft wrapper when a LoRA is applied, else the base."""
        return self._peft if self._peft is not None else self.base_model

    @property
    def loaded_version(self) -> int | None:
        return self._version

    def apply_snapshot(self, version: int, path: Path, kind: base.SnapshotKind) -> None:
        started = time.perf_counter()
        snapshot_files.check_snapshot_dir(Path(path), kind)
        if kind == "lora":
            self._apply_lora(Path(path))
        else:
            self._apply_full(Path(path))
        self._version = version
        _log.info(
            "applied %s snapshot v%d from %s in %.3f s", kind, version, path, time.perf_counter() - started
        )

    def _unwrap(self) -> None:
        if self._peft is not None:
            self.base_model = self._peft.base_model.unload()
            self._peft = None
            self._lora_layout = None

    def _apply_lora(self, path: Path) -> None:
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
        from safetensors.torch import load_file

        # Everything that can be checked is checked before the model changes, so a bad snapshot leaves the
        # backend at its previous version.
        shapes = snapshot_files.safetensors_shapes(path / snapshot_files.ADAPTER_WEIGHTS)
        adapter = snapshot_files.read_lora_adapter(path, shapes)
        for module in adapter.modules:
            features = self._base_linears.get(module.path)
            if features is None:
                raise ValueError(
                    f"LoRA snapshot {path} adapts {module.path}, which is not a linear layer of the model"
                )
            lora_features = (shapes[module.key_b][0], shapes[module.key_a][1])
            if lora_features != features:
                raise ValueError(
                    f"LoRA snapshot {path}: {module.path} maps {lora_features[1]} -> {lora_features[0]} features, "
                    f"the model's layer maps {features[1]} -> {features[0]}"
                )
        weights = load_file(str(adapter.weights_file), device=self.device)
        if self._base_modified:
            # A full snapshot overwrote the base in place; LoRA deltas are relative to the original.
            self._unwrap()
            self.base_model = self._load_base()
            self._base_modified = False
        if self._peft is None or adapter.layout != self._lora_layout:
            self._unwrap()
            config = LoraConfig.from_pretrained(str(path))
            config.inference_mode = True
            # The adapter may name another copy of the base; it applies to this one (no peft warning).
            config.base_model_name_or_path = getattr(self.base_model, "name_or_path", None)
            with warnings.catch_warnings():
                # peft probes a deprecated transformers attribute; nothing for a user to act on.
                warnings.simplefilter("ignore", FutureWarning)
                self._peft = get_peft_model(self.base_model, config)
            self._peft.eval()
            self._lora_layout = adapter.layout
            wrapped = {
                name.removeprefix(snapshot_files.PEFT_PREFIX).removesuffix(".lora_A")
                for name, _ in self._peft.named_modules()
                if name.endswith(".lora_A")
            }
            if wrapped != {m.path for m in adapter.modules}:
                extra = sorted(wrapped - {m.path for m in adapter.modules})
                self._unwrap()
                raise ValueError(
                    f"LoRA snapshot {path}: target_modules adapt layers without weights in the "
                    f"adapter file, e.g. {extra[:3]}"
                )
        result = set_peft_model_state_dict(self._peft, weights)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise ValueError(f"LoRA snapshot {path} has weights the model does not have: {unexpected[:5]}")

    def _apply_full(self, path: Path) -> None:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for file in snapshot_files.full_weight_files(path):
            state.update(load_file(str(file), device=self.device))
        unexpected = sorted(set(state) - set(self._base_shapes))
        if unexpected:
            raise ValueError(
                f"full snapshot {path} has tensors the model does not have: {unexpected[:5]} "
                f"(expected Hugging Face names such as {next(iter(self._base_shapes))!r})"
            )
        missing = sorted(min(group) for group in self._alias_groups if not group & state.keys())
        if missing:
            raise ValueError(f"full snapshot {path} lacks tensors of the model: {missing[:5]}")
        for key, tensor in state.items():
            if tuple(tensor.shape) != self._base_shapes[key]:
                raise ValueError(
                    f"full snapshot {path}: {key} has shape {tuple(tensor.shape)}, "
                    f"the model's is {self._base_shapes[key]}"
                )
        self._unwrap()
        with torch.no_grad():
            self.base_model.load_state_dict(state, strict=False)
        self._base_modified = True

    # -----------------------------------------------------------------------------------------------
    # Log-probs and sampling

    def encode(self, prompt: Prompt) -> list[int]:
        """The prompt ids this backend samples from (:func:`echo_runtime.backends.sampling.encode_prompt`)."""
        return sampling.encode_prompt(self.tokenizer, prompt, self.prompt_style)

    def score_logprobs(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float
    ) -> list[float]:
        return logprobs.sequence_logprobs(self.model, prompt_ids, completion_ids, temperature, self.device)

    def sample(self, prompts: Sequence[Prompt], n: int, params: base.SamplingParams) -> list[list[Rollout]]:
        sampling.check_request(prompts, n, params)
        encoded = [self.encode(p) for p in prompts]
        rows = [ids for ids in encoded for _ in range(n)]
        draws = sampling.seeded_rows(params.keys, len(prompts), n)
        generator = self._generator(sampling.resolve_seed(params.seed))
        flat: list[Rollout] = []
        for start in range(0, len(rows), self.max_batch_rows):
            chunk = rows[start : start + self.max_batch_rows]
            keyed = None if draws is None else draws[start : start + self.max_batch_rows]
            tokens, values = self._decode(chunk, params, generator, keyed)
            for prompt_ids, row_tokens, row_values in zip(chunk, tokens, values, strict=True):
                flat.append(sampling.finish(self.tokenizer, prompt_ids, row_tokens, row_values, self.eos_ids))
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generator(self, seed: int) -> torch.Generator:
        # MPS generators are not available on every torch build; sampling there draws on the CPU.
        device = "cuda" if self.device == "cuda" else "cpu"
        return torch.Generator(device=device).manual_seed(seed)

    @torch.no_grad()
    def _decode(
        self,
        rows: list[list[int]],
        params: base.SamplingParams,
        generator: torch.Generator,
        keyed: list[tuple[int, int]] | None = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample up to ``max_new_tokens`` for each row; every row's stream, possibly past its EOS.
        ``keyed``: per row its ``(key, row in its group)`` for seeded draws (:mod:`.seeded`)."""
        from transformers import DynamicCache

        model = self.model
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        eos = torch.tensor(sorted(self.eos_ids), device=self.device)
        done = torch.zeros(len(rows), dtype=torch.bool, device=self.device)
        cache = DynamicCache(config=getattr(self.base_model, "config", None))
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        tokens: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for step in range(params.max_new_tokens):
            logits = out.logits[:, -1, :].float()
            probs = seeded.distribution(logits, params.temperature, params.top_p)
            if keyed is not None:
                u = seeded.uniforms([k for k, _ in keyed], [r for _, r in keyed], step)
                token = seeded.draw(probs, u).to(self.device)
            else:
                if probs.device.type != generator.device.type:
                    probs = probs.to(generator.device)
                token = torch.multinomial(probs, 1, generator=generator).to(self.device).squeeze(-1)
            tokens.append(token)
            values.append(logprobs.token_logprobs(logits, token, params.temperature))
            done |= torch.isin(token, eos)
            if bool(done.all()) or step + 1 == params.max_new_tokens:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            positions = positions[:, -1:] + 1
            out = model(
                input_ids=token.unsqueeze(-1),
                attention_mask=mask,
                position_ids=positions,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
        token_rows = torch.stack(tokens, dim=-1).cpu().tolist()
        value_rows = torch.stack(values, dim=-1).cpu().tolist()
        return token_rows, value_rows


def _alias_groups(model: torch.nn.Module) -> list[set[str]]:
    """State-dict keys grouped by the tensor they name: a tied ``lm_head.weight`` shares a group with
    ``model.embed_tokens.weight``, and a snapshot need only hold one key of each group."""
    groups: dict[int, set[str]] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), set()).add(key)
    return list(groups.values())
