"""Seeded draws (backends.seeded): the keyed PRF, inverse-CDF sampling, and the interval check."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_runtime.backends import seeded


def test_the_uniform_is_a_deterministic_function_of_key_row_and_position() -> None:
    key = random.Random(0).getrandbits(128)
    u = seeded.uniform(key, 3, 7)
    assert u == seeded.uniform(key, 3, 7) and 0.0 < u < 1.0
    others = {
        seeded.uniform(key + 1, 3, 7),
        seeded.uniform(key, 4, 7),
        seeded.uniform(key, 3, 8),
        seeded.uniform(key, 7, 3),
    }
    assert u not in others and len(others) == 4
    with pytest.raises(ValueError, match="128-bit"):
        seeded.uniform(1 << 128, 0, 0)
    with pytest.raises(ValueError, match="≥ 0"):
        seeded.uniform(key, -1, 0)


def test_the_uniform_is_uniform() -> None:
    key = random.Random(1).getrandbits(128)
    values = [seeded.uniform(key, row, position) for row in range(100) for position in range(200)]
    bins = [0] * 20
    for v in values:
        bins[int(v * 20)] += 1
    expected = len(values) / 20
    chi2 = sum((b - expected) ** 2 / expected for b in bins)
    assert chi2 < 43.8  # 19 degrees of freedom, p = 0.001
    assert abs(sum(values) / len(values) - 0.5) < 0.01


def test_draws_follow_the_distribution() -> None:
    probs = torch.tensor([[0.05, 0.0, 0.4, 0.25, 0.3]])
    key = random.Random(2).getrandbits(128)
    counts = [0] * 5
    n = 20000
    for position in range(n):
        u = seeded.uniforms([key], [0], position)
        counts[int(seeded.draw(probs, u))] += 1
    assert counts[1] == 0  # a token of probability 0 is never drawn
    chi2 = sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs[0].tolist(), strict=True) if p > 0)
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001


logits_rows = st.lists(st.floats(-8.0, 8.0), min_size=2, max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    row=logits_rows, temperature=st.floats(0.3, 2.0), top_p=st.floats(0.05, 1.0), u=st.floats(1e-9, 1 - 1e-9)
)
def test_a_drawn_token_is_in_the_nucleus_and_passes_the_check(
    row: list[float], temperature: float, top_p: float, u: float
) -> None:
    probs = seeded.distribution(torch.tensor([row]), temperature, top_p)
    token = seeded.draw(probs, torch.tensor([u], dtype=torch.float64))
    assert float(probs[0, token]) > 0
    assert float(seeded.violations(probs, token, torch.tensor([u], dtype=torch.float64))) == 0.0


@settings(max_examples=200, deadline=None)
@given(row=logits_rows, u=st.floats(1e-9, 1 - 1e-9), data=st.data())
def test_any_other_token_lies_outside_by_the_mass_between(
    row: list[float], u: float, data: st.DataObject
) -> None:
    probs = seeded.distribution(torch.tensor([row]), 1.0, 1.0)
    uu = torch.tensor([u], dtype=torch.float64)
    drawn = int(seeded.draw(probs, uu))
    other = data.draw(st.integers(0, len(row) - 1).filter(lambda t: t != drawn))
    lo, hi = seeded.intervals(probs, torch.tensor([other]))
    gap = float(lo - u) if other > drawn else float(u - hi)
    found = float(seeded.violations(probs, torch.tensor([other]), uu))
    assert found == pytest.approx(max(gap, 0.0), abs=1e-12)
    # Between u and the other token's interval lies (part of) the drawn token's mass.
    assert found <= 1.0 and (found > 0 or math.isclose(u, float(lo if other > drawn else hi), abs_tol=1e-12))


def test_an_honest_backend_with_rounding_differences_stays_within_a_small_tolerance() -> None:
    """A backend whose probabilities differ from the trainer's by float32 rounding (relative 1e-6) draws
    a neighbouring token only when u falls that close to a boundary, and then by no more than that."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2000, 512, generator=gen) * 3
    trainer = seeded.distribution(logits, 1.0, 0.95)
    backend = trainer * (1 + 1e-6 * torch.randn(trainer.shape, generator=gen))
    key = random.Random(3).getrandbits(128)
    u = seeded.uniforms([key] * 2000, list(range(2000)), 0)
    tokens = seeded.draw(backend, u)
    worst = float(seeded.violations(trainer, tokens, u).max())
    assert worst < 1e-5
