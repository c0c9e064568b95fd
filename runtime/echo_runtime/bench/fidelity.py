"""Backend fidelity statistics: log-prob mismatch, a sequence-level KL estimate, two-sample tests.

Pure functions on numbers (numpy and scipy only; no ML framework, no I/O). :mod:`.fidelity_run` samples from real
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
* the Mann–Whitney U test: exact for small samples without ties, else the normal approximation with
  tie and continuity corrections;
* the two-sample Kolmogorov–Smirnov test (exact for small samples; conservative for discrete data);
* the difference in means with a 95% confidence interval (Welch's t, Welch–Satterthwaite degrees of
  freedom: right at n = 3, where a normal quantile is far too narrow).

Every test and interval is ``scipy.stats``'s; this module chooses them, validates the input and
reports them together.

Promises: every function is deterministic (the Monte-Carlo permutation test takes a seed); inputs are
validated with errors that say which sequence or sample is wrong; p-values are in [0, 1].
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats


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


def _mean_gap(a: np.ndarray, b: np.ndarray, axis: int = -1) -> Any:
    return np.abs(np.mean(a, axis=axis) - np.mean(b, axis=axis))


def permutation_test(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = 10_000,
    seed: int = 0,
    exact_limit: int = 20_000,
) -> tuple[float, bool]:
    """Two-sided permutation p-value of ``mean(a) − mean(b)``, and whether it was exact.

    The statistic is ``|mean(a) − mean(b)|`` and the p-value the share of splits at least as large
    (``scipy.stats.permutation_test``): every split when there are at most ``exact_limit``, else
    ``resamples`` random ones, counted with the observed split (``(k + 1)/(R + 1)``, never 0).
    """
    x, y = _check(a, b)
    if x.size < 2 or y.size < 2:
        raise ValueError(f"a permutation test needs at least 2 values per sample, got {x.size} and {y.size}")
    exact = math.comb(x.size + y.size, x.size) <= exact_limit
    found = stats.permutation_test(
        (x, y),
        _mean_gap,
        permutation_type="independent",
        vectorized=True,
        n_resamples=np.inf if exact else resamples,
        alternative="greater",
        rng=np.random.default_rng(seed),
    )
    return min(1.0, float(found.pvalue)), exact


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """``(U of a, two-sided p)`` (``scipy.stats.mannwhitneyu``, method ``auto``: the exact null
    distribution for small samples without ties, else the normal approximation with tie and continuity
    corrections). All values tied is no evidence at all: p = 1."""
    x, y = _check(a, b)
    if np.all(np.concatenate([x, y]) == x[0]):
        return x.size * y.size / 2.0, 1.0
    found = stats.mannwhitneyu(x, y, alternative="two-sided")
    return float(found.statistic), min(1.0, float(found.pvalue))


def ks_two_sample(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """``(D, p)``: the largest gap between the empirical CDFs and its two-sided p-value
    (``scipy.stats.ks_2samp``: exact for small samples, asymptotic for large; conservative for
    discrete data)."""
    x, y = _check(a, b)
    found = stats.ks_2samp(x, y)
    return float(found.statistic), min(1.0, float(found.pvalue))


@dataclasses.dataclass(frozen=True)
class TwoSample:
    """Two samples compared (a − b)."""

    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    difference: float
    ci95: tuple[float, float] | None
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
            "ci95": list(self.ci95) if self.ci95 is not None else None,
            "permutationP": self.permutation_p,
            "permutationExact": self.permutation_exact,
            "mannWhitneyU": self.mann_whitney_u,
            "mannWhitneyP": self.mann_whitney_p,
            "ksStatistic": self.ks_statistic,
            "ksP": self.ks_p,
        }


def welch_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """The 95% interval of ``mean(a) − mean(b)``: Welch's t with Welch–Satterthwaite degrees of
    freedom (``scipy.stats.ttest_ind(equal_var=False)``). None when a sample has a single value (no
    variance to estimate); the difference itself when neither sample varies."""
    x, y = _check(a, b)
    if x.size < 2 or y.size < 2:
        return None
    diff = float(x.mean() - y.mean())
    if float(x.var(ddof=1)) == 0.0 and float(y.var(ddof=1)) == 0.0:
        return diff, diff
    with warnings.catch_warnings():
        # scipy warns of "precision loss" when one sample is constant (0/1 rewards often are); its
        # variance is then exactly 0, which is what Welch's formula needs.
        warnings.filterwarnings("ignore", "Precision loss", RuntimeWarning)
        interval = stats.ttest_ind(x, y, equal_var=False).confidence_interval(0.95)
    return float(interval.low), float(interval.high)


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
