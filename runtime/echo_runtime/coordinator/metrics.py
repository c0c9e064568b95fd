"""Prometheus metrics of one coordinator (``GET /metrics``), read from the state at scrape time.

Nothing is updated on the request path except the rejection counter and the request-duration
histogram (a bisect into fixed buckets): a custom collector reads the state machine's counters when
Prometheus scrapes, so heartbeats and submissions pay next to nothing for metrics. Every metric is prefixed ``echorl_coordinator_`` and labelled with the ``job``.

The staleness histogram is exported as a Prometheus histogram over the integer staleness of consumed
groups; ``..._max_observed_staleness`` never exceeds ``..._max_staleness`` (the product's promise).
"""

from __future__ import annotations

import bisect
import collections
import re
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from echo_runtime.coordinator import state as state_mod

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_INDEX = re.compile(r"\[\d+\]")
_PREFIX = "echorl_coordinator_"


class Rejections:
    """Count of rejected requests by HTTP status, code and field (indices folded: ``rollouts[].tokenIds``)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[int, str, str]] = collections.Counter()

    def add(self, status: int, code: str, field: str) -> None:
        self.counts[(status, code, _INDEX.sub("[]", field)[:80])] += 1


LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds of the request-duration buckets (seconds). The lease and batch requests are long-polls:
their duration includes the wait, up to the ``waitSeconds`` the caller asked for."""

ROUTES = (
    "register",
    "heartbeat",
    "lease",
    "submit",
    "leave",
    "version",
    "batches",
    "quarantine",
    "status",
    "metrics",
    "other",
)


def route_of(method: str, path: str) -> str:
    """The endpoint a request went to, as one of :data:`ROUTES` (no ids: a label of bounded cardinality)."""
    parts = path.split("/")  # "", "v1", "workers", id, ...
    if path in ("/metrics", "/v1/status"):
        return "metrics" if path == "/metrics" else "status"
    if len(parts) >= 3 and parts[1] == "v1" and parts[2] == "trainer" and len(parts) == 4:
        name = {"version": "version", "batches": "batches", "quarantine": "quarantine"}.get(parts[3])
        return name or "other"
    if len(parts) >= 3 and parts[1] == "v1" and parts[2] == "workers":
        if len(parts) == 3:
            return "register" if method == "POST" else "other"
        if len(parts) == 4:
            return "leave" if method == "DELETE" else "other"
        if len(parts) == 5 and parts[4] in ("heartbeat", "leases"):
            return "heartbeat" if parts[4] == "heartbeat" else "lease"
        if len(parts) == 7 and parts[4] == "tasks" and parts[6] == "rollouts":
            return "submit"
    return "other"


class Latency:
    """Request durations by route, in fixed buckets: a bisect and two additions per request."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts: dict[str, list[int]] = {}
        self.sums: dict[str, float] = collections.defaultdict(float)

    def observe(self, route: str, seconds: float) -> None:
        counts = self.counts.get(route)
        if counts is None:
            counts = self.counts[route] = [0] * (len(self.buckets) + 1)
        counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sums[route] += seconds


class StateCollector(Collector):
    """Exports a :class:`~.state.CoordinatorState`, a :class:`Rejections` and a :class:`Latency` in
    Prometheus format."""

    def __init__(
        self, state: state_mod.CoordinatorState, rejections: Rejections, latency: Latency | None = None
    ) -> None:
        self.state = state
        self.rejections = rejections
        self.latency = latency

    def _per_pool(
        self, family: GaugeMetricFamily | CounterMetricFamily, counts: collections.Counter[str]
    ) -> GaugeMetricFamily | CounterMetricFamily:
        """``family`` with one sample per pool: every configured pool (0 when absent) and any counted."""
        for pool in sorted(set(self.state.config.pools) | set(counts)):
            family.add_metric([self.state.config.job, pool], counts[pool])
        return family

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        s, job = self.state, self.state.config.job
        ledger, counts = s.ledger, s.counters

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(_PREFIX + name, doc, labels=["job"])
            g.add_metric([job], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(_PREFIX + name, doc, labels=["job"])
            c.add_metric([job], value)
            return c

        yield gauge("policy_version", "The newest version the trainer published and announced.", s.published)
        yield gauge(
            "max_staleness", "Δmax (maxStaleness) of the job's sync policy.", s.config.policy.max_staleness
        )
        yield gauge(
            "max_observed_staleness",
            "Largest staleness of any consumed group (-1 before the first batch).",
            -1 if counts.max_observed_staleness is None else counts.max_observed_staleness,
        )
        yield gauge("buffer_groups", "Complete groups in the replay buffer.", ledger.buffered)
        yield gauge(
            "buffer_capacity",
            "Capacity of the replay buffer (Sequential: the current round).",
            ledger.capacity,
        )
        yield gauge("tasks_pending", "Tasks waiting to be leased.", ledger.pending)
        yield gauge("tasks_leased", "Tasks leased to workers.", ledger.leased)
        yield counter("tasks_created", "Tasks created (prompts drawn).", ledger.created)
        yield counter(
            "tasks_reissued", "Leases that expired or were released; their tasks went back.", ledger.reissued
        )
        yield counter("groups_consumed", "Groups handed to the trainer.", counts.consumed_groups)
        yield counter(
            "groups_dropped_stale", "Groups dropped because they would break the bound.", counts.dropped_stale
        )
        yield counter(
            "groups_weighted_stale", "Groups consumed with importance weights.", counts.weighted_stale
        )
        yield counter(
            "groups_generated",
            "Valid group submissions (buffered or dropped on arrival).",
            counts.generated_groups,
        )
        yield counter(
            "groups_dropped_quarantined", "Groups of quarantined workers dropped.", counts.dropped_quarantined
        )
        yield counter(
            "prompts_requeued", "Prompts of dropped groups put back in the queue.", counts.requeued_prompts
        )
        yield counter(
            "verifier_timeouts", "Rollouts whose re-scoring timed out (scored 0).", counts.verifier_timeouts
        )
        yield counter("verifier_errors", "Rollouts whose verifier raised (scored 0).", counts.verifier_errors)
        yield gauge(
            "pacing", "1 when leases are paced to the staleness bound.", 1.0 if s.config.pacing else 0.0
        )
        yield counter("rollouts_accepted", "Rollouts accepted into the buffer.", counts.accepted_rollouts)
        yield counter("batches", "Batches handed to the trainer.", counts.batches)
        yield counter(
            "trainer_busy_seconds",
            "The trainer's step times summed (its rate: the fraction of time the trainer is busy, not waiting).",
            s.pacing.trainer_busy_seconds,
        )
        if s.pacing.trainer_seconds is not None:
            yield gauge(
                "trainer_step_seconds",
                "The trainer's time per step, a moving average (what pacing plans with).",
                s.pacing.trainer_seconds,
            )
        yield counter(
            "workers_expired", "Workers forgotten after missing heartbeats.", counts.workers_expired
        )
        if counts.last_reward is not None:
            yield gauge("reward", "Mean verified reward of the last batch.", counts.last_reward)
        watch = s.signal
        yield counter(
            "groups_filtered",
            "Groups kept out of batches by dynamic sampling (equal rewards).",
            watch.filtered_groups,
        )
        yield counter(
            "prompts_set_aside",
            "Prompts skipped once because their groups were all filtered.",
            watch.set_aside_prompts,
        )
        yield gauge(
            "no_signal_batches",
            "Consecutive batches in which no group's rewards differed (nothing learned).",
            watch.no_signal_batches,
        )
        if watch.signal_fraction is not None:
            yield gauge(
                "signal_fraction",
                "Fraction of the last 64 groups whose rewards differed.",
                watch.signal_fraction,
            )

        workers = s.roster.workers.values()
        records = s.quarantined.records.values()
        trained: collections.Counter[str] = collections.Counter()
        for q in records:
            trained[q.pool] += q.trained_groups
        yield self._per_pool(
            GaugeMetricFamily(_PREFIX + "workers", "Registered workers per pool.", labels=["job", "pool"]),
            collections.Counter(w.pool for w in workers),
        )
        yield self._per_pool(
            CounterMetricFamily(
                _PREFIX + "pool_rollouts_accepted",
                "Rollouts accepted into the buffer, per pool (its rate: rollouts/s per pool).",
                labels=["job", "pool"],
            ),
            counts.accepted_by_pool,
        )
        yield self._per_pool(
            CounterMetricFamily(
                _PREFIX + "workers_quarantined",
                "Workers the trainer quarantined (behaviour log-probs disagree), per pool.",
                labels=["job", "pool"],
            ),
            collections.Counter(q.pool for q in records),
        )
        yield self._per_pool(
            CounterMetricFamily(
                _PREFIX + "groups_trained_before_quarantine",
                "Groups of quarantined workers that optimizer steps had trained on before they were caught, per pool.",
                labels=["job", "pool"],
            ),
            trained,
        )
        yield self._per_pool(
            CounterMetricFamily(
                _PREFIX + "leases_lapsed",
                "Leases that ran out while their worker was alive (re-issued), per pool.",
                labels=["job", "pool"],
            ),
            collections.Counter({pool: tally.lapsed for pool, tally in s.tallies.items()}),
        )
        yield self._per_pool(
            GaugeMetricFamily(
                _PREFIX + "workers_suspected_withholding",
                "Workers whose lapsed leases and submitted rewards suggest they submit only the groups they like.",
                labels=["job", "pool"],
            ),
            collections.Counter(w.pool for w in workers if w.withholding is not None),
        )

        untrusted = CounterMetricFamily(
            _PREFIX + "rollouts_rejected",
            "Group submissions refused by a trust check, per pool and reason.",
            labels=["job", "pool", "reason"],
        )
        for pool in s.config.pools:
            for reason, n in counts.rejected.of(pool).items():
                untrusted.add_metric([job, pool, reason], n)
        yield untrusted

        hist = HistogramMetricFamily(
            _PREFIX + "staleness", "Staleness of consumed groups (t_train - policy version).", labels=["job"]
        )
        bound = max(s.config.policy.max_staleness, max(counts.staleness_histogram, default=0))
        buckets, running = [], 0
        for k in range(bound + 1):
            running += counts.staleness_histogram.get(k, 0)
            buckets.append((str(float(k)), running))
        buckets.append(("+Inf", running))
        total = sum(k * v for k, v in counts.staleness_histogram.items())
        hist.add_metric([job], buckets, total)
        yield hist

        rejected = CounterMetricFamily(
            _PREFIX + "requests_rejected",
            "Rejected requests by status, code and field.",
            labels=["job", "status", "code", "field"],
        )
        for (status, code, field), n in sorted(self.rejections.counts.items()):
            rejected.add_metric([job, str(status), code, field], n)
        yield rejected

        if self.latency is not None:
            latency = HistogramMetricFamily(
                _PREFIX + "request_seconds",
                "Time from a request's arrival to its reply, per endpoint (lease and batches are long-polls).",
                labels=["job", "route"],
            )
            for route in sorted(self.latency.counts):
                running, buckets = 0, []
                for upper, n in zip(self.latency.buckets, self.latency.counts[route], strict=False):
                    running += n
                    buckets.append((repr(float(upper)), running))
                running += self.latency.counts[route][-1]
                buckets.append(("+Inf", running))
                latency.add_metric([job, route], buckets, self.latency.sums[route])
            yield latency


def registry_for(
    state: state_mod.CoordinatorState, rejections: Rejections, latency: Latency | None = None
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(state, rejections, latency))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
