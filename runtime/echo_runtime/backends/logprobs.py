"""The one definition of a behaviour log-probability, in torch: shared by the backends and the trainer.

For a completion ``c`` of a prompt ``p`` at temperature ``T``, the log-prob of token ``c[i]`` is

    log_softmax(logits[len(p) + i - 1] / T)[c[i]]

where ``logits`` come from one forward pass over the concatenation ``p + c``, cast to float32 *before*
the division (so a bfloat16 model and its float32 copy differ only by the model's own rounding).
Top-p changes what can be sampled but is never folded into the log-prob. ``T`` must be positive.

It is computed as the chosen logit minus the log-sum-exp over the vocabulary, ``x[c] − logsumexp(x)``
with ``x = logits.float() / T``, a chunk of :data:`CHUNK_ELEMENTS` logits at a time. Under autograd a
custom function keeps only the logits and one log-sum-exp per token, and its backward writes the
gradient ``(onehot(c) − softmax(x)) / T`` chunk by chunk into one buffer the size of the logits — or,
with ``in_place=True`` (the trainer, whose logits feed nothing else), into the logits' own storage:
neither a float32 copy of the logits nor a ``[tokens, vocab]`` log-softmax nor a per-chunk full-size
gradient is ever made, which with a 152k-token vocabulary is gigabytes per micro-batch.

Promises:

* :func:`token_logprobs` is pure and elementwise over the leading dimensions: the trainer calls it on a
  padded batch, a backend on one row; both get the same numbers for the same logits.
* :func:`shifted_logprobs` is the trainer's form (every position predicts the next input token);
  :func:`sequence_logprobs` the backends' form (one sequence, the completion positions only). They agree
  on the completion positions by construction: one calls the other's primitive on the same slice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


def check_temperature(temperature: float) -> float:
    """``temperature`` as a float, or a ValueError: it must be a finite number greater than zero."""
    value = float(temperature)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return value


CHUNK_ELEMENTS = 1 << 24
"""Logits per chunk (64 MiB in float32): ~110 tokens of a 152k vocabulary, ~16k of a 1k one."""


def _forward(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log-probs, log-sum-exps)`` of ``[tokens, vocab]`` logits, a chunk of ``step`` tokens at a time."""
    values = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(values)
    for start in range(0, logits.shape[0], step):
        scaled = logits[start : start + step].float() / temperature
        chunk_lse = torch.logsumexp(scaled, dim=-1)
        chosen = scaled.gather(-1, targets[start : start + step].unsqueeze(-1)).squeeze(-1)
        values[start : start + step] = chosen - chunk_lse
        lse[start : start + step] = chunk_lse
    return values, lse


class _ChunkedLogProbs(torch.autograd.Function):
    """Chunked ``log_softmax(x / T)[c]`` whose backward fills one gradient buffer chunk by chunk."""

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, temperature: float, step: int, in_place: bool
    ) -> torch.Tensor:
        values, lse = _forward(logits, targets, temperature, step)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.step, ctx.in_place = temperature, step, in_place
        return values

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        # Each chunk is read before it is overwritten, so the logits' storage can take the gradient.
        out = logits.detach() if ctx.in_place else torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.step):
            stop = start + ctx.step
            g = grad[start:stop].float().unsqueeze(-1)
            probs = torch.exp(logits[start:stop].float() / ctx.temperature - lse[start:stop].unsqueeze(-1))
            chunk = -probs * g
            chunk.scatter_add_(-1, targets[start:stop].unsqueeze(-1), g)
            out[start:stop] = (chunk / ctx.temperature).to(out.dtype)
        return out, None, None, None, None


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, *, in_place: bool = False
) -> torch.Tensor:
    """``log_softmax(logits.float() / temperature)`` at ``targets``, chunked (see the module docstring).

    ``logits`` has shape ``[..., vocab]`` and ``targets`` the leading shape ``[...]``; the result is float32
    with the shape of ``targets``. Gradients flow to ``logits``; with ``in_place`` the backward pass
    overwrites ``logits`` with them (pass it only for logits nothing else reads after the backward).
    """
    temperature = check_temperature(temperature)
    shape = targets.shape
    vocab = logits.shape[-1]
    flat, ids = logits.reshape(-1, vocab), targets.reshape(-1).long()
    step = max(1, CHUNK_ELEMENTS // max(1, vocab))
    if torch.is_grad_enabled() and flat.requires_grad:
        values: torch.Tensor = _ChunkedLogProbs.apply(flat, ids, temperature, step, in_place)
    else:
        values = _forward(flat, ids, temperature, step)[0]
    return values.reshape(shape)


def _forward_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, step: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log-probs, entropies, log-sum-exps)``: :func:`_forward` plus ``H = lse − Σ p·x`` per token."""
    values = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    entropy = torch.empty_like(values)
    lse = torch.empty_like(values)
    for start in range(0, logits.shape[0], step):
        scaled = logits[start : start + step].float() / temperature
        chunk_lse = torch.logsumexp(scaled, dim=-1)
        probs = torch.exp(scaled - chunk_lse.unsqueeze(-1))
        chosen = scaled.gather(-1, targets[start : start + step].unsqueeze(-1)).squeeze(-1)
        values[start : start + step] = chosen - chunk_lse
        entropy[start : start + step] = chunk_lse - (probs * scaled).sum(-1)
        lse[start : start + step] = chunk_lse
    return values, entropy, lse


class _ChunkedLogProbsEntropy(torch.autograd.Function):
    """:class:`_ChunkedLogProbs` that also returns each position's entropy, with its gradient.

    With ``x = logits / T``, ``p = softmax(x)`` and ``H = −Σ p log p``: ``∂H/∂x_k = −p_k (log p_k + H)``.
    """

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, temperature: float, step: int, in_place: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        values, entropy, lse = _forward_entropy(logits, targets, temperature, step)
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.temperature, ctx.step, ctx.in_place = temperature, step, in_place
        ctx.set_materialize_grads(False)
        return values, entropy

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None, None, None]:
        logits, targets, lse, entropy = ctx.saved_tensors
        if grad is None and grad_entropy is None:
            return None, None, None, None, None
        out = logits.detach() if ctx.in_place else torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.step):
            stop = start + ctx.step
            log_p = logits[start:stop].float() / ctx.temperature - lse[start:stop].unsqueeze(-1)
            probs = torch.exp(log_p)
            chunk = torch.zeros_like(probs)
            if grad is not None:
                g = grad[start:stop].float().unsqueeze(-1)
                chunk -= probs * g
                chunk.scatter_add_(-1, targets[start:stop].unsqueeze(-1), g)
            if grad_entropy is not None:
                ge = grad_entropy[start:stop].float().unsqueeze(-1)
                chunk -= ge * probs * (log_p + entropy[start:stop].unsqueeze(-1))
            out[start:stop] = (chunk / ctx.temperature).to(out.dtype)
        return out, None, None, None, None


def token_logprobs_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, *, in_place: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_logprobs` and the entropy ``H = −Σ_v p_v log p_v`` of ``softmax(logits / T)`` per position.

    Both are float32 with the shape of ``targets``; gradients flow to ``logits`` from either (the entropy
    bonus of the trainer's loss). The same chunking: no ``[tokens, vocab]`` float32 copy is kept.
    """
    temperature = check_temperature(temperature)
    shape = targets.shape
    vocab = logits.shape[-1]
    flat, ids = logits.reshape(-1, vocab), targets.reshape(-1).long()
    step = max(1, CHUNK_ELEMENTS // max(1, vocab))
    if torch.is_grad_enabled() and flat.requires_grad:
        values, entropy = _ChunkedLogProbsEntropy.apply(flat, ids, temperature, step, in_place)
    else:
        values, entropy, _ = _forward_entropy(flat, ids, temperature, step)
    return values.reshape(shape), entropy.reshape(shape)


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
def sequence_logprobs(
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
