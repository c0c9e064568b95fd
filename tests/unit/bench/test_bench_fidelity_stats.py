"""Fidelity statistics against values computed by hand (the arithmetic is written out in each test)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from echo_runtime.bench import fidelity


def test_logprob_mismatch_by_hand() -> None:
    behaviour = [[-1.0, -2.0], [-0.5]]
    recomputed = [[-1.1, -2.0], [-0.3]]
    # δ = π − μ = [−0.1, 0.0], [+0.2]
    m = fidelity.logprob_mismatch(behaviour, recomputed)
    assert (m.sequences, m.tokens) == (2, 3)
    assert m.mean_abs == pytest.approx((0.1 + 0.0 + 0.2) / 3)
    assert m.max_abs == pytest.approx(0.2)
    # k3 = e^δ − 1 − δ per token, summed per sequence, averaged over sequences.
    k3_first = (math.exp(-0.1) - 1 + 0.1) + 0.0  # 0.0048374180...
    k3_second = math.exp(0.2) - 1 - 0.2  # 0.0214027581...
    assert m.kl_seq == pytest.approx((k3_first + k3_second) / 2)
    assert m.kl_seq == pytest.approx(0.0131200881, rel=1e-8)
    # k1 = Σ −δ per sequence: +0.1 and −0.2, mean −0.05.
    assert m.kl_seq_k1 == pytest.approx(-0.05)


def test_identical_logprobs_have_no_mismatch() -> None:
    m = fidelity.logprob_mismatch([[-0.3, -4.0, -0.01]], [[-0.3, -4.0, -0.01]])
    assert (m.mean_abs, m.max_abs, m.kl_seq, m.kl_seq_k1) == (0.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("behaviour", "recomputed", "message"),
    [
        ([[-1.0]], [[-1.0], [-2.0]], "1 behaviour sequences but 2 recomputed"),
        ([[-1.0, -2.0]], [[-1.0]], "sequence 0: 2 behaviour log-probs but 1 recomputed"),
        ([[float("nan")]], [[-1.0]], "sequence 0: log-probs must be finite"),
        ([], [], "no sequences"),
    ],
)
def test_logprob_mismatch_rejects_what_does_not_pair_up(
    behaviour: list[list[float]], recomputed: list[list[float]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        fidelity.logprob_mismatch(behaviour, recomputed)


def test_exact_permutation_test_by_hand() -> None:
    # 20 ways to split {1..6} into 3 + 3; only {1,2,3} | {4,5,6} and its mirror reach |Δmean| = 3.
    p, exact = fidelity.permutation_test([1, 2, 3], [4, 5, 6])
    assert exact and p == pytest.approx(2 / 20)
    # Identical samples: every split is at least as extreme as a difference of 0.
    p, exact = fidelity.permutation_test([1, 1], [1, 1])
    assert exact and p == 1.0


def test_monte_carlo_permutation_test_agrees_with_the_exact_one() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 2, 9).tolist(), rng.integers(0, 2, 9).tolist()  # C(18, 9) = 48,620 splits
    exact, was_exact = fidelity.permutation_test(a, b, exact_limit=10**6)
    approx, was_approx = fidelity.permutation_test(a, b, resamples=20_000, seed=3, exact_limit=100)
    assert was_exact and not was_approx
    assert approx == pytest.approx(exact, abs=0.015)
    assert fidelity.permutation_test(
        a, b, resamples=2000, seed=3, exact_limit=100
    ) == fidelity.permutation_test(a, b, resamples=2000, seed=3, exact_limit=100)


def test_mann_whitney_without_ties_by_hand() -> None:
    # U_a = 0; μ_U = 3·3/2 = 4.5; σ_U = √(3·3·7/12) = √5.25; z = (|0 − 4.5| − 0.5)/σ = 1.7457...
    u, p = fidelity.mann_whitney([1, 2, 3], [4, 5, 6])
    z = 4.0 / math.sqrt(5.25)
    assert u == 0.0
    assert p == pytest.approx(math.erfc(z / math.sqrt(2)))
    assert p == pytest.approx(0.0808556, abs=1e-6)  # scipy.stats.mannwhitneyu(method="asymptotic")


def test_mann_whitney_with_ties_by_hand() -> None:
    # Pooled: three 0s (ranks 1–3, average 2) and five 1s (ranks 4–8, average 6).
    # R_a = 2 + 2 + 6 + 6 = 16, U_a = 16 − 4·5/2 = 6; μ_U = 8;
    # tie term Σ(t³ − t)/(N(N − 1)) = (24 + 120)/56; σ² = 4·4/12 · (9 − 144/56) = 8.5714...
    u, p = fidelity.mann_whitney([0, 0, 1, 1], [0, 1, 1, 1])
    sigma = math.sqrt(16 / 12 * (9 - 144 / 56))
    assert u == 6.0
    assert p == pytest.approx(math.erfc((2.0 - 0.5) / sigma / math.sqrt(2)))
    assert fidelity.mann_whitney([1, 1], [1, 1]) == (2.0, 1.0)  # all tied: no evidence at all


def test_ranks_average_ties() -> None:
    assert fidelity.rank(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]


def test_ks_by_hand() -> None:
    d, p = fidelity.ks_two_sample([1, 2, 3], [4, 5, 6])
    assert d == 1.0
    en = math.sqrt(3 * 3 / 6)
    lam = en + 0.12 + 0.11 / en  # × D = 1
    expected = 2 * (math.exp(-2 * lam**2) - math.exp(-8 * lam**2) + math.exp(-18 * lam**2))
    assert p == pytest.approx(expected, rel=1e-9)
    assert p == pytest.approx(0.03262, abs=1e-4)
    d, p = fidelity.ks_two_sample([1, 2, 3, 4], [1, 2, 3, 4])
    assert (d, p) == (0.0, 1.0)


def test_kolmogorov_tail_is_a_probability() -> None:
    values = [fidelity.kolmogorov_q(x) for x in (0.0, 0.2, 0.5, 1.0, 1.36, 2.0, 5.0)]
    assert values[0] == 1.0 and all(0.0 <= v <= 1.0 for v in values)
    assert values == sorted(values, reverse=True)
    assert fidelity.kolmogorov_q(1.358) == pytest.approx(0.05, abs=5e-4)  # the classic 5% critical value


def test_welch_interval_and_the_combined_report_by_hand() -> None:
    # means 2 and 5, sample variances 1 and 1: se = √(1/3 + 1/3) = 0.8165; Δ = −3 ± 1.96 · 0.8165.
    low, high = fidelity.welch_ci([1, 2, 3], [4, 5, 6])
    half = fidelity.Z95 * math.sqrt(2 / 3)
    assert (low, high) == (pytest.approx(-3 - half), pytest.approx(-3 + half))
    report = fidelity.compare_samples([1, 2, 3], [4, 5, 6])
    assert report.difference == -3.0 and report.permutation_exact
    assert report.permutation_p == pytest.approx(0.1)
    assert report.to_mapping()["ci95"] == [pytest.approx(-3 - half), pytest.approx(-3 + half)]


def test_same_distribution_is_not_rejected_and_a_shift_is() -> None:
    rng = np.random.default_rng(0)
    same = fidelity.compare_samples(rng.binomial(1, 0.3, 400).tolist(), rng.binomial(1, 0.3, 400).tolist())
    shifted = fidelity.compare_samples(rng.binomial(1, 0.3, 400).tolist(), rng.binomial(1, 0.5, 400).tolist())
    assert min(same.permutation_p, same.mann_whitney_p) > 0.01
    assert max(shifted.permutation_p, shifted.mann_whitney_p, shifted.ks_p) < 1e-3
    assert shifted.ci95[1] < 0


def test_empty_samples_are_an_error() -> None:
    with pytest.raises(ValueError, match="two non-empty 1-d samples"):
        fidelity.compare_samples([], [1.0])
