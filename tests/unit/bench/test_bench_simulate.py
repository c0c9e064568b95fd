"""The simulator: closed-form cases computed by hand, the staleness and conservation invariants, determinism,
backpressure, failures, lease timeouts, and that a larger Δmax never lowers the trainer's busy fraction."""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo_runtime.bench.simulate import SimConfig, TrainerConfig, WorkerClass, simulate, windowed_rate
from echo_runtime.bench.simulate import sweep as sim_sweep
from echo_runtime.coordinator import counters

NEVER_STALE = 10**6
"""A Δmax no run here reaches: no group is ever refused, so closed forms need no drop term."""


def config(*classes: WorkerClass, trainer: TrainerConfig, **changes: Any) -> SimConfig:
    return SimConfig(worker_classes=classes, trainer=trainer, **changes)


def assert_books_balance(result: Any) -> None:
    g = result.groups
    assert g.created == g.pending + g.leased + g.buffered + g.consumed + g.dropped_stale
    assert g.generated == g.accepted + g.dropped_on_arrival + g.wasted
    assert g.accepted == g.consumed + g.dropped_in_buffer + g.buffered
    assert result.violations == 0
    bound = result.config.policy.bound
    assert all(0 <= s <= bound for s in result.staleness_histogram), result.staleness_histogram
    assert sum(
        result.staleness_histogram.values()
    ) == g.consumed == result.steps * result.config.batch_size or (
        g.consumed == (result.steps + 1) * result.config.batch_size  # a step still running at the end
    )


# ---------------------------------------------------------------------------------------- closed forms
def test_worker_bound_async_matches_hand_computation() -> None:
    """4 workers, 10 s per group, deterministic, the trainer far faster than the supply.

    Each worker finishes a group every 10 s after joining (uniformly within the first second), so by
    t = 10,000 s each finished 999 groups: 4 × 999 × 8 rollouts / 10,000 s = 3.1968 rollouts/s (the
    steady-state rate is W·n/g = 3.2). The trainer steps 1 s per batch of 4 groups, i.e. once per
    10 s: busy fraction 999 × 1 s / 10,000 s = 0.0999."""
    result = simulate(
        config(
            WorkerClass("cpu", 4, 10.0),
            trainer=TrainerConfig(step_seconds=1.0),
            max_staleness=NEVER_STALE,
            batch_size=4,
            buffer_size=1000,
            group_size=8,
            duration_seconds=10_000,
        )
    )
    assert result.rollouts_per_second == pytest.approx(4 * 999 * 8 / 10_000, rel=1e-9)
    assert result.trainer_busy_fraction == pytest.approx(999 * 1.0 / 10_000, rel=1e-9)
    assert result.classes["cpu"].utilisation == pytest.approx(1.0, abs=1e-3)
    # Under a bound this loose no worker is ever told to load: every group is of version 0.
    assert result.staleness_histogram == dict.fromkeys(range(999), 4)
    assert_books_balance(result)


def test_trainer_bound_async_matches_hand_computation() -> None:
    """10 workers supply 1 group/s; the trainer takes 4 groups per 8 s step + 2 s publish = 0.4 groups/s.

    Backpressure (buffer capacity 2 × 4 bounds pending + leased + buffered) holds the accepted rate to
    the trainer's: 0.4 groups/s × 8 = 3.2 rollouts/s; the trainer never waits: busy 8 / 10 = 0.8; the
    workers generate 0.4 groups/s × 10 s = 4 worker-seconds per second: utilisation 4/10 = 0.4."""
    result = simulate(
        config(
            WorkerClass("gpu", 10, 10.0),
            trainer=TrainerConfig(step_seconds=8.0, publish_seconds=2.0),
            max_staleness=NEVER_STALE,
            batch_size=4,
            group_size=8,
            duration_seconds=20_000,
        )
    )
    assert result.rollouts_per_second == pytest.approx(3.2, rel=0.01)
    assert result.consumed_rollouts_per_second == pytest.approx(3.2, rel=0.01)
    assert result.trainer_busy_fraction == pytest.approx(0.8, rel=0.01)
    assert result.trainer_publish_fraction == pytest.approx(0.2, rel=0.01)
    assert result.classes["gpu"].utilisation == pytest.approx(0.4, rel=0.01)
    assert_books_balance(result)


def test_sequential_round_time_is_load_plus_generation_plus_step_plus_publish() -> None:
    """Sequential, refresh threshold 0: every round each worker loads version t (10 MB at 10 MB/s + 1 s
    apply = 2 s), generates (10 s); then the trainer steps (3 s) and publishes (1 s): 16 s per version
    (the first round needs no load: 14 s). 4 workers = batch 4: 4 × 8 rollouts per 16 s = 2 rollouts/s,
    busy 3/16. Polls every 10 ms, so the retry wait is negligible."""
    result = simulate(
        config(
            WorkerClass("gpu", 4, 10.0, download_mbps=10.0, apply_seconds=1.0),
            trainer=TrainerConfig(step_seconds=3.0, publish_seconds=1.0),
            mode="Sequential",
            max_staleness=0,
            batch_size=4,
            group_size=8,
            snapshot_mb=10.0,
            poll_interval=0.01,
            duration_seconds=10_000,
        )
    )
    assert result.rollouts_per_second == pytest.approx(2.0, rel=0.005)
    assert result.trainer_busy_fraction == pytest.approx(3.0 / 16.0, rel=0.005)
    assert result.steps == pytest.approx((10_000 - 14) / 16 + 1, abs=1.5)
    assert result.classes["gpu"].loads == pytest.approx(4 * (result.steps - 1), abs=4)
    assert result.snapshot_egress_mb_per_s == pytest.approx(4 * 10.0 / 16.0, rel=0.01)
    assert result.staleness_histogram.keys() == {0}
    assert_books_balance(result)


def test_a_lease_long_poll_removes_the_poll_wait_from_every_sequential_round() -> None:
    """The round of the test above with the workers' long-poll (leaseWait 2, the default) instead of
    10 ms polls: the same 16 s per version. Polling every 1 s (leaseWait 0) adds a wait per round."""
    common: dict[str, Any] = {
        "trainer": TrainerConfig(step_seconds=3.0, publish_seconds=1.0),
        "mode": "Sequential",
        "max_staleness": 0,
        "batch_size": 4,
        "group_size": 8,
        "snapshot_mb": 10.0,
        "duration_seconds": 10_000,
    }
    gpu = WorkerClass("gpu", 4, 10.0, download_mbps=10.0, apply_seconds=1.0)
    long_poll = simulate(config(gpu, **common))
    polling = simulate(config(gpu, lease_wait=0.0, poll_interval=1.0, **common))
    assert long_poll.rollouts_per_second == pytest.approx(2.0, rel=0.005)
    assert long_poll.trainer_busy_fraction == pytest.approx(3.0 / 16.0, rel=0.005)
    assert polling.rollouts_per_second < 0.98 * long_poll.rollouts_per_second
    assert_books_balance(long_poll)
    assert_books_balance(polling)


def test_sequential_waits_for_its_slowest_worker_without_pacing() -> None:
    """A round of 2 tasks leased by a 1 s worker and a 9 s worker lasts 9 s: with polls every 10 ms and no
    snapshot cost, a version takes 9 s + 1 s step. Pacing in time passes the slow worker over once the
    fast one is known to keep up (the trainer's own step is 1 s), so it does more steps."""
    common: dict[str, Any] = {
        "mode": "Sequential",
        "max_staleness": 0,
        "batch_size": 2,
        "group_size": 1,
        "poll_interval": 0.01,
        "duration_seconds": 1000,
    }
    classes = (WorkerClass("fast", 1, 1.0), WorkerClass("slow", 1, 9.0))
    unpaced = simulate(config(*classes, trainer=TrainerConfig(step_seconds=1.0), pacing=False, **common))
    assert unpaced.steps == pytest.approx(1000 / 10.0, abs=1.5)
    paced = simulate(config(*classes, trainer=TrainerConfig(step_seconds=1.0), **common))
    assert_books_balance(paced)
    assert paced.steps > 1.05 * unpaced.steps


# ---------------------------------------------------------------------------------------- invariants
worker_classes = st.lists(
    st.builds(
        WorkerClass,
        name=st.sampled_from(["a", "b", "c"]),
        count=st.integers(0, 12),
        group_seconds=st.floats(0.5, 40.0),
        group_cv=st.floats(0.0, 0.8),
        download_mbps=st.sampled_from([1.0, 20.0, float("inf")]),
        apply_seconds=st.floats(0.0, 3.0),
        capacity=st.integers(1, 4),
        batch_scaling=st.floats(0.0, 1.0),
        mtbf_hours=st.sampled_from([None, 0.02, 0.2]),
        rejoin_seconds=st.floats(0.0, 60.0),
        start_seconds=st.floats(0.0, 30.0),
        overhead_seconds=st.floats(0.0, 0.5),
    ),
    min_size=1,
    max_size=3,
    unique_by=lambda c: c.name,
)


@st.composite
def configs(draw: st.DrawFn) -> SimConfig:
    mode = draw(st.sampled_from(["Async", "Sequential"]))
    delta = draw(st.integers(0, 4))
    batch = draw(st.integers(1, 8))
    return SimConfig(
        worker_classes=tuple(draw(worker_classes)),
        trainer=TrainerConfig(
            step_seconds=draw(st.floats(0.5, 20.0)),
            step_cv=draw(st.floats(0.0, 0.5)),
            publish_seconds=draw(st.floats(0.0, 3.0)),
            checkpoint_every=draw(st.integers(0, 5)),
            checkpoint_seconds=draw(st.floats(0.0, 5.0)),
            start_seconds=draw(st.floats(0.0, 20.0)),
        ),
        mode=mode,
        max_staleness=delta,
        refresh_threshold=draw(st.integers(0, delta)),
        stale_action=draw(st.sampled_from(["Drop", "ImportanceWeight"])),
        group_size=draw(st.integers(1, 8)),
        batch_size=batch,
        buffer_size=draw(st.one_of(st.none(), st.integers(batch, 4 * batch + 8))),
        snapshot_mb=draw(st.floats(0.0, 50.0)),
        duration_seconds=draw(st.floats(50.0, 900.0)),
        max_steps=draw(st.one_of(st.none(), st.integers(1, 40))),
        tail_seconds=draw(st.floats(0.0, 20.0)),
        lease_timeout=draw(st.floats(6.0, 40.0)),
        heartbeat_interval=5.0,
        task_timeout=draw(st.floats(5.0, 120.0)),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_no_consumed_group_exceeds_the_bound_and_every_group_is_accounted_for(cfg: SimConfig) -> None:
    result = simulate(cfg)  # the engine runs the ledger's own check() and the result's bookkeeping asserts
    g = result.groups
    assert result.violations == 0
    assert result.max_observed_staleness is None or result.max_observed_staleness <= cfg.policy.bound
    assert all(0 <= s <= cfg.policy.bound for s in result.staleness_histogram)
    assert g.created == g.pending + g.leased + g.buffered + g.consumed + g.dropped_stale
    assert g.generated == g.accepted + g.dropped_on_arrival + g.wasted
    assert g.accepted == g.consumed + g.dropped_in_buffer + g.buffered
    assert sum(result.staleness_histogram.values()) == g.consumed
    assert g.buffered <= (cfg.batch_size if cfg.mode == "Sequential" else cfg.buffer_capacity)
    assert 0.0 <= result.trainer_busy_fraction <= 1.0 + 1e-9
    for stats in result.classes.values():
        assert 0.0 <= stats.utilisation <= 1.0 + 1e-9
        assert 0.0 <= stats.load_fraction <= 1.0 + 1e-9
    if cfg.stale_action == "Drop":
        assert g.weighted == 0
    else:
        assert g.weighted == sum(v for k, v in result.staleness_histogram.items() if k > 0)
    if cfg.max_steps is not None:
        assert result.steps <= cfg.max_steps


def test_the_same_seed_gives_the_same_result_and_another_seed_another() -> None:
    cfg = config(
        WorkerClass("gpu", 8, 3.0, 0.4, mtbf_hours=0.1, rejoin_seconds=20, download_mbps=10),
        WorkerClass("cpu", 20, 30.0, 0.3, mtbf_hours=0.3, rejoin_seconds=40, download_mbps=2),
        trainer=TrainerConfig(5.0, 0.2, publish_seconds=1.0),
        max_staleness=2,
        batch_size=8,
        snapshot_mb=20,
        duration_seconds=3000,
        seed=7,
    )
    first, second = simulate(cfg).to_mapping(), simulate(cfg).to_mapping()
    other = simulate(cfg.replace(seed=8)).to_mapping()
    for doc in (first, second, other):
        doc.pop("wallSeconds")
    assert first == second
    assert first != other


# ---------------------------------------------------------------------------------------- protocol effects
def test_backpressure_bounds_the_work_in_flight_by_the_buffer_capacity() -> None:
    """100 workers but a buffer of 6: at most 6 tasks are ever outstanding, so utilisation ≤ 6 %."""
    result = simulate(
        config(
            WorkerClass("cpu", 100, 5.0),
            trainer=TrainerConfig(step_seconds=1.0),
            max_staleness=NEVER_STALE,
            batch_size=3,
            buffer_size=6,
            duration_seconds=2000,
        )
    )
    assert result.classes["cpu"].utilisation <= 0.06 + 1e-6  # float sums of busy intervals
    assert result.classes["cpu"].idle_fraction >= 0.94 - 1e-6
    assert_books_balance(result)


def test_failed_workers_leases_are_reissued_and_the_work_in_flight_is_lost_not_dropped() -> None:
    result = simulate(
        config(
            WorkerClass("laptop", 20, 20.0, 0.2, mtbf_hours=0.05, rejoin_seconds=30),
            trainer=TrainerConfig(step_seconds=2.0),
            max_staleness=NEVER_STALE,
            batch_size=4,
            buffer_size=40,
            lease_timeout=15.0,
            heartbeat_interval=1.0,
            duration_seconds=3600,
        )
    )
    g = result.groups
    assert result.classes["laptop"].failures > 50
    assert g.lost_in_flight > 0
    assert g.reissued >= g.lost_in_flight - 20  # all but those whose lease had not yet expired at the end
    assert result.classes["laptop"].lost_seconds > 0
    assert_books_balance(result)


def test_a_generation_longer_than_the_task_timeout_is_wasted_and_reissued() -> None:
    result = simulate(
        config(
            WorkerClass("cpu", 2, 100.0),
            trainer=TrainerConfig(step_seconds=1.0),
            max_staleness=NEVER_STALE,
            batch_size=1,
            task_timeout=60.0,
            duration_seconds=1000,
        )
    )
    g = result.groups
    assert g.consumed == 0 and g.wasted > 0 and g.reissued > 0
    assert_books_balance(result)


def test_slow_groups_beyond_the_bound_are_dropped_and_counted_without_pacing() -> None:
    """A coordinator without pacing. Supply below demand, so nothing queues: a version every ~4 s. A class
    that takes 15 s per group (≥ 3 versions) contributes nothing at Δmax 0 (all dropped on arrival) and a
    good share at Δmax 4 — not most: a worker reloads only once its version breaks the bound, so it starts
    a group with a version already up to 4 behind (docs/simulate.md, "What the simulator shows")."""
    classes = (WorkerClass("fast", 1, 4.0), WorkerClass("slow", 4, 15.0))
    trainer = TrainerConfig(step_seconds=1.0, publish_seconds=0.5)
    common: dict[str, Any] = {"batch_size": 2, "buffer_size": 20, "duration_seconds": 3000, "pacing": False}
    strict = simulate(config(*classes, trainer=trainer, max_staleness=0, **common))
    loose = simulate(config(*classes, trainer=trainer, max_staleness=4, **common))
    assert strict.classes["slow"].consumed_groups == 0
    assert strict.groups.dropped_on_arrival >= strict.classes["slow"].groups - 4
    assert loose.classes["slow"].consumed_groups > 0.3 * loose.classes["slow"].groups
    assert loose.groups.dropped_stale < strict.groups.dropped_stale
    assert loose.trainer_busy_fraction > strict.trainer_busy_fraction


def test_slow_leases_can_hold_a_small_buffer_and_stall_the_trainer_without_pacing() -> None:
    """A coordinator without pacing: the capacity bounds pending + leased + buffered tasks; with the
    default buffer (2 × batch = 4) four slow workers can hold every lease, so the trainer waits for their
    15 s groups — which are then fresh, because t_train could not move meanwhile."""
    classes = (WorkerClass("fast", 2, 1.0), WorkerClass("slow", 4, 15.0))
    trainer = TrainerConfig(step_seconds=4.0, publish_seconds=1.0)
    common: dict[str, Any] = {"max_staleness": 0, "batch_size": 2, "duration_seconds": 2000, "pacing": False}
    small = simulate(config(*classes, trainer=trainer, **common))
    large = simulate(config(*classes, trainer=trainer, buffer_size=50, **common))
    assert small.classes["slow"].consumed_groups > 0
    assert small.trainer_busy_fraction < 0.9 * large.trainer_busy_fraction


def test_larger_max_staleness_never_lowers_the_busy_fraction_of_a_saturated_swarm() -> None:
    """Enough workers to keep the trainer busy, but the slow ones' groups age by several versions."""
    base = config(
        WorkerClass("fast", 4, 3.0, 0.2, download_mbps=50, apply_seconds=0.2),
        WorkerClass(
            "slow", 24, 25.0, 0.3, download_mbps=5, apply_seconds=1.0, mtbf_hours=0.5, rejoin_seconds=30
        ),
        trainer=TrainerConfig(4.0, 0.1, publish_seconds=1.0),
        batch_size=8,
        buffer_size=40,
        snapshot_mb=5,
        group_size=4,
        duration_seconds=1500,
    )
    points = sim_sweep.sweep(base, max_staleness=[0, 1, 2, 3, 4, 6, 8, 16], seeds=2)
    busy = [p.mean("trainerBusyFraction") for p in points]
    assert all(b >= a - 0.005 for a, b in itertools.pairwise(busy)), busy
    assert busy[-1] > busy[0] + 0.3
    # Sequential mode's bound is the refresh threshold: Δmax alone changes nothing.
    sequential = sim_sweep.sweep(base.replace(mode="Sequential"), max_staleness=[0, 4], seeds=1)
    assert sequential[0].mean("trainerBusyFraction") == sequential[1].mean("trainerBusyFraction")


def test_thousands_of_workers_for_an_hour_simulate_in_seconds() -> None:
    result = simulate(
        config(
            WorkerClass("gpu", 200, 5.0, 0.2, download_mbps=100, capacity=4, batch_scaling=0.2),
            WorkerClass("laptop", 2000, 90.0, 0.3, download_mbps=10, mtbf_hours=2, rejoin_seconds=300),
            trainer=TrainerConfig(step_seconds=15.0, publish_seconds=2.0),
            max_staleness=4,
            batch_size=256,
            buffer_size=3000,
            snapshot_mb=60,
            duration_seconds=3600,
        )
    )
    assert result.steps > 100
    assert result.wall_seconds < 60  # ~5 s on one idle core; generous for a loaded shared machine
    assert_books_balance(result)


# ---------------------------------------------------------------------------------------- rate estimator
def test_windowed_rate_is_the_coordinators_rate_window() -> None:
    rng = random.Random(3)
    times = sorted(rng.uniform(0.0, 120.0) for _ in range(400))
    samples = [0.5 + 0.7 * i for i in range(170)]
    window = counters.RateWindow(30.0, now=0.0)
    expected, fed = [], 0
    for s in samples:
        while fed < len(times) and times[fed] <= s:
            window.add(times[fed], 4)
            fed += 1
        expected.append(window.rate(s))
    assert list(windowed_rate(times, 4, samples, started=0.0)) == pytest.approx(expected)


def test_result_mapping_is_json_ready() -> None:
    import json

    result = simulate(config(WorkerClass("a", 2, 1.0), trainer=TrainerConfig(1.0), duration_seconds=100))
    doc = json.loads(json.dumps(result.to_mapping()))
    assert doc["config"]["workerClasses"][0]["downloadMBps"] == "inf"
    assert set(doc["groups"]) >= {"created", "consumed", "droppedStale", "wasted", "lostInFlight"}
    assert dataclasses.asdict(result.groups)["created"] == doc["groups"]["created"]


@pytest.mark.parametrize("dmax", [0, 1, 2, 4])
def test_pacing_drops_nothing_from_workers_faster_than_the_trainer(dmax: int) -> None:
    """Four workers that each finish a group in 0.2 s feed a trainer that steps every 3.2 s: without
    pacing they refill the buffer at a version that goes stale before it is consumed; with it they lease
    only what is consumed in bound, so nothing is dropped, less is generated, and the steps are no
    fewer (the CPU not spent on doomed groups is the trainer's here only in the real runs)."""
    classes = (WorkerClass("fast", 4, 0.2),)
    trainer = TrainerConfig(step_seconds=3.0, publish_seconds=0.2)
    common: dict[str, Any] = {"max_staleness": dmax, "batch_size": 8, "duration_seconds": 600}
    paced = simulate(config(*classes, trainer=trainer, **common))
    unpaced = simulate(config(*classes, trainer=trainer, pacing=False, **common))
    assert_books_balance(paced)
    assert paced.groups.dropped_stale == 0 and unpaced.groups.dropped_stale > 0.25 * unpaced.groups.generated
    assert paced.groups.generated < unpaced.groups.generated
    assert paced.steps >= unpaced.steps


def test_pacing_with_slow_workers_trades_waste_for_waiting() -> None:
    """The slow class of the test above, paced. At Δmax 4 fewer groups are dropped and the trainer gets
    further; at Δmax 0 no slow group is dropped at all — pacing leases only what the next step consumes —
    but the trainer then waits for the slow groups it leased out (docs/simulate.md)."""
    classes = (WorkerClass("fast", 1, 4.0), WorkerClass("slow", 4, 15.0))
    trainer = TrainerConfig(step_seconds=1.0, publish_seconds=0.5)
    common: dict[str, Any] = {"batch_size": 2, "buffer_size": 20, "duration_seconds": 3000}
    paced = {d: simulate(config(*classes, trainer=trainer, max_staleness=d, **common)) for d in (0, 4)}
    unpaced = {
        d: simulate(config(*classes, trainer=trainer, max_staleness=d, pacing=False, **common))
        for d in (0, 4)
    }
    for result in paced.values():
        assert_books_balance(result)
    assert paced[4].groups.dropped_stale < unpaced[4].groups.dropped_stale
    assert paced[4].steps > unpaced[4].steps
    assert paced[0].groups.dropped_stale == 0 < paced[0].classes["slow"].consumed_groups
    assert paced[0].steps < unpaced[0].steps
