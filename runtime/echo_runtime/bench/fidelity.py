"""Backend fidelity statistics: log-prob mismatch, a sequence-level KL estimate, two-sample tests.

Pure functions on numbers (numpy only; no ML framework, no I/O). :mod:`.fidelity_run` samples from real
backends and feeds them here.

**Log-prob mismatch** (:func:`logprob_mismatch`). For rollouts sampled from a backend's behaviour policy
μ, with per-token behaviour log-probs ``log μ_t`` and a recomputation ``log π_t`` of the same tokens
(the trainer's, at the same policy version, or another backend's), ``δ_t = log π_t − log μ_t`` and

* ``meanAbs`` = mean over all tokens of ``|δ_t|``; ``maxAbs`` = the largest;
* ``klSeq`` = mean over sequences of ``Σ_t k3_t`` with ``k3 = e^δ − 1 − δ ≥ 0`` (Schulman 2020,
  "Approximating KL Divergence"): an estimate of the sequence-level ``KL(μ ‖ π)`` from samples of μ,
  the same estimator as the trainer's ``logprobMismatch.klSeq`` metric;
* ``klSeqK1`` = mean over sequences of ``Σ_t −δ_t``: the plain (unbiased, possibly negative) estimator.

**Two-sample tests** (:func:`compare_samples`) of two backends' reward (or length) distributions under the
same policy — are they the same distribution? Reported together because rewards are often discrete
(0/1), where a rank test and a permutation test are the honest choices:

* a permutation test of the difference in means, two-sided: exact (all ``C(m+n, m)`` splits) when there
  are at most ``exact_limit`` of them, else ``resamples`` random permutations with ``p = (k+1)/(R+1)``;
* the Mann–Whitney U test, normal approximation with tie and continuity corrections (as
  ``scipy.stats.mannwhitneyu(method="asymptotic")``);
* the two-sample Kolmogorov–Smirnov statistic with its asymptotic p-value (Stephens' small-sample
  correction; conservative for discrete data);
* the difference in means with a 95% confidence interval (Welch standard error, normal quantile).

Promises: every function is deterministic (the Monte-Carlo permutation test takes a seed); inputs are
validated with errors that say which sequence or sample is wrong; p-values are in [0, 1].
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

Z95 = 1.959963984540054
"""The standard normal 97.5% quantile."""


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """Behaviour vs. recomputed log-probs over a set of sequences (see the module docstring)."""

    sequences: int
    tokens: int
    mean_abs: float
    max_abs: float
    kl_seq: float
    kl_seq_k1: float

    def to_mapping(self) -> dict[str, Any]:
        return {
            "sequences": self.sequences,
            "tokens": self.tokens,
            "meanAbs": self.mean_abs,
            "maxAbs": self.max_abs,
            "klSeq": self.kl_seq,
            "klSeqK1": self.kl_seq_k1,
        }


def logprob_mismatch(behaviour: Sequence[Sequence[float]], recomputed: Sequence[Sequence[float]]) -> Mismatch:
    """Compare per-token log-probs sequence by sequence (the sequences must pair up, token for token)."""
    if len(behaviour) != len(recomputed):
        raise ValueError(f"{len(behaviour)} behaviour sequences but {len(recomputed)} recomputed ones")
    if not behaviour:
        raise ValueError("no sequences to compare")
    abs_sum, abs_max, tokens = 0.0, 0.0, 0
    k3_total, k1_total = 0.0, 0.0
    for i, (mu, pi) in enumerate(zip(behaviour, recomputed, strict=True)):
        if len(mu) != len(pi):
            raise ValueError(f"sequence {i}: {len(mu)} behaviour log-probs but {len(pi)} recomputed")
        a, b = np.asarray(mu, dtype=np.float64), np.asarray(pi, dtype=np.float64)
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise ValueError(f"sequence {i}: log-probs must be finite")
        delta = b - a
        if delta.size:
            abs_sum += float(np.abs(delta).sum())
            abs_max = max(abs_max, float(np.abs(delta).max()))
        tokens += int(delta.size)
        k3_total += float(np.sum(np.expm1(delta) - delta))
        k1_total += float(-delta.sum())
    n = len(behaviour)
    return Mismatch(
        sequences=n,
        tokens=tokens,
        mean_abs=abs_sum / tokens if tokens else 0.0,
        max_abs=abs_max,
        kl_seq=k3_total / n,
        kl_seq_k1=k1_total / n,
    )


# ---------------------------------------------------------------------------------------- two-sample tests
def _check(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1 or x.size == 0 or y.size == 0:
        raise ValueError(f"two non-empty 1-d samples are needed, got sizes {x.size} and {y.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("samples must be finite")
    return x, y


def permutation_test(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = 10_000,
    seed: int = 0,
    exact_limit: int = 20_000,
) -> tuple[float, bool]:
    """Two-sided permutation p-value of ``mean(a) − mean(b)``, and whether it was exact."""
    x, y = _check(a, b)
    pooled = np.concatenate([x, y])
    m, total = x.size, pooled.size
    observed = abs(x.mean() - y.mean())
    tolerance = 1e-12 * max(1.0, float(np.abs(pooled).max()))
    pooled_sum = pooled.sum()

    def extreme(sums: np.ndarray) -> int:
        diff = np.abs(sums / m - (pooled_sum - sums) / (total - m))
        return int(np.count_nonzero(diff >= observed - tolerance))

    if math.comb(total, m) <= exact_limit:
        combos = np.fromiter(
            itertools.chain.from_iterable(itertools.combinations(range(total), m)), dtype=np.int64
        ).reshape(-1, m)
        return extreme(pooled[combos].sum(axis=1)) / combos.shape[0], True
    rng = np.random.default_rng(seed)
    count = 0
    for start in range(0, resamples, 1000):
        rows = min(1000, resamples - start)
        keys = rng.random((rows, total))
        chosen = np.argsort(keys, axis=1)[:, :m]
        count += extreme(pooled[chosen].sum(axis=1))
    return (count + 1) / (resamples + 1), False


def rank(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their average rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(values.size, dtype=np.float64)
    sorted_values = values[order]
    start = 0
    for end in range(1, values.size + 1):
        if end == values.size or sorted_values[end] != sorted_values[start]:
            ranks[order[start:end]] = (start + 1 + end) / 2.0
            start = end
    return ranks


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """``(U of a, two-sided p)``: normal approximation with tie and continuity corrections."""
    x, y = _check(a, b)
    m, n = x.size, y.size
    pooled = np.concatenate([x, y])
    ranks = rank(pooled)
    u = float(ranks[:m].sum() - m * (m + 1) / 2.0)
    _, ties = np.unique(pooled, return_counts=True)
    total = m + n
    tie_term = (
        float(np.sum(ties.astype(np.float64) ** 3 - ties)) / (total * (total - 1)) if total > 1 else 0.0
    )
    variance = m * n / 12.0 * ((total + 1) - tie_term)
    if variance <= 0:
        return u, 1.0
    mu = m * n / 2.0
    z = (abs(u - mu) - 0.5) / math.sqrt(variance)
    return u, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0)))


def ks_two_sample(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """``(D, p)``: the largest gap between the empirical CDFs and its asymptotic two-sided p-value."""
    raw_x, raw_y = _check(a, b)
    x, y = np.sort(raw_x), np.sort(raw_y)
    points = np.concatenate([x, y])
    cdf_x = np.searchsorted(x, points, side="right") / x.size
    cdf_y = np.searchsorted(y, points, side="right") / y.size
    d = float(np.max(np.abs(cdf_x - cdf_y)))
    en = math.sqrt(x.size * y.size / (x.size + y.size))
    return d, kolmogorov_q((en + 0.12 + 0.11 / en) * d)


def kolmogorov_q(lam: float) -> float:
    """``Q_KS(λ) = 2 Σ_{j≥1} (−1)^{j−1} e^{−2 j² λ²}``, the Kolmogorov distribution's tail (in [0, 1])."""
    if lam < 1e-3:
        return 1.0
    total, sign = 0.0, 1.0
    for j in range(1, 101):
        term = sign * math.exp(-2.0 * j * j * lam * lam)
        total += term
        if abs(term) < 1e-12:
            break
        sign = -sign
    return min(1.0, max(0.0, 2.0 * total))


@dataclasses.dataclass(frozen=True)
class TwoSample:
    """Two samples compared (a − b)."""

    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    difference: float
    ci95: tuple[float, float]
    permutation_p: float
    permutation_exact: bool
    mann_whitney_u: float
    mann_whitney_p: float
    ks_statistic: float
    ks_p: float

    def to_mapping(self) -> dict[str, Any]:
        return {
            "nA": self.n_a,
            "nB": self.n_b,
            "meanA": self.mean_a,
            "meanB": self.mean_b,
            "difference": self.difference,
            "ci95": list(self.ci95),
            "permutationP": self.permutation_p,
            "permutationExact": self.permutation_exact,
            "mannWhitneyU": self.mann_whitney_u,
            "mannWhitneyP": self.mann_whitney_p,
            "ksStatistic": self.ks_statistic,
            "ksP": self.ks_p,
        }


def welch_ci(a: Sequence[float], b: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """``mean(a) − mean(b) ± z · √(s_a²/m + s_b²/n)`` (sample variances; 0 for a single value)."""
    x, y = _check(a, b)
    var_x = float(x.var(ddof=1)) if x.size > 1 else 0.0
    var_y = float(y.var(ddof=1)) if y.size > 1 else 0.0
    diff = float(x.mean() - y.mean())
    half = z * math.sqrt(var_x / x.size + var_y / y.size)
    return diff - half, diff + half


def compare_samples(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> TwoSample:
    """All of the two-sample statistics of the module docstring for ``a`` against ``b``."""
    x, y = _check(a, b)
    p_perm, exact = permutation_test(x.tolist(), y.tolist(), resamples=resamples, seed=seed)
    u, p_mw = mann_whitney(x.tolist(), y.tolist())
    d, p_ks = ks_two_sample(x.tolist(), y.tolist())
    return TwoSample(
        n_a=int(x.size),
        n_b=int(y.size),
        mean_a=float(x.mean()),
        mean_b=float(y.mean()),
        difference=float(x.mean() - y.mean()),
        ci95=welch_ci(x.tolist(), y.tolist()),
        permutation_p=p_perm,
        permutation_exact=exact,
        mann_whitney_u=u,
        mann_whitney_p=p_mw,
        ks_statistic=d,
        ks_p=p_ks,
    )
