"""Withholding: a worker that samples honestly but submits only the groups it likes.

Such a worker passes every other check — its text, ids, version and log-probs are all honest — and
still biases the gradient: it leases tasks, samples them, submits the groups whose rewards it likes
and lets the other leases lapse (they run out and are re-issued, so no prompt is lost, but what it
submitted is a chosen sample). Its signature is the two together:

* **leases that lapse** while it is alive and submitting — an honest worker's leases lapse only when it
  stalls or crashes, rarely, and not in a way tied to the reward of what it sampled;
* **a reward above its pool's**: the mean reward of the groups it submitted (as the coordinator scored
  them) against the same mean over the other workers of its pool (of the whole job when the pool has too
  few others), the unit being a group (its rollouts share a prompt).

:class:`Tally` keeps the sums (constant memory per worker and per pool). :func:`judge` computes
``z = (mean_worker − mean_others) / sqrt(var_others / n_worker)``: for a worker whose lapses are
independent of reward its submitted groups are a random sample of the pool's, so ``z`` is about
standard normal. The test runs when a worker's submitted groups reach 16, 32, 64, … (doubling), so a
worker is tested at most log₂(groups) times over a run, and only while it has let at least
:data:`MIN_LAPSED` leases lapse and a fraction :data:`MIN_LAPSED_FRACTION` of them:

* ``z ≥`` :data:`REPORT_Z` (3): reported (the worker's ``withholding`` in the status document,
  ``workers_suspected_withholding`` in ``/metrics``); an honest worker crosses it with probability
  1.3e-3 per test;
* ``z ≥`` :data:`QUARANTINE_Z` (5): quarantined. An honest worker crosses it with probability 2.9e-7 per
  test, under 1e-5 over twenty doublings (a million groups), on top of the lapse condition.

Power, for scale: in a pool whose group rewards have mean 0.5 and standard deviation 0.3, a worker that
withholds its worse half of groups submits a mean near 0.74, ``z ≈ 0.8 √n``: reported from 16 groups,
quarantined at the 64-group test. A worker that withholds a few groups only is not caught; what it can
shift is correspondingly small. Pure and in-memory.
"""

from __future__ import annotations

import dataclasses
import math

MIN_GROUPS = 16
"""The first test, at this many submitted groups; then at every doubling."""
MIN_LAPSED = 4
MIN_LAPSED_FRACTION = 0.2
"""Lapsed leases ÷ (lapsed + submitted) at or above which the reward test runs."""
REPORT_Z = 3.0
QUARANTINE_Z = 5.0


@dataclasses.dataclass
class Tally:
    """Groups submitted, their group-mean rewards' sum and sum of squares, and leases that lapsed."""

    groups: int = 0
    total: float = 0.0
    squares: float = 0.0
    lapsed: int = 0

    def submitted(self, rewards: list[float]) -> None:
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        self.groups += 1
        self.total += mean
        self.squares += mean * mean

    def plus(self, other: Tally) -> Tally:
        return Tally(
            self.groups + other.groups,
            self.total + other.total,
            self.squares + other.squares,
            self.lapsed + other.lapsed,
        )

    def minus(self, other: Tally) -> Tally:
        return Tally(
            self.groups - other.groups,
            self.total - other.total,
            self.squares - other.squares,
            self.lapsed - other.lapsed,
        )

    @property
    def mean(self) -> float:
        return self.total / self.groups if self.groups else 0.0

    @property
    def variance(self) -> float:
        if self.groups < 2:
            return 0.0
        return max(0.0, (self.squares - self.groups * self.mean**2) / (self.groups - 1))

    @property
    def lapsed_fraction(self) -> float:
        return self.lapsed / (self.lapsed + self.groups) if self.lapsed + self.groups else 0.0


@dataclasses.dataclass(frozen=True)
class Verdict:
    z: float
    quarantine: bool
    message: str


def due(groups: int) -> bool:
    """Whether a worker that has just submitted its ``groups``-th group is tested now."""
    return groups >= MIN_GROUPS and groups & (groups - 1) == 0


def judge(worker: Tally, others: Tally) -> Verdict | None:
    """The verdict on ``worker`` against ``others`` (its pool's other workers), or None when nothing is
    anomalous or there is too little to tell."""
    if worker.lapsed < MIN_LAPSED or worker.lapsed_fraction < MIN_LAPSED_FRACTION:
        return None
    if worker.groups < MIN_GROUPS or others.groups < MIN_GROUPS:
        return None
    spread = math.sqrt(max(others.variance, 1e-12) / worker.groups)
    z = (worker.mean - others.mean) / spread
    if z < REPORT_Z:
        return None
    message = (
        f"{worker.lapsed} of its {worker.lapsed + worker.groups} leases lapsed, and the mean reward of the "
        f"{worker.groups} groups it submitted, {worker.mean:.3f}, is above its pool's {others.mean:.3f} "
        f"(z {z:.1f}): it may be submitting only the groups it likes"
    )
    return Verdict(z, z >= QUARANTINE_Z, message)
