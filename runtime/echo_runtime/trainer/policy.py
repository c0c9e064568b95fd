"""The trainable policy: the base model with a peft LoRA adapter (or all weights), its log-probs and snapshots.

Promises:

* The base model is loaded through :mod:`echo_runtime.models` (the one loading path of every part), in
  the manifest's dtype. ``finetune: LoRA`` wraps it with peft's ``LoraConfig(r, lora_alpha,
  lora_dropout, target_modules)`` from the manifest and trains only the adapter; ``Full`` trains every
  weight. The trainable parameters are exactly what a checkpoint stores.
* Log-probs follow the shared definition of :mod:`echo_runtime.backends.logprobs` — the same function
  the backends report behaviour log-probs with: ``log_softmax(logits.float() / T)`` gathered at the
  completion tokens, prompt and completion in one forward pass. Rows are right-padded, so a real
  token never sees padding (causal attention) and positions need no adjustment.
* The reference policy ``π_ref`` of the KL penalty is the base model: for LoRA the same network with the
  adapter disabled (no extra memory), for Full a frozen copy, made only when ``kl_coef > 0``.
* :meth:`TrainablePolicy.export_snapshot` writes what the backends apply
  (:mod:`echo_runtime.backends.snapshot_files`): a peft adapter directory (``adapter_config.json`` +
  ``adapter_model.safetensors``) for LoRA, the whole state dict as safetensors for Full;
  :meth:`TrainablePolicy.load_snapshot` reads it back bit-exactly (resuming from a published version).
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from echo_runtime.backends import logprobs as shared_logprobs
from echo_runtime.models import build as model_build
from echo_runtime.models import load as model_load
from echo_runtime.spec.policy import Model, Task
from echo_runtime.trainer.batch import Rollout

Finetune = Literal["LoRA", "Full"]


@dataclasses.dataclass(frozen=True)
class Packed:
    """A right-padded batch of prompt + completion rows and where each completion token is predicted."""

    input_ids: torch.Tensor
    """``[rows, length]``: prompt + completion, then padding."""
    positions: torch.Tensor
    """``[rows, completion]``: the logits position that predicts each completion token (``P + j − 1``)."""
    targets: torch.Tensor
    """``[rows, completion]``: the completion tokens (0 on padding)."""
    mask: torch.Tensor
    """``[rows, completion]``: 1.0 for a completion token, 0.0 for padding."""
    behaviour: torch.Tensor
    """``[rows, completion]``: behaviour log-probs (0.0 on padding)."""


def pack(rollouts: Sequence[Rollout], pad_id: int, device: torch.device | str = "cpu") -> Packed:
    """Right-pad ``prompt_ids + completion_ids`` of each rollout into one batch (pure)."""
    if not rollouts:
        raise ValueError("cannot pack an empty list of rollouts")
    length = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    width = max(len(r.completion_ids) for r in rollouts)
    rows = len(rollouts)
    input_ids = torch.full((rows, length), pad_id, dtype=torch.long)
    positions = torch.zeros((rows, width), dtype=torch.long)
    targets = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.float32)
    behaviour = torch.zeros((rows, width), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids[i, : p + c] = torch.tensor(r.prompt_ids + r.completion_ids, dtype=torch.long)
        positions[i, :c] = torch.arange(p - 1, p + c - 1)
        positions[i, c:] = p - 1  # any valid index: masked out
        targets[i, :c] = torch.tensor(r.completion_ids, dtype=torch.long)
        mask[i, :c] = 1.0
        behaviour[i, :c] = torch.tensor(r.logprobs, dtype=torch.float32)
    return Packed(
        input_ids=input_ids.to(device),
        positions=positions.to(device),
        targets=targets.to(device),
        mask=mask.to(device),
        behaviour=behaviour.to(device),
    )


def completion_logprobs(module: torch.nn.Module, packed: Packed, temperature: float) -> torch.Tensor:
    """``[rows, completion]`` log-probs of the completion tokens under ``module`` (one forward pass).

    ``module`` is a causal LM (or a peft / DDP wrapper around one) whose output has ``.logits``. Gradients
    flow unless the caller disables them. Values on padding are well defined but meaningless.
    """
    logits = module(input_ids=packed.input_ids, use_cache=False).logits
    index = packed.positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    window = logits.gather(1, index)
    return shared_logprobs.token_logprobs(window, packed.targets, temperature)


class TrainablePolicy:
    """A causal LM being trained: LoRA through peft, or all weights."""

    def __init__(self, model: Any, finetune: Finetune, pad_id: int, reference: Any | None = None) -> None:
        self.model = model
        """The trainable network (a ``PeftModel`` for LoRA); wrap it for DDP, never replace it."""
        self.finetune: Finetune = finetune
        self.pad_id = pad_id
        self._reference = reference

    @property
    def device(self) -> torch.device:
        device: torch.device = next(self.model.parameters()).device
        return device

    def named_trainable(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The parameters the optimizer updates, by name (tied weights once)."""
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                yield name, param

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.named_trainable()]

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the trainable parameters: what a checkpoint stores."""
        return {name: p.detach().to("cpu", copy=True).contiguous() for name, p in self.named_trainable()}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` (from :meth:`trainable_state`) into the parameters; the names must match exactly."""
        params = dict(self.named_trainable())
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not fit this policy ({self.finetune}): missing {missing[:3]}, "
                f"unexpected {unexpected[:3]} — was it written for another model or finetune mode?"
            )
        with torch.no_grad():
            for name, param in params.items():
                if tuple(state[name].shape) != tuple(param.shape):
                    raise ValueError(
                        f"checkpoint tensor {name} has shape {tuple(state[name].shape)}, expected {tuple(param.shape)}"
                    )
                param.copy_(state[name].to(param.dtype))

    @torch.no_grad()
    def reference_logprobs(self, packed: Packed, temperature: float) -> torch.Tensor:
        """Log-probs under ``π_ref`` (the base model), without gradients."""
        if self.finetune == "LoRA":
            with self.model.disable_adapter():
                return completion_logprobs(self.model, packed, temperature)
        if self._reference is None:
            raise RuntimeError("this policy was built without a reference copy (kl_coef was 0)")
        return completion_logprobs(self._reference, packed, temperature)

    @property
    def snapshot_kind(self) -> Literal["lora", "full"]:
        return "lora" if self.finetune == "LoRA" else "full"

    def export_snapshot(self, directory: str | Path) -> dict[str, Path]:
        """Write this version's snapshot files into ``directory``; return ``{name: file}`` to publish.

        LoRA: ``adapter_config.json`` + ``adapter_model.safetensors`` (peft's ``save_pretrained``). Full:
        the state dict as ``model.safetensors`` (sharded with an index when large), through
        :mod:`echo_runtime.snapshots.payloads`, the store's one definition of the payload files.
        """
        from echo_runtime.snapshots import payloads

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        if self.finetune == "LoRA":
            with model_build.quiet_progress(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                payloads.save_peft_adapter(self.model, out)
            names = [payloads.ADAPTER_CONFIG, payloads.ADAPTER_WEIGHTS]
            return {name: out / name for name in names}
        written = payloads.save_state_dict(self.model.state_dict(), out)
        return {path.name: path for path in written}

    def load_snapshot(self, directory: str | Path) -> None:
        """Set the trainable weights from a snapshot directory this policy exported (resuming)."""
        from echo_runtime.snapshots import payloads

        folder = Path(directory)
        if self.finetune == "LoRA":
            from peft import set_peft_model_state_dict

            adapter = payloads.load_lora_adapter(folder)
            result = set_peft_model_state_dict(self.model, adapter.tensors)
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            if unexpected:
                raise ValueError(f"snapshot {folder} has adapter weights this policy lacks: {unexpected[:3]}")
            return
        state = payloads.load_state_dict(folder)
        with torch.no_grad():
            self.model.load_state_dict(state, strict=True)


def lora_config(spec: Model) -> Any:
    """peft's ``LoraConfig`` for the manifest's ``model.lora``."""
    from peft import LoraConfig

    alpha: Any = spec.lora.alpha  # peft annotates int; the scale alpha / r is computed in float either way
    return LoraConfig(
        r=spec.lora.rank,
        lora_alpha=alpha,
        lora_dropout=spec.lora.dropout,
        target_modules=list(spec.lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def load_policy(
    spec: Model,
    task: Task | None = None,
    *,
    device: str = "cpu",
    with_reference: bool = False,
    model_dir: str | None = None,
) -> TrainablePolicy:
    """Load the base model of ``spec`` and make it trainable (LoRA or Full), in training mode.

    ``model_dir`` overrides the resolution of ``spec.path`` (a directory already resolved, e.g. by the
    caller on rank 0). ``with_reference`` keeps a frozen copy of the base for the KL penalty when
    fine-tuning all weights (LoRA needs none). LoRA's initial ``A`` matrices come from torch's global RNG:
    seed it first for a reproducible start.
    """
    path = model_dir if model_dir is not None else model_load.resolve_spec(spec, task)
    base = model_load.load_causal_lm(path, spec.dtype, device)
    pad_id = _pad_id(base)
    if spec.finetune == "LoRA":
        from peft import get_peft_model

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecations inside peft
            model = get_peft_model(base, lora_config(spec))
        model.train()
        return TrainablePolicy(model, "LoRA", pad_id)
    reference = None
    if with_reference:
        reference = copy.deepcopy(base).eval()
        for param in reference.parameters():
            param.requires_grad_(False)
    for param in base.parameters():
        param.requires_grad_(True)
    base.train()
    return TrainablePolicy(base, "Full", pad_id, reference)


def _pad_id(model: Any) -> int:
    """A token id to pad with (never attended to by real tokens, so any id in the vocabulary works)."""
    config = model.config
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int) and value >= 0:
            return value
    return 0
