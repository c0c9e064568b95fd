"""The one definition of a behaviour log-probability, in torch: shared by the backends and the trainer.

For a completion ``c`` of a prompt ``p`` at temperature ``T``, the log-prob of token ``c[i]`` is

    log_softmax(logits[len(p) + i - 1] / T)[c[i]]

where ``logits`` come from one forward pass over the concatenation ``p + c``, cast to float32 *before*
the division (so a bfloat16 model and its float32 copy differ only by the model's own rounding).
Top-p changes what can be sampled but is never folded into the log-prob. ``T`` must be positive.

It is computed as the chosen logit minus the log-sum-exp over the vocabulary, ``x[c] − logsumexp(x)``
with ``x = logits.float() / T``, a chunk of :data:`CHUNK_ELEMENTS` logits at a time, and under autograd
each chunk is checkpointed: neither a float32 copy of the logits nor a ``[tokens, vocab]`` log-softmax
is ever kept, which with a 152k-token vocabulary is gigabytes per micro-batch.

Promises:

* :func:`token_logprobs` is pure and elementwise over the leading dimensions: the trainer calls it on a
  padded batch, a backend on one row; both get the same numbers for the same logits.
* :func:`shifted_logprobs` is the trainer's form (every position predicts the next input token);
  :func:`completion_logprobs` the backends' form (one sequence, the completion positions only). They agree
  on the completion positions by construction: one calls the other's primitive on the same slice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def check_temperature(temperature: float) -> float:
    """``temperature`` as a float, or a ValueError: it must be a finite number greater than zero."""
    value = float(temperature)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return value


CHUNK_ELEMENTS = 1 << 24
"""Logits per chunk (64 MiB in float32): ~110 tokens of a 152k vocabulary, ~16k of a 1k one."""


def _chunk_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled = logits.float() / temperature
    chosen = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(scaled, dim=-1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits.float() / temperature)`` at ``targets``, chunked (see the module docstring).

    ``logits`` has shape ``[..., vocab]`` and ``targets`` the leading shape ``[...]``; the result is float32
    with the shape of ``targets``. Gradients flow to ``logits``.
    """
    from torch.utils.checkpoint import checkpoint

    temperature = check_temperature(temperature)
    shape = targets.shape
    vocab = logits.shape[-1]
    flat, ids = logits.reshape(-1, vocab), targets.reshape(-1).long()
    step = max(1, CHUNK_ELEMENTS // max(1, vocab))
    track = torch.is_grad_enabled() and flat.requires_grad
    parts: list[torch.Tensor] = []
    for start in range(0, flat.shape[0], step):
        chunk, chunk_ids = flat[start : start + step], ids[start : start + step]
        if track:
            part = checkpoint(_chunk_logprobs, chunk, chunk_ids, temperature, use_reentrant=False)
        else:
            part = _chunk_logprobs(chunk, chunk_ids, temperature)
        parts.append(part)
    if not parts:
        return torch.zeros(shape, dtype=torch.float32, device=logits.device)
    return torch.cat(parts).reshape(shape)


def full_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """The straightforward form, ``log_softmax(logits.float() / T).gather(targets)``, all at once.

    The same quantity as :func:`token_logprobs` (to float rounding); kept as the reference the tests and
    ``benchmarks/memory.py`` compare the chunked form with.
    """
    scaled = logits.float() / check_temperature(temperature)
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def shifted_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-prob of ``input_ids[:, 1:]`` under ``logits[:, :-1]``: shape ``[batch, seq - 1]``.

    Position ``j`` of the result is the log-prob of token ``j + 1`` given tokens ``0..j``. Mask out padding
    and prompt positions afterwards; the values there are well defined but meaningless.
    """
    return token_logprobs(logits[:, :-1, :], input_ids[:, 1:], temperature)


@torch.no_grad()
def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    temperature: float,
    device: torch.device | str = "cpu",
) -> list[float]:
    """Log-probs of ``completion_ids`` after ``prompt_ids`` under ``model``, from one unpadded forward pass.

    ``model`` is any causal LM whose output has ``.logits`` (``transformers``, or a peft wrapper around one).
    The prompt must hold at least one token: the first completion token needs a position to be predicted
    from.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token")
    if not completion_ids:
        return []
    check_temperature(temperature)
    ids = torch.tensor([[*prompt_ids, *completion_ids]], dtype=torch.long, device=device)
    logits = model(input_ids=ids).logits
    start = len(prompt_ids) - 1
    window = logits[0, start : start + len(completion_ids), :]
    return token_logprobs(window, ids[0, len(prompt_ids) :], temperature).tolist()
