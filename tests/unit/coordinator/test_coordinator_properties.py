"""Property tests of the coordinator's core promise, on the state machine with a fake clock.

Under any interleaving of registrations, heartbeats (obeyed or not), leases, submissions (valid, stale,
malformed, late), clock jumps with lease expiry, publishes, batch pulls (also ahead of the published
version, and repeated) and departures, in both modes and with both stale actions:

* no batch ever contains a rollout with staleness > Δmax (and every group passes ``admit``);
* no group is delivered twice;
* no task is silently lost: created = pending + leased + buffered + consumed + dropped, every drop is
  counted in ``droppedStale`` or ``droppedQuarantined``, and every dropped group's prompt is back in the
  queue (``requeuedPrompts``);
* a rollout may only claim a version its worker was told to load or reported holding;
* tasks are tagged at least ``t_train − bound`` and never above the published version;
* nothing from a quarantined worker is delivered after its quarantine;
* a rejected request changes nothing; t_train never decreases; the buffer stays within its capacity.
"""

from __future__ import annotations

import math

import pytest
from coordinator_helpers import config, group, make_state, register, rollout
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from echo_runtime import staleness
from echo_runtime.coordinator import errors, signal, state, wire


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s: state.CoordinatorState
        self.now = 0.0
        self.loaded: dict[str, int | None] = {}
        self.known: dict[str, set[int]] = {}
        """Per worker: the versions it was told to load or reported holding (the claims it may make)."""
        self.banned: set[str] = set()
        self.tasks: dict[str, tuple[str, wire.TaskOut]] = {}
        self.delivered: set[str] = set()
        self.last_t = 0
        self.last_batch: wire.BatchReply | None = None

    @initialize(
        mode=st.sampled_from(["Sequential", "Async"]),
        dmax=st.integers(0, 3),
        action=st.sampled_from(["Drop", "ImportanceWeight"]),
        refresh_frac=st.floats(0, 1),
        batch=st.integers(1, 3),
        extra=st.integers(0, 3),
        group_size=st.integers(1, 3),
        dynamic=st.booleans(),
    )
    def setup(
        self,
        mode: staleness.Mode,
        dmax: int,
        action: staleness.StaleAction,
        refresh_frac: float,
        batch: int,
        extra: int,
        group_size: int,
        dynamic: bool,
    ) -> None:
        cfg = config(
            mode,
            dmax,
            action,
            int(refresh_frac * dmax),
            batch_size=batch,
            capacity=batch + extra,
            group_size=group_size,
            lease_timeout=10.0,
            task_timeout=15.0,
            dynamic_sampling=dynamic,
        )
        self.s = make_state(cfg)

    def snapshot(self) -> tuple[object, ...]:
        s, ledger = self.s, self.s.ledger
        return (
            ledger.created,
            ledger.pending,
            ledger.leased,
            ledger.buffered,
            ledger.consumed,
            ledger.dropped,
            s.counters.dropped_stale,
            s.counters.accepted_rollouts,
            s.t_train,
            s.published,
            s.counters.consumed_groups,
        )

    def worker(self, index: int) -> str:
        return list(self.loaded)[index % len(self.loaded)]  # insertion order: ids are random

    # ----------------------------------------------------------------------------------- workers
    @precondition(lambda self: len(self.loaded) < 4)
    @rule()
    def join(self) -> None:
        worker = register(self.s, self.now, capacity=2)
        self.loaded[worker] = None
        self.known[worker] = {self.s.published}  # registering, it is told to load the newest version

    def told(self, worker: str, reply: wire.Instructions, reported: int | None) -> None:
        if reply.load_version is not None:
            self.known[worker].add(reply.load_version)
        if reported is not None:
            self.known[worker].add(reported)

    def forget(self, worker: str) -> None:
        del self.loaded[worker]
        self.known.pop(worker, None)

    @precondition(lambda self: self.loaded)
    @rule(index=st.integers(0, 3), obey=st.booleans())
    def heartbeat(self, index: int, obey: bool) -> None:
        worker = self.worker(index)
        try:
            reply = self.s.heartbeat(
                worker, wire.HeartbeatRequest(loaded_version=self.loaded[worker]), self.now
            )
        except errors.Rejected as exc:
            assert exc.code in ("unknown_worker", "quarantined")
            self.forget(worker)
            return
        self.told(worker, reply, self.loaded[worker])
        if obey and reply.load_version is not None:
            self.loaded[worker] = reply.load_version

    @precondition(lambda self: self.loaded)
    @rule(index=st.integers(0, 3), count=st.integers(1, 3))
    def lease(self, index: int, count: int) -> None:
        worker = self.worker(index)
        try:
            reply = self.s.lease(worker, count, self.now)
        except errors.Rejected:
            self.forget(worker)
            return
        self.told(worker, reply, None)
        for task in reply.tasks:
            assert self.s.config.policy.min_version(self.s.t_train) <= task.min_version <= self.s.published
            self.tasks[task.task_id] = (worker, task)

    @precondition(lambda self: self.tasks)
    @rule(
        data=st.data(),
        how=st.sampled_from(["loaded", "old", "malformed", "future", "other-worker", "no-signal"]),
    )
    def submit(self, data: st.DataObject, how: str) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.tasks)))
        worker, task = self.tasks[task_id]
        version = self.loaded.get(worker) or 0
        if how == "old":
            version = data.draw(st.integers(0, max(0, self.s.published)))
        req = group(self.s, task, version)
        if how == "no-signal":  # every completion wrong: every reward equal
            req = wire.SubmitRequest(rollouts=[rollout(version, "x") for _ in req.rollouts])
        if how == "malformed":
            req = wire.SubmitRequest(rollouts=[*req.rollouts, rollout(version)])  # one too many
        elif how == "future":
            req = group(self.s, task, self.s.published + 1)
        elif how == "other-worker" and len(self.loaded) > 1:
            worker = next(w for w in self.loaded if w != worker)
        before = self.snapshot()
        try:
            reply = self.s.submit(worker, task_id, req, self.now)
        except errors.Rejected as exc:
            assert self.snapshot() == before, f"a rejected submission changed the state: {exc}"
            assert exc.status in (403, 404, 409, 422)
            return
        if reply.outcome == "duplicate":  # this worker already submitted it (leased again in `work`)
            assert self.snapshot() == before
            return
        assert how not in ("malformed", "future")
        if reply.reason and reply.reason.startswith("filtered"):
            event("submit: filtered by dynamic sampling")
        floor = min(self.s.t_train, self.s.published) - self.s.config.policy.bound
        if version not in self.known[worker]:  # forgotten: no step can consume it, so dropped
            assert version < floor and reply.outcome == "dropped", "an unknown version was accepted"
            event("submit: a forgotten version dropped as stale")
        assert worker not in self.banned
        del self.tasks[task_id]

    @precondition(lambda self: self.loaded)
    @rule(index=st.integers(0, 3))
    def leave(self, index: int) -> None:
        worker = self.worker(index)
        self.s.leave(worker)
        self.forget(worker)

    @precondition(lambda self: self.loaded)
    @rule(index=st.integers(0, 3), stale=st.booleans())
    def work(self, index: int, stale: bool) -> None:
        """One worker's usual round trip: heartbeat (obeyed), lease, generate, submit."""
        worker = self.worker(index)
        try:
            reply = self.s.heartbeat(
                worker, wire.HeartbeatRequest(loaded_version=self.loaded[worker]), self.now
            )
            self.told(worker, reply, self.loaded[worker])
            if reply.load_version is not None and not stale:
                self.loaded[worker] = reply.load_version
                self.s.heartbeat(worker, wire.HeartbeatRequest(loaded_version=reply.load_version), self.now)
            lease = self.s.lease(worker, 2, self.now, self.loaded[worker])
            self.told(worker, lease, self.loaded[worker])
        except errors.Rejected:
            self.forget(worker)
            return
        version = self.loaded[worker] or 0
        for task in lease.tasks:
            before = self.snapshot()
            try:
                submitted = self.s.submit(worker, task.task_id, group(self.s, task, version), self.now)
            except errors.Rejected as exc:  # a worker that never loaded claims version 0 it was not given
                assert exc.field.endswith(".policyVersion") and version not in self.known[worker]
                assert self.snapshot() == before
                event("work: unknown version refused")
                continue
            event(f"work: {submitted.outcome}")

    @rule(seconds=st.sampled_from([0.5, 3.0, 11.0]), keep_alive=st.booleans())
    def tick(self, seconds: float, keep_alive: bool) -> None:
        """Time passes; live workers heartbeat meanwhile (so only task deadlines expire), or nobody does."""
        self.now += seconds
        if keep_alive:
            for worker, version in self.loaded.items():
                # The reply may tell the worker to load a version: it may then claim it, as a real one does.
                reply = self.s.heartbeat(worker, wire.HeartbeatRequest(loaded_version=version), self.now)
                self.told(worker, reply, version)
        dead, released = self.s.expire(self.now)
        if released:
            event("leases re-issued" + (" (task deadline)" if keep_alive else ""))
        for worker in dead:
            self.loaded.pop(worker, None)

    @precondition(lambda self: self.loaded and not self.banned)  # once per run: workers must still work
    @rule(index=st.integers(0, 3))
    def quarantine(self, index: int) -> None:
        """The trainer catches a worker: its buffered groups go (prompts re-queued), it is refused."""
        worker = self.worker(index)
        theirs = sum(1 for e in self.s.ledger.buffered_entries() if e.group and e.group.worker == worker)
        current = self.last_batch is not None and self.last_batch.version == self.s.t_train
        withdrawn = (
            [g for g in self.last_batch.groups if g.worker_id == worker]
            if current and self.last_batch
            else []
        )
        reply = self.s.quarantine(
            wire.QuarantineRequest(worker_id=worker, reason="caught in a test", version=self.s.t_train)
        )
        assert reply.dropped_groups == theirs + len(withdrawn)
        self.banned.add(worker)
        self.forget(worker)
        if withdrawn:  # the trainer trains on the rest of that batch; a retry at its version gets a new one
            self.delivered -= {g.task_id for g in withdrawn}
            self.last_batch = None
        event("quarantine")

    # ----------------------------------------------------------------------------------- trainer
    @rule(step=st.integers(1, 2))
    def publish(self, step: int) -> None:
        self.s.announce(max(self.s.published, self.s.t_train) + step)

    @rule(ahead=st.integers(0, 1), repeat=st.booleans())
    def pull(self, ahead: int, repeat: bool) -> None:
        version = self.s.t_train + ahead
        dropped = self.s.counters.dropped_stale
        reply = self.s.pull_batch(version, self.now)
        if self.s.counters.dropped_stale > dropped:
            event("pull dropped stale groups")
        if not reply.ready:
            return
        if self.last_batch is not None and version == self.last_batch.version:
            assert reply is self.last_batch  # a retry at the same version: the same batch, not a new one
            return
        self.last_batch = reply
        event(f"batch delivered, max staleness {max(g.staleness for g in reply.groups)}")
        if repeat:
            assert self.s.pull_batch(version, self.now) is reply
        policy = self.s.config.policy
        assert len(reply.groups) == self.s.config.batch_size
        for g in reply.groups:
            assert g.worker_id not in self.banned, "a quarantined worker's group was delivered"
            assert g.task_id not in self.delivered, "a group was delivered twice"
            self.delivered.add(g.task_id)
            assert staleness.admit(g.policy_version, version, policy).consume
            for r in g.rollouts:
                assert 0 <= r.staleness == version - r.policy_version <= policy.max_staleness
            if self.s.config.dynamic_sampling:
                assert signal.has_signal([r.reward for r in g.rollouts]), (
                    "dynamic sampling let a flat group in"
                )
            assert g.importance_weighted == (policy.stale_action == "ImportanceWeight" and g.staleness > 0)

    # ----------------------------------------------------------------------------------- invariants
    @invariant()
    def nothing_lost_nothing_twice(self) -> None:
        s = self.s
        s.ledger.check()
        assert (
            s.ledger.dropped + (s.ledger.consumed - s.counters.consumed_groups)
            == s.counters.dropped_stale + s.counters.dropped_quarantined + s.signal.filtered_groups
        )
        # filtered groups' prompts had nothing to teach: they are counted, not re-queued
        assert s.counters.requeued_prompts == s.counters.dropped_stale + s.counters.dropped_quarantined
        assert s.counters.consumed_groups == len(self.delivered)
        if not s.config.dynamic_sampling:
            assert s.signal.filtered_groups == 0
        # with dynamic sampling the Async buffer bounds bufferSize ÷ keepRate outstanding tasks
        most = math.ceil(s.config.buffer_capacity / signal.MIN_KEEP)
        bound = (
            s.config.batch_size
            if s.sequential
            else most
            if s.config.dynamic_sampling
            else s.config.buffer_capacity
        )
        assert s.ledger.outstanding <= bound
        if s.counters.max_observed_staleness is not None:
            assert s.counters.max_observed_staleness <= s.config.policy.max_staleness
        assert s.t_train >= self.last_t
        self.last_t = s.t_train
        assert set(s.counters.staleness_histogram) <= set(range(s.config.policy.bound + 1))


CoordinatorMachine.TestCase.settings = settings(
    max_examples=250, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_coordinator_state_machine = CoordinatorMachine.TestCase


@pytest.mark.parametrize("mode", ["Sequential", "Async"])
def test_a_steady_run_delivers_batches(mode: staleness.Mode) -> None:
    """A sanity run of the same moves, so the property test cannot pass by never delivering anything."""
    s = make_state(config(mode, 1, batch_size=2, capacity=4))
    workers = [register(s), register(s)]
    delivered = 0
    for t in range(10):
        s.announce(t)
        while not (reply := s.pull_batch(t, float(t))).ready:
            for w in workers:
                s.heartbeat(w, wire.HeartbeatRequest(loaded_version=t), float(t))
                for task in s.lease(w, 2, float(t)).tasks:
                    s.submit(w, task.task_id, group(s, task, t), float(t))
        delivered += len(reply.groups)
    assert delivered == 20 and s.counters.dropped_stale == 0
