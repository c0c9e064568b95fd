"""A statistical check of text sampled without a key: is it as likely as samples of the policy are?

Groups of transformers and mlx workers are drawn from their lease's key and checked token by token
(:mod:`echo_runtime.backends.seeded`). A vLLM worker draws no key (its sampler has no hook for one yet),
so its text could be chosen — the most likely of several samples, the best by reward, a lower
temperature — with exact log-probs, and the log-prob check would pass. What such a choice does show
is in the statistics of the tokens: for a token ``x`` sampled from the distribution ``p`` the trainer
recomputes at its position, ``s = log p(x) + H(p)`` has mean 0 and variance
``v = Σ p (log p)² − H(p)²`` given everything before it. So over a worker's checked tokens ``Σ s`` is a
martingale, and ``z = Σ s / √(Σ v)`` is about standard normal for an honest worker however long it
runs, while text chosen for its likelihood (or its reward, which goes with it) pushes ``z`` up by a
multiple of √tokens, and a higher temperature pushes it down.

A worker is convicted when, over at least :data:`MIN_TOKENS` checked tokens, ``|z| ≥`` :data:`Z_BOUND`
**and** its mean ``s`` per token is beyond :data:`EXCESS_BOUND` nats:

* ``z`` guards against chance: an honest worker reaches ``|z| ≥ 6`` with probability 2e-9 at one look,
  and under 1e-5 over 10 000 steps' looks (union bound);
* the per-token excess guards against the small bias an honest backend does have when it computes the
  distribution a little differently from the trainer (bf16 against float32: its entropy and
  cross-entropy differ by about 1e-3 nats a token), which ``z`` alone would convict after enough tokens.
  50× that is a choice, not rounding.

What it cannot see, said plainly: a choice whose effect on likelihood is below 0.05 nats a token (e.g.
picking by reward among samples whose likelihoods are alike), and it needs hundreds of tokens, where the
keyed check convicts at the first token that is not its draw. So vLLM pools are for workers trusted more.
"""

from __future__ import annotations

import dataclasses
import math

import torch

MIN_TOKENS = 256
"""Checked tokens of a worker before its statistic is judged."""
Z_BOUND = 6.0
"""|z| at or above which (with the excess) a worker's text is not samples of the policy."""
EXCESS_BOUND = 0.05
"""Mean ``log p(x) + H(p)`` per token (nats), in either direction, that a worker's text must exceed too."""


def surprise(probs: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``probs`` (``[rows, vocab]``): ``(s, v)`` of ``tokens[row]``, float64 — ``s = log p(x) +
    H(p)`` and its variance ``v`` under ``p``. A token of probability 0 (outside the recomputed nucleus)
    gets NaN for both: the caller leaves it out."""
    p = probs.double()
    p = p / p.sum(-1, keepdim=True)
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    entropy = -(p * logp).sum(-1)
    second = (p * logp * logp).sum(-1)
    chosen = p.gather(-1, tokens.to(p.device).long().unsqueeze(-1)).squeeze(-1)
    s = torch.where(chosen > 0, chosen.clamp(min=1e-300).log() + entropy, torch.full_like(chosen, math.nan))
    v = torch.where(
        chosen > 0, (second - entropy * entropy).clamp(min=0.0), torch.full_like(chosen, math.nan)
    )
    return s, v


@dataclasses.dataclass
class Typicality:
    """One worker's statistic over the run: checked tokens of its keyless groups, ``Σ s`` and ``Σ v``."""

    tokens: int = 0
    total: float = 0.0
    variance: float = 0.0

    def add(self, tokens: int, total: float, variance: float) -> None:
        self.tokens += tokens
        self.total += total
        self.variance += variance

    @property
    def z(self) -> float:
        return self.total / math.sqrt(self.variance) if self.variance > 0 else 0.0

    @property
    def excess(self) -> float:
        """Mean ``s`` per token (nats): positive when the text is likelier than samples are."""
        return self.total / self.tokens if self.tokens else 0.0

    def verdict(self) -> str | None:
        """Why this worker's text is not samples of the policy, or None."""
        if self.tokens < MIN_TOKENS or abs(self.z) < Z_BOUND or abs(self.excess) < EXCESS_BOUND:
            return None
        how = "likelier" if self.z > 0 else "less likely"
        return (
            f"text sampled without a key is {how} under the policy than its samples are: mean log p + H "
            f"{self.excess:+.3f} nats per token over {self.tokens} checked tokens, z = {self.z:+.1f} (bounds "
            f"{EXCESS_BOUND:g} and {Z_BOUND:g}): the worker chose the text, or sampled at another temperature"
        )
