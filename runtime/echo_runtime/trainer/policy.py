"""The trainable policy: the base model with a peft LoRA adapter (or all weights), its log-probs and snapshots.

Promises:

* The base model is loaded through :mod:`echo_runtime.models` (the one loading path of every part), in
  the manifest's dtype. ``finetune: LoRA`` wraps it with peft's ``LoraConfig(r, lora_alpha,
  lora_dropout, target_modules)`` from the manifest and trains only the adapter; ``Full`` trains every
  weight. The trainable parameters are exactly what a checkpoint stores.
* Log-probs follow the shared definition of :mod:`echo_runtime.backends.logprobs` — the same function
  the backends report behaviour log-probs with: ``log_softmax(logits.float() / T)`` at the completion
  tokens, prompt and completion in one forward pass. **Selectively**: prompts are left-padded so that
  every row's completion starts at the same column (an attention mask hides the padding, explicit
  position ids keep each row's positions what they are unpadded, as the backends sample), and the model
  is asked for the logits of the positions that predict a real completion token and no others
  (``logits_to_keep`` as a boolean ``[rows, length]`` mask, transformers 5: ``[tokens, vocab]`` logits,
  no padding rows); the log-softmax is then taken a chunk at a time
  (:func:`~echo_runtime.backends.logprobs.token_logprobs`). The ``[rows, length, vocab]`` logits, a
  gathered copy and a float32 log-softmax copy are never made: ``benchmarks/memory.py`` measures the
  difference on a 152k vocabulary.
* ``algorithm.gradientCheckpointing`` recomputes the decoder's activations in the backward pass
  (transformers' non-reentrant checkpointing); in bfloat16/float16 on a device that supports it, the
  forward runs under ``torch.autocast`` so that norms and softmaxes the framework keeps in float32 stay
  there.
* The reference policy ``π_ref`` of the KL penalty is the base model: for LoRA the same network with the
  adapter disabled (no extra memory), for Full a frozen copy, made only when ``kl_coef > 0``.
* :meth:`TrainablePolicy.export_snapshot` writes what the backends apply
  (:mod:`echo_runtime.backends.snapshot_files`): a peft adapter directory (``adapter_config.json`` +
  ``adapter_model.safetensors``) for LoRA, the whole state dict as safetensors for Full;
  :meth:`TrainablePolicy.load_snapshot` reads it back bit-exactly (resuming from a published version).
"""

from __future__ import annotations

import contextlib
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
from echo_runtime.rollout import Rollout
from echo_runtime.spec.policy import Model, Task

Finetune = Literal["LoRA", "Full"]


@dataclasses.dataclass(frozen=True)
class Packed:
    """A batch of prompt + completion rows whose completions all start at column ``start``."""

    input_ids: torch.Tensor
    """``[rows, start + completion]``: left padding, prompt, completion, right padding."""
    attention_mask: torch.Tensor
    """``[rows, start + completion]``: 1 on prompt and completion tokens, 0 on padding."""
    position_ids: torch.Tensor
    """``[rows, start + completion]``: each token's position in its own unpadded sequence."""
    start: int
    """The column of every row's first completion token (the longest prompt's length)."""
    keep: torch.Tensor
    """``[rows, start + completion]`` bool: the positions whose logits predict a completion token."""
    targets: torch.Tensor
    """``[rows, completion]``: the completion tokens (0 on padding)."""
    mask: torch.Tensor
    """``[rows, completion]``: 1.0 for a model token of the completion, 0.0 for padding and for an
    environment's tokens (:attr:`echo_runtime.rollout.Rollout.loss_mask`)."""
    behaviour: torch.Tensor
    """``[rows, completion]``: behaviour log-probs (0.0 on padding)."""


def pack(rollouts: Sequence[Rollout], pad_id: int, device: torch.device | str = "cpu") -> Packed:
    """Left-pad the prompts and right-pad the completions of ``rollouts`` into one batch (pure)."""
    if not rollouts:
        raise ValueError("cannot pack an empty list of rollouts")
    start = max(len(r.prompt_ids) for r in rollouts)
    width = max(len(r.completion_ids) for r in rollouts)
    rows = len(rollouts)
    input_ids = torch.full((rows, start + width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, start + width), dtype=torch.long)
    keep = torch.zeros((rows, start + width), dtype=torch.bool)
    targets = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.float32)
    behaviour = torch.zeros((rows, width), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids[i, start - p : start + c] = torch.tensor(r.prompt_ids + r.completion_ids, dtype=torch.long)
        attention[i, start - p : start + c] = 1
        keep[i, start - 1 : start - 1 + c] = True
        targets[i, :c] = torch.tensor(r.completion_ids, dtype=torch.long)
        # An environment's ids in an episode are context, not actions: loss mask 0, no log-prob.
        mask[i, :c] = torch.tensor(r.loss_mask, dtype=torch.float32) if r.kinds else 1.0
        behaviour[i, :c] = torch.tensor(r.token_logprobs, dtype=torch.float32)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return Packed(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=position_ids.to(device),
        start=start,
        keep=keep.to(device),
        targets=targets.to(device),
        mask=mask.to(device),
        behaviour=behaviour.to(device),
    )


def autocast(module: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` in the module's half-precision dtype where the device supports it, else nothing."""
    param = next(module.parameters(), None)
    if param is None or param.dtype not in (torch.bfloat16, torch.float16):
        return contextlib.nullcontext()
    kind = param.device.type
    if kind == "cuda" and (param.dtype == torch.float16 or torch.cuda.is_bf16_supported()):
        return torch.autocast("cuda", dtype=param.dtype)
    if kind == "cpu" and param.dtype == torch.bfloat16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def completion_logits(module: torch.nn.Module, packed: Packed) -> torch.Tensor:
    """``[tokens, vocab]``: the logits that predict each real completion token (row by row), no others."""
    with autocast(module):
        out = module(
            input_ids=packed.input_ids,
            attention_mask=packed.attention_mask,
            position_ids=packed.position_ids,
            use_cache=False,
            logits_to_keep=packed.keep,
        )
    logits: torch.Tensor = out.logits
    tokens = int(packed.keep.sum())
    if logits.dim() != 2 or logits.shape[0] != tokens:
        raise RuntimeError(
            f"{type(module).__name__} ignored a boolean logits_to_keep (logits {tuple(logits.shape)}, expected "
            f"({tokens}, vocab)); the trainer needs a transformers causal LM that supports it (transformers ≥ 5)"
        )
    return logits


def completion_logprobs(module: torch.nn.Module, packed: Packed, temperature: float) -> torch.Tensor:
    """``[rows, completion]`` log-probs of the completion tokens under ``module`` (one forward pass).

    ``module`` is a causal LM (or a peft / DDP wrapper around one) that takes ``logits_to_keep`` and whose
    output has ``.logits``. Gradients flow unless the caller disables them. Values on padding are 0.
    """
    mask = packed.mask.bool()
    logits = completion_logits(module, packed)  # read by nothing else: its storage can take the gradient
    values = shared_logprobs.token_logprobs(logits, packed.targets[mask], temperature, in_place=True)
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)


def completion_logprobs_entropy(
    module: torch.nn.Module, packed: Packed, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`completion_logprobs` and each completion position's entropy (``[rows, completion]``, 0 on
    padding), from the same forward pass; gradients flow from both."""
    mask = packed.mask.bool()
    logits = completion_logits(module, packed)
    values, entropy = shared_logprobs.token_logprobs_entropy(
        logits, packed.targets[mask], temperature, in_place=True
    )
    blank = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
    return blank.masked_scatter(mask, values), blank.clone().masked_scatter(mask, entropy)


def full_logits_logprobs(module: torch.nn.Module, packed: Packed, temperature: float) -> torch.Tensor:
    """The same log-probs the naive way: every position's logits, a gathered window, one log-softmax.

    What the trainer did before the selective form (the same gather and float32 log-softmax);
    ``benchmarks/memory.py`` and the tests compare the two.
    """
    with autocast(module):
        logits = module(
            input_ids=packed.input_ids,
            attention_mask=packed.attention_mask,
            position_ids=packed.position_ids,
            use_cache=False,
        ).logits
    width = packed.targets.shape[1]
    positions = torch.arange(packed.start - 1, packed.start - 1 + width, device=logits.device)
    index = positions.expand(logits.shape[0], -1).unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    window = logits.gather(1, index)
    values = shared_logprobs.full_logprobs(window, packed.targets, temperature)
    return values * packed.mask


STREAM_SHARD_BYTES = 512 * 1024**2
"""File size of a sharded Full snapshot (:meth:`TrainablePolicy.export_full_streamed`): what a rank
holds whole at most while it is written."""


class TrainablePolicy:
    """A causal LM being trained: LoRA through peft, or all weights."""

    def __init__(self, model: Any, finetune: Finetune, pad_id: int, reference: Any | None = None) -> None:
        self.model = model
        """The trainable network (a ``PeftModel`` for LoRA); wrap it for DDP, never replace it."""
        self.finetune: Finetune = finetune
        self.pad_id = pad_id
        self._reference = reference

    @property
    def reference(self) -> Any | None:
        """The frozen copy of the base for the KL term of full fine-tuning (None for LoRA, whose
        reference is the same network with its adapter off, or without a KL term)."""
        return self._reference

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

    @property
    def sharded(self) -> bool:
        """Whether FSDP shards the parameters (DTensors): reading or setting whole ones is then a
        collective every rank takes part in, in the same order."""
        return any(hasattr(p, "full_tensor") for p in self.model.parameters())

    def gathered_trainable_state(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """The whole trainable parameters as CPU tensors (:meth:`trainable_state`'s names and values, also
        when sharded). Sharded, every rank must call it: each parameter is all-gathered in turn, so no
        rank holds more than one whole parameter beyond what it keeps; ranks with ``keep`` False return
        an empty dict."""
        if not self.sharded:
            return self.trainable_state() if keep else {}
        out: dict[str, torch.Tensor] = {}
        for name, param in self.named_trainable():
            whole = param.detach().full_tensor()  # type: ignore[attr-defined]
            if keep:
                out[name] = whole.to("cpu", copy=True).contiguous()
            del whole
        return out

    def gathered_model_state(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """``model.state_dict()`` with whole tensors on CPU (a Full snapshot), gathered from the shards
        when sharded (every rank calls; those without ``keep`` get an empty dict)."""
        if not self.sharded:
            return dict(self.model.state_dict()) if keep else {}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(
            self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        return (
            {name: value for name, value in state.items() if isinstance(value, torch.Tensor)} if keep else {}
        )

    def export_full_streamed(
        self, directory: str | Path | None, max_shard_bytes: int | None = None
    ) -> dict[str, Path]:
        """A sharded Full policy's snapshot, gathered one file's tensors at a time (every rank calls;
        ``directory`` None on the ranks that write nothing): the files of :meth:`export_snapshot`, in
        files of at most ``max_shard_bytes`` with an index, so that no rank holds more than one file's
        whole tensors on top of its shards."""
        from echo_runtime.snapshots import payloads

        state = self.model.state_dict()  # the ranks' shards (DTensors): nothing gathered yet
        sizes = [(name, t.numel() * t.element_size()) for name, t in state.items()]

        def fetch(name: str) -> torch.Tensor:
            value = state[name].detach()
            gather = getattr(value, "full_tensor", None)
            whole: torch.Tensor = gather() if gather is not None else value
            return whole.to("cpu")

        limit = max_shard_bytes if max_shard_bytes is not None else STREAM_SHARD_BYTES
        written = payloads.save_state_dict_streamed(sizes, fetch, directory, max_shard_bytes=limit)
        return {path.name: path for path in written}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` (from :meth:`trainable_state`) into the parameters; the names must match exactly.

        Sharded parameters take either their own shards (a DTensor, as :meth:`trainable_state` returns
        them then) or whole tensors, which rank 0's copy scatters to every rank (a collective: every rank
        calls, the other ranks' values need only the right shape)."""
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
                value = state[name].to(param.dtype)
                if hasattr(param, "full_tensor") and not hasattr(value, "full_tensor"):
                    from torch.distributed.tensor import distribute_tensor

                    placed = value.to(param.device)
                    value = distribute_tensor(placed, param.device_mesh, param.placements)  # type: ignore[attr-defined]
                param.copy_(value)

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

    def export_snapshot(
        self, directory: str | Path, state: dict[str, torch.Tensor] | None = None
    ) -> dict[str, Path]:
        """Write this version's snapshot files into ``directory``; return ``{name: file}`` to publish.

        LoRA: ``adapter_config.json`` + ``adapter_model.safetensors`` (peft's ``save_pretrained``). Full:
        the state dict as ``model.safetensors`` (sharded with an index when large), through
        :mod:`echo_runtime.snapshots.payloads`, the store's one definition of the payload files.
        ``state``: the whole tensors to write when the parameters are sharded — the trainable ones for
        LoRA (:meth:`gathered_trainable_state`), the model's for Full (:meth:`gathered_model_state`).
        """
        from echo_runtime.snapshots import payloads

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        if self.finetune == "LoRA":
            with model_build.quiet_progress(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                payloads.save_peft_adapter(self.model, out, state)
            names = [payloads.ADAPTER_CONFIG, payloads.ADAPTER_WEIGHTS]
            return {name: out / name for name in names}
        written = payloads.save_state_dict(state if state is not None else self.model.state_dict(), out)
        return {path.name: path for path in written}

    def snapshot_trainable_state(self, directory: str | Path) -> dict[str, torch.Tensor]:
        """A snapshot directory this policy exported, read as :meth:`trainable_state` names its tensors,
        without touching the model (sharded, every rank reads it and keeps its shards: :meth:`load_snapshot`)."""
        from echo_runtime.snapshots import payloads

        folder = Path(directory)
        names = [name for name, _ in self.named_trainable()]
        if self.finetune == "LoRA":
            from peft import get_peft_model_state_dict

            # peft's file names for our parameters: map each parameter to the name peft saves it under.
            params = dict(self.named_trainable())
            saved = get_peft_model_state_dict(self.model, state_dict=params)
            by_tensor = {id(tensor): key for key, tensor in saved.items()}
            files = payloads.load_lora_adapter(folder).tensors
            out = {
                name: files[by_tensor[id(p)]] for name, p in params.items() if by_tensor.get(id(p)) in files
            }
        else:
            full = payloads.load_state_dict(folder)
            out = {name: full[name] for name in names if name in full}
        missing = [name for name in names if name not in out]
        if missing:
            raise ValueError(f"snapshot {folder} lacks weights this policy trains: {missing[:3]}")
        return out

    def load_snapshot(self, directory: str | Path) -> None:
        """Set the trainable weights from a snapshot directory this policy exported (resuming). Sharded,
        every rank calls it with the same snapshot at hand and keeps its shards (a collective)."""
        from echo_runtime.snapshots import payloads

        folder = Path(directory)
        if self.sharded:
            self.load_trainable_state(self.snapshot_trainable_state(folder))
            return
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
    gradient_checkpointing: bool = False,
) -> TrainablePolicy:
    """Load the base model of ``spec`` and make it trainable (LoRA or Full), in training mode.

    ``model_dir`` overrides the resolution of ``spec.path`` (a directory already resolved, e.g. by the
    caller on rank 0). ``with_reference`` keeps a frozen copy of the base for the KL penalty when
    fine-tuning all weights (LoRA needs none). ``gradient_checkpointing`` is ``algorithm.gradientCheckpointing``. LoRA's initial ``A`` matrices come from torch's global RNG:
    seed it first for a reproducible start.
    """
    path = model_dir if model_dir is not None else model_load.resolve_spec(spec, task)
    base = model_load.load_causal_lm(path, spec.dtype, device)
    pad_id = _pad_id(base)
    if gradient_checkpointing:
        # transformers 5.x renamed it activation checkpointing (the old name warns and goes in v6).
        if hasattr(base, "activation_checkpointing_enable"):
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
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
