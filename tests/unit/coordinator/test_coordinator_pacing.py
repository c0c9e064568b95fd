"""Pacing (coordinator.state with staleness.lease_floor): lease only what can be consumed in bound.

Workers much faster than the trainer used to fill the buffer with groups of the version they held,
which went stale while they waited and were dropped. These properties drive the state machine with
obedient workers — they load what they are told and what their tasks' ``minVersion`` asks — under any
interleaving of leases, submissions and trainer steps:

* a group submitted before the trainer took another batch (a fast worker) is never dropped as stale;
* no prompt is lost: every prompt drawn is consumed, or still pending, leased or buffered;
* the bound holds and every step gets a full batch, as without pacing.
"""

from __future__ import annotations

import collections
from typing import TypeVar

import pytest
from coordinator_helpers import config, group, make_state, register
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_runtime import staleness
from echo_runtime.coordinator import buffer, pacing, quarantine, roster, state, wire


class Swarm:
    """Obedient workers and a trainer around one coordinator state, with the bookkeeping to check."""

    def __init__(self, s: state.CoordinatorState, workers: int, capacity: int) -> None:
        self.s = s
        self.ids = [register(s, capacity=capacity) for _ in range(workers)]
        self.loaded = dict.fromkeys(self.ids, 0)
        self.held: dict[str, list[tuple[wire.TaskOut, int]]] = collections.defaultdict(list)
        """Leased tasks per worker, with the number of batches taken when they were leased."""
        self.problem_of: dict[str, str] = {}
        self.consumed: list[str] = []
        self.batches = 0
        self.fast: list[str] = []
        """Tasks whose group was submitted before the trainer took another batch."""
        self.version = 0

    def lease(self, i: int) -> None:
        w = self.ids[i % len(self.ids)]
        reply = self.s.lease(w, 8, 0.0, self.loaded[w])
        need = max((t.min_version for t in reply.tasks), default=0)
        if reply.load_version is not None or self.loaded[w] < need:  # the worker loop's ensure_version
            self.loaded[w] = self.s.published
            self.s.heartbeat(w, wire.HeartbeatRequest(loaded_version=self.loaded[w]), 0.0)
        assert self.loaded[w] >= need, "a task asked for a version that was not published"
        for task in reply.tasks:
            self.problem_of[task.task_id] = task.problem_id
            self.held[w].append((task, self.batches))

    def submit(self, i: int) -> None:
        w = self.ids[i % len(self.ids)]
        for task, leased_at in self.held.pop(w, []):
            self.s.submit(w, task.task_id, group(self.s, task, self.loaded[w]), 0.0)
            if leased_at == self.batches:
                self.fast.append(task.task_id)

    def fast_drops(self) -> int:
        """Fast groups dropped as stale, on arrival or later in the buffer."""
        return sum(1 for task_id in self.fast if (self.s.ledger.outcome(task_id) or ("",))[0] == "dropped")

    def train(self) -> None:
        batch = self.s.pull_batch(self.version, 0.0)
        if not batch.ready:
            return
        policy = self.s.config.policy
        assert len(batch.groups) == self.s.config.batch_size
        for g in batch.groups:
            assert staleness.admit(g.policy_version, self.version, policy).consume
            self.consumed.append(g.problem_id)
        self.batches += 1
        self.version += 1
        self.s.announce(self.version)


S = TypeVar("S", bound="Swarm")

SWARMS = {
    "dmax": st.integers(0, 3),
    "batch": st.integers(1, 4),
    "workers": st.integers(1, 3),
    "capacity": st.integers(1, 8),
}
"""The coordinators and swarms the pacing properties are drawn over."""


def move_lists(kinds: list[str], most: int) -> st.SearchStrategy[list[tuple[str, int]]]:
    return st.lists(st.tuples(st.sampled_from(kinds), st.integers(0, 2)), max_size=most)


def play(
    kind: type[S], dmax: int, batch: int, workers: int, capacity: int, moves: list[tuple[str, int]]
) -> tuple[state.CoordinatorState, S]:
    """A coordinator and a swarm of ``kind`` after ``moves`` (worker moves name the worker by index)."""
    s = make_state(config("Async", dmax, batch_size=batch, capacity=2 * batch + 2, group_size=2))
    swarm = kind(s, workers, capacity)
    for move, i in moves:
        getattr(swarm, move)(i) if move != "train" else swarm.train()
    return s, swarm


@settings(max_examples=200, deadline=None)
@given(**SWARMS, moves=move_lists(["lease", "submit", "train"], 120))
def test_fast_workers_are_never_dropped_and_no_prompt_is_lost(
    dmax: int, batch: int, workers: int, capacity: int, moves: list[tuple[str, int]]
) -> None:
    s, swarm = play(Swarm, dmax, batch, workers, capacity, moves)
    assert swarm.fast_drops() == 0, "a group submitted before the next batch was dropped as stale"
    drawn = set(swarm.problem_of.values())
    outstanding = [e.payload.problem.id for e in s.ledger.outstanding_entries()]
    assert len(outstanding) == len(set(outstanding))
    assert drawn <= set(swarm.consumed) | set(outstanding), "a prompt was drawn and then lost"
    assert len(swarm.consumed) == len(set(swarm.consumed)) == swarm.batches * batch
    assert s.counters.requeued_prompts == s.counters.dropped_stale


@pytest.mark.parametrize("dmax", [0, 1, 2, 4])
@pytest.mark.parametrize("pacing", [True, False])
def test_workers_much_faster_than_the_trainer(dmax: int, pacing: bool) -> None:
    """Ten worker rounds per optimizer step: with pacing nothing is dropped, without it most is."""
    s = make_state(config("Async", dmax, batch_size=4, capacity=16, group_size=2, pacing=pacing))
    swarm = Swarm(s, workers=2, capacity=8)
    for _ in range(40):
        for i in range(10):
            swarm.lease(i)
            swarm.submit(i)
        swarm.train()
    generated = s.counters.generated_groups
    assert swarm.batches == 40 and generated >= 40 * 4
    if pacing:
        assert s.counters.dropped_stale == 0 and swarm.fast_drops() == 0
    else:
        assert (
            s.counters.dropped_stale > generated / 4
        )  # what pacing saves: the buffer refilled at an old version
    assert s.counters.requeued_prompts == s.counters.dropped_stale


def test_a_known_slow_worker_is_passed_over_while_a_fast_one_keeps_up() -> None:
    s = make_state(config("Async", 1, batch_size=2, capacity=8, group_size=2))
    fast, slow = register(s, capacity=2), register(s, capacity=2)
    now = 0.0
    for version in range(3):  # the fast worker feeds three steps of 1 s each; the slow one took 30 s once
        for task in s.lease(fast, 2, now, version).tasks:
            s.submit(fast, task.task_id, group(s, task, version), now + 0.5)
        now += 0.5
        if version == 0:
            (task,) = s.lease(slow, 1, now, 0).tasks
            s.submit(slow, task.task_id, group(s, task, 0), now + 30.0)
        assert s.pull_batch(version, now).ready
        now += 1.0
        s.announce(version + 1)
        s.heartbeat(fast, wire.HeartbeatRequest(loaded_version=version + 1), now)
        s.heartbeat(slow, wire.HeartbeatRequest(loaded_version=version + 1), now)
    assert s.lease(slow, 2, now, 3).tasks == []  # 30 s per group, 1 s per step, Δmax 1: too slow
    assert s.lease(fast, 2, now, 3).tasks
    s.leave(fast)
    now += 1.5  # (the fastest speed is looked up at most once a second)
    s.heartbeat(slow, wire.HeartbeatRequest(loaded_version=3), now)
    assert s.lease(slow, 2, now, 3).tasks  # alone now: rather the slow worker than a starved trainer


def test_a_stragglers_lease_gives_its_place_to_a_worker_that_delivers() -> None:
    """Δmax 0: a step's two positions are all there is. A worker that sits on them for more than three
    typical group times no longer holds them up: another worker gets them (a backup task); whichever
    group comes first is consumed, the other is dropped and counted."""
    s = make_state(config("Async", 0, batch_size=2, capacity=8, group_size=2))
    quick, stuck = register(s, capacity=2), register(s, capacity=2)
    for task in s.lease(quick, 2, 0.0, 0).tasks:  # typical group: 1 s
        s.submit(quick, task.task_id, group(s, task, 0), 1.0)
    assert s.pull_batch(0, 1.0).ready
    s.announce(1)
    held = s.lease(stuck, 2, 1.0, 1).tasks
    assert len(held) == 2 and s.lease(quick, 2, 2.0, 1).tasks == []  # both positions are taken
    backup = s.lease(quick, 2, 4.5, 1).tasks  # 3.5 s later: more than 3 × 1 s
    assert len(backup) == 2
    for task in backup:
        s.submit(quick, task.task_id, group(s, task, 1), 5.0)
    assert s.pull_batch(1, 5.0).ready
    s.announce(2)
    late = s.submit(stuck, held[0].task_id, group(s, held[0], 1), 9.0)
    assert late.outcome == "dropped" and s.counters.requeued_prompts == 1


class PrefetchingSwarm(Swarm):
    """A trainer that asks for the batch of ``v + 1`` as soon as it starts the step to ``v + 1``, before
    ``v + 1`` is published and announced (trainer/overlap.py); the announcement comes later, whenever the
    background upload finishes, but before the next step's publish (one publish in flight)."""

    def __init__(self, s: state.CoordinatorState, workers: int, capacity: int) -> None:
        super().__init__(s, workers, capacity)
        self.held_batch: wire.BatchReply | None = None
        self.announced = 0
        self.prefetched = 0
        """Steps whose next batch was ready the moment the step started (the trainer never waits)."""

    def train(self) -> None:
        if self.held_batch is None:
            batch = self.s.pull_batch(self.version, 0.0, step_seconds=1.0)
            if not batch.ready:
                return
            policy = self.s.config.policy
            assert len(batch.groups) == self.s.config.batch_size
            for g in batch.groups:
                assert staleness.admit(g.policy_version, self.version, policy).consume
                assert g.policy_version <= self.announced, "a group claims a version nobody announced"
                self.consumed.append(g.problem_id)
            self.held_batch = batch
            return
        if self.announced < self.version:  # the previous publish finishes before this step's starts
            self.publish(0)
        self.held_batch = None  # the step runs; the batch of version + 1 is asked for at once
        self.batches += 1
        self.version += 1
        self.train()
        self.prefetched += self.held_batch is not None

    def publish(self, _i: int) -> None:
        if self.announced < self.version:
            self.announced = self.version
            self.s.announce(self.version)


@settings(max_examples=200, deadline=None)
@given(**SWARMS, moves=move_lists(["lease", "submit", "train", "publish"], 160))
def test_a_trainer_that_asks_before_it_announces_keeps_the_bound_and_loses_no_prompt(
    dmax: int, batch: int, workers: int, capacity: int, moves: list[tuple[str, int]]
) -> None:
    s, swarm = play(PrefetchingSwarm, dmax, batch, workers, capacity, moves)
    drawn = set(swarm.problem_of.values())
    outstanding = [e.payload.problem.id for e in s.ledger.outstanding_entries()]
    assert drawn <= set(swarm.consumed) | set(outstanding), "a prompt was drawn and then lost"
    taken = swarm.batches + (swarm.held_batch is not None)
    assert len(swarm.consumed) == len(set(swarm.consumed)) == taken * batch
    assert s.pacing.trainer_seconds in (None, 1.0)  # the pace it was told, not the gap between requests


@pytest.mark.parametrize("dmax", [1, 2, 4])
def test_with_room_in_the_bound_the_prefetched_batch_is_ready_when_the_step_starts(dmax: int) -> None:
    """Workers that keep up and Δmax ≥ 1: the batch of v + 1 can be generated at v, so it is ready the
    moment the step to v + 1 starts, before v + 1 is published; pacing, told the trainer's pace, drops
    nothing. (At Δmax 0 the batch of v + 1 needs v + 1 published: the trainer waits for generation.)"""
    s = make_state(config("Async", dmax, batch_size=4, capacity=16, group_size=2))
    swarm = PrefetchingSwarm(s, workers=2, capacity=8)
    for _ in range(30):
        for i in range(10):
            swarm.lease(i)
            swarm.submit(i)
        swarm.train()
        swarm.publish(0)
    assert swarm.batches == 29 and swarm.prefetched == swarm.batches
    assert s.counters.dropped_stale == 0 and 1 <= (s.counters.max_observed_staleness or 0) <= dmax


# ------------------------------------------------------------------------------ the Pacing part on its own
def paced_worker(group_seconds: float | None = None, caught: bool = False) -> roster.WorkerRecord:
    r = roster.Roster(config())
    req = wire.RegisterRequest(pool="cpu", backend="transformers", device="cpu", dtype="float32", capacity=8)
    worker = r.register(req, b"digest", 0.0, quarantine.Quarantines())
    worker.group_seconds = group_seconds
    if caught:
        worker.quarantine = quarantine.Quarantine(worker.id, "cpu", None, "caught", None, 0)
    return worker


def test_a_floor_is_the_version_a_group_needs_at_the_step_its_place_in_line_is_consumed() -> None:
    # Δmax 1, batch 2, at step 3: places 0-1 are consumed at step 3 (floor 2), 2-3 at 4, 4 at 5.
    at = pacing.Versions(t_train=3, published=3, next_step=3)
    paced = pacing.Pacing(config("Async", 1, batch_size=2, capacity=8))
    assert [paced.floor(k, at) for k in range(5)] == [2, 2, 3, 3, 4]
    taken = pacing.Versions(
        t_train=3, published=3, next_step=4
    )  # step 3's batch went out: next in line is 4's
    assert [paced.floor(k, taken) for k in range(3)] == [3, 3, 4]
    unpaced = pacing.Pacing(config("Async", 1, batch_size=2, capacity=8, pacing=False))
    assert [unpaced.floor(k, at) for k in range(5)] == [2] * 5  # t_train - bound, wherever in line
    assert paced.floor(0, pacing.Versions(0, 0, 0)) == 0  # never below the base model


def test_leases_are_granted_only_up_to_what_a_published_version_can_fill() -> None:
    p = pacing.Pacing(config("Async", 1, batch_size=2, capacity=8))
    worker = paced_worker()
    at = pacing.Versions(t_train=3, published=3, next_step=3)  # published 3 is consumable up to step 4
    assert p.paced(10, worker, 0, at, 0.0, [worker]) == 4  # steps 3 and 4, two groups each
    assert p.paced(10, worker, 3, at, 0.0, [worker]) == 1
    assert p.paced(2, worker, 1, at, 0.0, [worker]) == 2  # asked for less than the room
    assert p.paced(10, worker, 0, pacing.Versions(3, 3, 4), 0.0, [worker]) == 2  # step 3's batch taken
    assert p.paced(10, worker, 0, pacing.Versions(3, 1, 3), 0.0, [worker]) == 0  # 1 is too old for step 3
    unpaced = pacing.Pacing(config("Async", 1, batch_size=2, capacity=8, pacing=False))
    assert unpaced.paced(10, worker, 6, pacing.Versions(3, 1, 3), 0.0, [worker]) == 10


def test_a_worker_slower_than_the_budget_waits_while_a_faster_one_is_live() -> None:
    # Δmax 1 at step 3 with 3 published: a group leased now may take two trainer steps.
    at = pacing.Versions(t_train=3, published=3, next_step=3)
    slow, fast = paced_worker(group_seconds=5.0), paced_worker(group_seconds=1.0)
    p = pacing.Pacing(config("Async", 1, batch_size=2, capacity=8))
    p.asked(3, now=0.0, step_seconds=2.0, last_version=None)  # budget 2 steps x 2 s = 4 s
    assert p.paced(4, slow, 0, at, 0.0, [slow, fast]) == 0
    assert p.paced(4, fast, 0, at, 0.0, [slow, fast]) == 4
    alone = pacing.Pacing(config("Async", 1, batch_size=2, capacity=8))
    alone.asked(3, now=0.0, step_seconds=2.0, last_version=None)
    assert alone.paced(4, slow, 0, at, 0.0, [slow]) == 4  # nobody is faster: the trainer must not starve
    unknown = pacing.Pacing(config("Async", 1, batch_size=2, capacity=8))
    unknown.asked(3, now=0.0, step_seconds=2.0, last_version=None)
    caught_fast = paced_worker(group_seconds=1.0, caught=True)
    assert unknown.paced(4, slow, 0, at, 0.0, [slow, caught_fast]) == 4  # a caught worker is not a rival


def test_a_waiting_trainer_widens_the_budget_as_long_as_it_waits() -> None:
    at = pacing.Versions(t_train=3, published=3, next_step=3)
    p = pacing.Pacing(config("Async", 1, batch_size=2, capacity=8))
    assert p.pace_seconds(0.0, at) is None  # no pace known: nobody is passed over
    p.asked(3, now=10.0, step_seconds=2.0, last_version=None)
    assert p.pace_seconds(11.0, at) == 2.0
    assert p.pace_seconds(15.0, at) == 5.0  # waited 5 s for the batch of 3
    assert p.pace_seconds(15.0, pacing.Versions(3, 3, 4)) == 2.0  # the batch went out: no longer waiting
    slow, fast = paced_worker(group_seconds=11.0), paced_worker(group_seconds=1.0)
    assert p.paced(4, slow, 0, at, 12.0, [slow, fast]) == 0  # budget 2 x 2 s
    assert p.paced(4, slow, 0, at, 16.0, [slow, fast]) == 4  # budget 2 x 6 s: the slow one may help


def test_the_trainer_pace_is_what_it_says_or_else_the_gap_after_a_batch() -> None:
    told = pacing.Pacing(config())
    told.asked(1, now=0.0, step_seconds=3.0, last_version=0)
    assert told.trainer_seconds == 3.0  # the first measurement is taken as it is
    told.asked(1, now=5.0, step_seconds=100.0, last_version=0)  # the same step asked again: not a new one
    assert told.trainer_seconds == 3.0
    told.asked(2, now=9.0, step_seconds=5.0, last_version=1)
    assert told.trainer_seconds is not None and 3.0 < told.trainer_seconds < 5.0  # moves towards 5
    assert told.trainer_busy_seconds == 8.0  # each step's time once: 3 + 5, the repeated ask not counted
    gap = pacing.Pacing(config())
    gap.asked(1, now=0.0, step_seconds=None, last_version=None)
    assert gap.trainer_seconds is None  # nothing handed yet to measure from
    gap.taken(10.0)
    gap.asked(3, now=14.0, step_seconds=None, last_version=1)  # not the step after the last batch
    assert gap.trainer_seconds is None
    gap.taken(20.0)
    gap.asked(4, now=23.5, step_seconds=None, last_version=3)
    assert gap.trainer_seconds == 3.5
    gap.rewound()  # a resumed trainer: its next request is a first one again
    gap.asked(4, now=30.0, step_seconds=1.0, last_version=3)
    assert gap.trainer_seconds is not None and 1.0 < gap.trainer_seconds < 3.5
    assert gap.trainer_busy_seconds == 4.5


def test_group_times_move_towards_each_delivery_and_make_old_leases_stragglers() -> None:
    p = pacing.Pacing(config("Async", 1, batch_size=2, capacity=8))
    worker = paced_worker()
    p.delivered(worker, 2.0)
    assert worker.group_seconds == p.typical_group_seconds == 2.0
    p.delivered(worker, 4.0)
    assert worker.group_seconds is not None and 2.0 < worker.group_seconds < 4.0
    assert p.typical_group_seconds is not None and 2.0 < p.typical_group_seconds < 4.0
    ledger: buffer.TaskLedger[str, str] = buffer.TaskLedger(8)
    for i in range(4):
        ledger.add(f"t{i}", "payload")
    ledger.lease("w", 2, now=0.0, deadline=100.0)
    ledger.lease("w", 1, now=9.0, deadline=100.0)
    typical = p.typical_group_seconds
    assert typical is not None
    late = staleness.STRAGGLER_FACTOR * typical
    assert late < 9.0 and p.ahead(ledger, 9.5) == 1  # the two leases of t=0 are stragglers, not t=9's
    assert p.ahead(ledger, late - 0.01) == 3 and p.ahead(ledger, late + 0.01) == 1
    unpaced = pacing.Pacing(config("Async", 1, batch_size=2, capacity=8, pacing=False))
    unpaced.delivered(worker, 0.1)
    assert unpaced.ahead(ledger, 1000.0) == 3  # without pacing every lease counts


def test_what_a_workers_next_task_needs() -> None:
    ledger: buffer.TaskLedger[str, str] = buffer.TaskLedger(8)
    at = pacing.Versions(t_train=5, published=4, next_step=5)
    sequential = pacing.Pacing(config("Sequential", 3, refresh=1, batch_size=2, capacity=8))
    assert sequential.need(ledger, at, 0.0) == 4  # the round's t - refreshThreshold
    assert sequential.need(ledger, pacing.Versions(5, 3, 5), 0.0) == 3  # never above published
    paced = pacing.Pacing(config("Async", 2, batch_size=2, capacity=8))
    assert paced.need(ledger, at, 0.0) == 3  # the floor of place 0: step 5 - Δmax 2
    for i in range(4):
        ledger.add(f"t{i}", "payload")
    ledger.lease("w", 4, now=0.0, deadline=100.0)
    assert paced.need(ledger, at, 0.0) == 4  # place 4 is consumed at step 7: 7 - 2 = 5, capped at 4
