"""Samples a worker cannot choose: every token drawn by inverse CDF from a uniform a keyed PRF gives.

A worker that holds the weights of the version it claims can compute the exact log-probs of *any*
text, so the trainer's log-prob check (``trainer/verify.py``) cannot tell sampled text from text the
worker chose (only its best completions, say). Seeded draws close that: the coordinator gives each
leased task a fresh random ``key``; the backend draws the token of row ``r`` of the task's group at
position ``t`` as the token whose interval of the cumulative distribution contains
``u = uniform(key, r, t)``. The distribution is the one every backend and the trainer compute
(:func:`distribution`: logits ÷ temperature, the top-p nucleus, softmax), and the cumulative sum runs
over token ids in increasing order, in float64. A completion is then a function of (weights, prompt,
key): text that departs from the seeded draw must claim, at the first position it departs, a token
whose interval does not contain ``u``.

The check (:func:`violations`) recomputes the distribution at the checked positions and returns how
far ``u`` lies outside the claimed token's interval: 0 for the drawn token when the two computations
agree exactly, about the float mismatch of the two cumulative sums when they do not (an honest backend
on other hardware, or in bf16, can land on a neighbouring token when ``u`` falls that close to a
boundary), and for a token not drawn from the key the probability mass between it and ``u``. A
tolerance a little above the measured mismatch separates the two.

Promises:

* :func:`uniform` is uniform on (0, 1), never 0 or 1, and a deterministic function of
  ``(key, row, position)`` (BLAKE2b keyed with the 128-bit key); knowing outputs for other rows,
  positions or keys tells nothing about it.
* :func:`draw` returns, for each row, the smallest id whose cumulative probability exceeds ``u`` —
  never a token of probability 0 (outside the nucleus, or underflowed).
* :func:`violations` of the drawn tokens against the probabilities they were drawn from is 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where tensors are drawn: the coordinator imports the keys' side, not torch
    import torch

KEY_BITS = 128
BACKENDS = frozenset({"transformers", "mlx"})
"""The backends that draw with keys. vLLM does not yet (its sampler would need a hook): its rollouts
are not checked token by token."""


def parse_key(text: str) -> int:
    """A key as the coordinator sends it (32 hex digits) → int; ValueError naming what is wrong."""
    if len(text) != KEY_BITS // 4 or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"key: {KEY_BITS // 4} lowercase hex digits, got {text!r}")
    return int(text, 16)


def uniform(key: int, row: int, position: int) -> float:
    """The PRF's uniform for ``(key, row, position)``: a 53-bit float in (0, 1)."""
    if not 0 <= key < 1 << KEY_BITS:
        raise ValueError(f"key: a {KEY_BITS}-bit non-negative integer, got {key}")
    if row < 0 or position < 0:
        raise ValueError(f"row and position must be ≥ 0, got {row} and {position}")
    digest = hashlib.blake2b(
        f"{row}:{position}".encode(), key=key.to_bytes(KEY_BITS // 8, "big"), digest_size=8
    ).digest()
    return ((int.from_bytes(digest, "big") >> 11) + 0.5) / float(1 << 53)


def uniforms(keys: Sequence[int], rows: Sequence[int], position: int) -> torch.Tensor:
    """``[uniform(keys[i], rows[i], position)]`` as a float64 tensor (one per row of a batch)."""
    import torch

    return torch.tensor(
        [uniform(k, r, position) for k, r in zip(keys, rows, strict=True)], dtype=torch.float64
    )


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """``logits`` with every token outside the top-p nucleus set to ``-inf`` (the top token always stays).

    The nucleus is the smallest set of most likely tokens whose probability reaches ``top_p``.
    """
    import torch

    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Mass strictly before each token: a token is kept while that mass is still short of top_p.
    before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = before >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def distribution(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The sampling distribution over the vocabulary (last dimension), in float32: what every backend
    samples from and the trainer recomputes."""
    import torch

    return torch.softmax(top_p_filter(logits.float() / temperature, top_p), dim=-1)


def _cumulative(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cdf = probs.double().cumsum(-1)
    return cdf, cdf[..., -1:]


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """For each row of ``probs`` (``[rows, vocab]``), the token whose cumulative interval contains
    ``u[row]`` (``[rows]``, float64 in (0, 1))."""
    import torch

    cdf, total = _cumulative(probs)
    target = u.to(cdf.device, torch.float64).unsqueeze(-1) * total
    token = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return token.clamp(max=probs.shape[-1] - 1)


def intervals(probs: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)`` of each row's ``tokens[row]`` in its normalised cumulative distribution (float64)."""
    cdf, total = _cumulative(probs)
    index = tokens.to(cdf.device).long().unsqueeze(-1)
    hi = (cdf.gather(-1, index) / total).squeeze(-1)
    mass = (probs.double().gather(-1, index) / total).squeeze(-1)
    return hi - mass, hi


def violations(probs: torch.Tensor, tokens: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """How far each ``u[row]`` lies outside ``tokens[row]``'s interval (0 inside), float64."""
    import torch

    lo, hi = intervals(probs, tokens)
    u = u.to(lo.device, torch.float64)
    return torch.clamp(torch.maximum(lo - u, u - hi), min=0.0)
