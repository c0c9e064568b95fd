"""Fidelity statistics against values computed by hand (the arithmetic is written out in each test)."""

from __future__ import annotations

import math
import warnings

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
    a = [0, 0, 1, 0, 0, 1, 0, 0, 0]
    b = [1, 1, 0, 1, 1, 0, 1, 1, 0]  # C(18, 9) = 48,620 splits
    exact, was_exact = fidelity.permutation_test(a, b, exact_limit=10**6)
    approx, was_approx = fidelity.permutation_test(a, b, resamples=20_000, seed=3, exact_limit=100)
    assert was_exact and not was_approx
    assert 0.001 < exact < 0.2  # 2/9 against 6/9: a real difference, not an edge case
    assert approx == pytest.approx(exact, abs=0.015)
    assert fidelity.permutation_test(
        a, b, resamples=2000, seed=3, exact_limit=100
    ) == fidelity.permutation_test(a, b, resamples=2000, seed=3, exact_limit=100)


def test_exact_permutation_p_by_hand_with_ties() -> None:
    # [1, 1] against [0, 0]: C(4, 2) = 6 splits; only {1,1}|{0,0} and its mirror reach |Δ| = 1.
    assert fidelity.permutation_test([1, 1], [0, 0]) == (pytest.approx(2 / 6), True)


def test_mann_whitney_without_ties_is_exact_by_hand() -> None:
    # U_a = 0: of the C(6, 3) = 20 equally likely rank sets of a, one gives U = 0 and one U = 9, so the
    # two-sided exact p is 2/20 (the normal approximation would say 0.081).
    u, p = fidelity.mann_whitney([1, 2, 3], [4, 5, 6])
    assert u == 0.0
    assert p == pytest.approx(0.1)
    u, p = fidelity.mann_whitney([4, 5, 6], [1, 2, 3])
    assert (u, p) == (9.0, pytest.approx(0.1))


def test_mann_whitney_with_ties_by_hand() -> None:
    # Pooled: three 0s (ranks 1–3, average 2) and five 1s (ranks 4–8, average 6).
    # R_a = 2 + 2 + 6 + 6 = 16, U_a = 16 − 4·5/2 = 6; μ_U = 8;
    # tie term Σ(t³ − t)/(N(N − 1)) = (24 + 120)/56; σ² = 4·4/12 · (9 − 144/56) = 8.5714...
    u, p = fidelity.mann_whitney([0, 0, 1, 1], [0, 1, 1, 1])
    sigma = math.sqrt(16 / 12 * (9 - 144 / 56))
    assert u == 6.0
    assert p == pytest.approx(math.erfc((2.0 - 0.5) / sigma / math.sqrt(2)))
    assert fidelity.mann_whitney([1, 1], [1, 1]) == (2.0, 1.0)  # all tied: no evidence at all


def test_ks_by_hand() -> None:
    # D = 1; exactly: of the 20 orderings of a among the pooled six, only a all below or all above b
    # reach D = 1, so p = 2/20.
    d, p = fidelity.ks_two_sample([1, 2, 3], [4, 5, 6])
    assert d == 1.0
    assert p == pytest.approx(0.1)
    d, p = fidelity.ks_two_sample([1, 2, 3, 4], [1, 2, 3, 4])
    assert (d, p) == (0.0, 1.0)
    d, _ = fidelity.ks_two_sample([1, 2, 3, 4], [3, 4, 5, 6])
    assert d == 0.5  # the CDFs differ most on [2, 3): 2/4 against 0


def test_welch_interval_and_the_combined_report_by_hand() -> None:
    # means 2 and 5, sample variances 1 and 1: se = √(1/3 + 1/3); Welch–Satterthwaite
    # df = (2/3)² / ((1/3)²/2 + (1/3)²/2) = 4, t₀.₉₇₅,₄ = 2.7764 (tables); Δ = −3 ± 2.7764 · 0.8165.
    low, high = fidelity.welch_ci([1, 2, 3], [4, 5, 6])  # type: ignore[misc]
    half = 2.776445 * math.sqrt(2 / 3)
    assert (low, high) == (pytest.approx(-3 - half, abs=1e-5), pytest.approx(-3 + half, abs=1e-5))
    assert fidelity.welch_ci([1], [2, 3]) is None  # one value: no variance to estimate
    assert fidelity.welch_ci([1, 1], [2, 2]) == (-1.0, -1.0)
    # One constant sample: se = √(0 + 1/3), df = 2 (all from the other sample), t₀.₉₇₅,₂ = 4.3027.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a constant sample is exact, not a precision problem
        low, high = fidelity.welch_ci([1, 1, 1], [4, 5, 6])  # type: ignore[misc]
    one_sided = 0.95 / math.sqrt(2 * 0.975 * 0.025) * math.sqrt(1 / 3)
    assert (low, high) == (pytest.approx(-4 - one_sided), pytest.approx(-4 + one_sided))
    report = fidelity.compare_samples([1, 2, 3], [4, 5, 6])
    assert report.difference == -3.0 and report.permutation_exact
    assert report.permutation_p == pytest.approx(0.1)
    assert report.to_mapping()["ci95"] == [
        pytest.approx(-3 - half, abs=1e-5),
        pytest.approx(-3 + half, abs=1e-5),
    ]
    with pytest.raises(ValueError, match="at least 2 values per sample, got 1 and 2"):
        fidelity.compare_samples([1], [4, 5])


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
