"""The coordinator's tallies: what it generated, consumed, dropped and refused, and how fast.

:class:`Counters` is what the status document (:mod:`.report`) and Prometheus (:mod:`.metrics`) read;
:class:`RateWindow` is a sliding rollouts-per-second meter, for the job and for each worker. Pure and
in-memory: the clock is passed in. The counts only ever move by the methods below or by ``+=`` on a
field, and ``consumed_groups`` goes back only when a batch no step trains on is withdrawn
(:meth:`Counters.withdrawn`), so the histogram and the consumed count always agree.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from echo_runtime.coordinator import trust


class RateWindow:
    """Events per second over a sliding window, in one-second buckets."""

    def __init__(self, window: float, now: float) -> None:
        self.window = max(1, int(window))
        self.started = now
        self._buckets: collections.deque[list[int]] = collections.deque()  # [second, count]

    def add(self, now: float, count: int) -> None:
        second = int(now)
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += count
        else:
            self._buckets.append([second, count])
        self._trim(second)

    def rate(self, now: float) -> float:
        self._trim(int(now))
        span = min(float(self.window), max(1.0, now - self.started))
        return sum(c for _, c in self._buckets) / span

    def _trim(self, second: int) -> None:
        while self._buckets and self._buckets[0][0] <= second - self.window:
            self._buckets.popleft()


@dataclasses.dataclass
class Counters:
    """Since this coordinator started (a restart resets them: Prometheus sees a counter reset)."""

    rate: RateWindow
    """Rollouts accepted into the buffer per second, all workers together."""
    rejected: trust.PoolCounters = dataclasses.field(default_factory=trust.PoolCounters)
    """Group submissions refused by a trust check, per pool and reason."""
    staleness_histogram: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    """Consumed groups by their staleness at the step that consumed them."""
    max_observed_staleness: int | None = None
    consumed_groups: int = 0
    weighted_stale: int = 0
    """Consumed groups of staleness > 0 handed out with importance weights."""
    generated_groups: int = 0
    """Valid group submissions (buffered or dropped as stale on arrival): what the swarm generated."""
    accepted_rollouts: int = 0
    accepted_by_pool: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """Rollouts accepted into the buffer, per pool of the worker that generated them."""
    dropped_stale: int = 0
    dropped_quarantined: int = 0
    requeued_prompts: int = 0
    """Prompts of dropped or withdrawn groups put back at the front of the queue."""
    batches: int = 0
    last_reward: float | None = None
    """Mean verified reward of the last batch handed out."""
    workers_expired: int = 0
    verifier_timeouts: int = 0
    verifier_errors: int = 0

    def consumed(self, staleness: int, importance_weighted: bool) -> None:
        """A group went out in a batch at ``staleness``."""
        self.consumed_groups += 1
        self.staleness_histogram[staleness] += 1
        self.max_observed_staleness = max(self.max_observed_staleness or 0, staleness)
        self.weighted_stale += importance_weighted

    def withdrawn(self, staleness: int) -> None:
        """A group handed out at ``staleness`` was taken back: no step trains on it."""
        self.consumed_groups -= 1
        self.staleness_histogram[staleness] -= 1

    def handed(self, rewards: Sequence[float]) -> None:
        """A batch with these rollout rewards went to the trainer."""
        self.batches += 1
        self.last_reward = sum(rewards) / len(rewards)

    def accepted(self, rollouts: int, now: float, pool: str) -> None:
        """A group of ``rollouts`` rollouts from a worker of ``pool`` was buffered."""
        self.accepted_rollouts += rollouts
        self.accepted_by_pool[pool] += rollouts
        self.rate.add(now, rollouts)
