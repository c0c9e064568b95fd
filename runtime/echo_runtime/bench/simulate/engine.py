"""The discrete-event core: workers, trainer and coordinator of one job, on one event queue (heapq).

The protocol is the coordinator's own (:mod:`echo_runtime.coordinator.state`), not a paraphrase of it:

* tasks live in the coordinator's real :class:`~echo_runtime.coordinator.buffer.TaskLedger`, so the
  bounded buffer, backpressure (leasing pauses when pending + leased + buffered reach the capacity) and
  re-issue of expired leases are the production code's;
* every admission — a group arriving, buffered groups when a version is announced, each group of a
  batch — is decided by :func:`echo_runtime.staleness.admit`;
* pacing is the coordinator's (:func:`echo_runtime.staleness.lease_room` and ``lease_floor``): a lease
  gets only the tasks that can still be consumed in bound, each tagged with its floor; a dropped group's
  task goes back to the front of the queue (``pacing: false`` models a coordinator without it: floors
  ``t_train − bound``, dropped prompts not re-queued);
* a worker's round is the worker loop's (:mod:`echo_runtime.worker.loop`): load the newest published
  version if told to (its version is below what its next task needs and a newer one exists, or it just
  registered after version 0), lease up to ``capacity`` groups, load again (holding the leases) if the
  leased tasks need a newer version, generate them as one batch with the loaded version, submit; with ``leaseWait`` > 0 (the lease long-poll of ``echorl worker``) an idle
  worker takes work the moment it appears, with 0 an empty lease reply makes it wait ``retryAfterSeconds`` before asking again;
* a lease takes the class's generation time (log-normal jitter) plus its per-lease overhead;
* the trainer's loop is the trainer's (:mod:`echo_runtime.trainer.loop`): announce, pull a batch of
  ``batchSize`` groups at version t (waiting until one is ready), step, publish t+1 (and a checkpoint
  every ``checkpointEvery`` versions), announce t+1, pull again. Sequential mode opens a round of
  ``batchSize`` tasks only while the trainer waits, as the coordinator does;
* a failed worker stops answering; the coordinator forgets it ``leaseTimeout`` after its last heartbeat
  (at its next expiry sweep) and returns its leases to the front of the pending queue; the worker
  registers again ``rejoinSeconds`` after the failure, with no version loaded.

Modelling decisions (documented in docs/simulate.md): HTTP latency is zero; an idle worker's polls are
exact but lazy — its phase (the time of its last empty reply modulo the retry interval) is remembered
and only the poll that can succeed is simulated, so thousands of idle workers cost nothing; what an idle
worker would learn from a heartbeat (load a newer version) it acts on at its next poll.

Invariants (the tests check them on every run):

* no consumed group has staleness ``t − version`` above the bound (``result.violations == 0``; the
  histogram is computed from the raw versions, not from admit's verdict);
* conservation of tasks — the ledger's own ``created == pending + leased + buffered + consumed + dropped``;
* conservation of groups — every generated group is accepted into the buffer, dropped as stale on
  arrival, or wasted (its lease had expired); every accepted one is consumed, dropped as stale in the
  buffer, or still buffered at the end;
* determinism — the same configuration (including its seed) gives the same result.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
import math
import random
import time
from collections.abc import Iterable

from echo_runtime import staleness
from echo_runtime.bench.simulate import results
from echo_runtime.bench.simulate.config import SimConfig, WorkerClass
from echo_runtime.coordinator import buffer

# Event kinds (small ints: the heap compares tuples, and dispatch indexes a list).
_JOIN, _POLL, _LOAD_DONE, _GEN_DONE, _FAIL, _RELEASE, _DEADLINE, _TRAINER_START, _STEP_DONE, _PUBLISH_DONE = (
    range(10)
)

# Worker states.
_OFF, _IDLE, _POLLING, _LOADING, _GENERATING, _DEAD = range(6)

_EPS = 1e-9


class _Worker:
    __slots__ = (
        "alive_since",
        "cls",
        "group_seconds",
        "id",
        "inc",
        "key",
        "last_poll",
        "leased_at",
        "load_version",
        "loaded",
        "phase",
        "since",
        "state",
        "tasks",
        "version",
    )

    def __init__(self, wid: int, cls: int) -> None:
        self.id = wid
        self.cls = cls
        self.inc = 0
        """Incarnation: bumped on failure, so events of a dead incarnation are ignored."""
        self.key = ""
        """The worker id the coordinator knows (a new one per registration)."""
        self.loaded = 0
        self.state = _OFF
        self.phase = 0.0
        self.last_poll = -math.inf
        self.since = 0.0
        self.alive_since = 0.0
        self.tasks: list[str] = []
        self.version = 0
        """The version the group in hand is generated with."""
        self.load_version = 0
        self.leased_at = 0.0
        self.group_seconds: float | None = None
        """Lease to submission, a moving average: what the coordinator's pacing in time sees."""


class Simulator:
    """One simulated job; :meth:`run` once. See the module docstring."""

    def __init__(self, config: SimConfig, *, trace: bool = False) -> None:
        self.cfg = config
        self.policy = config.policy
        self.sequential = config.mode == "Sequential"
        self.rng = random.Random(config.seed)
        self.classes: tuple[WorkerClass, ...] = config.worker_classes
        self.retry = config.retry_seconds
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = itertools.count()
        self._task_ids = itertools.count(1)
        self.ledger: buffer.TaskLedger[None, int] = buffer.TaskLedger(
            0 if self.sequential else config.buffer_capacity
        )
        self.t_train = 0
        self.taken_at: int | None = None
        """The trainer version whose batch was last taken (pacing's next step)."""
        self.trainer_seconds: float | None = None
        """The trainer's own time per step (take a batch → ask for the next), as the coordinator sees it."""
        self.asked_at: float | None = None
        """When the trainer asked for the batch it waits for (None while it trains)."""
        self.last_take_at: float | None = None
        self.typical_group_seconds: float | None = None
        self._fastest_cache: tuple[float, float | None] = (-math.inf, None)
        self.published = 0
        self.round_open = False
        self.workers = [
            _Worker(wid, ci)
            for wid, ci in enumerate(ci for ci, c in enumerate(self.classes) for _ in range(c.count))
        ]
        self._idle: list[tuple[float, int]] = []
        """Idle workers as (phase, worker id), sorted: the order in which they poll within a period."""
        self._chain: tuple[int, int] | None = None
        """(worker, incarnation) of the one idle worker whose poll is scheduled to take free work."""
        # trainer
        self.version = 0
        self.waiting = False
        self.step_end = 0.0
        self.publish_end = 0.0
        self.finished = False
        self.horizon = config.duration_seconds
        # counters
        k = len(self.classes)
        self.c = results.Counters.zero(k)
        self.histogram: collections.Counter[int] = collections.Counter()
        self._buffered_versions: collections.Counter[int] = collections.Counter()
        """Versions of the buffered groups: lets ``_advance`` skip the buffer scan when nothing can be stale."""
        self.accept_times: list[float] = []
        self.trace = results.Trace() if trace else None
        self._handlers = (
            self._on_join,
            self._on_poll,
            self._on_load_done,
            self._on_gen_done,
            self._on_fail,
            self._on_release,
            self._on_deadline,
            self._on_trainer_start,
            self._on_step_done,
            self._on_publish_done,
        )

    # ------------------------------------------------------------------------------ event queue
    def _push(self, at: float, kind: int, a: int = -1, b: int = 0) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), kind, a, b))

    def _draw(self, mean: float, cv: float) -> float:
        """A log-normal duration with this mean and coefficient of variation (``mean`` itself when cv = 0)."""
        if cv <= 0.0 or mean <= 0.0:
            return mean
        sigma2 = math.log1p(cv * cv)
        return self.rng.lognormvariate(math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2))

    def run(self) -> results.SimResult:
        started = time.perf_counter()
        cfg = self.cfg
        for w in self.workers:
            # Real processes never start in lockstep: spread the first registrations over one retry period.
            self._push(self.classes[w.cls].start_seconds + self.rng.uniform(0.0, self.retry), _JOIN, w.id, 0)
        self._push(cfg.trainer.start_seconds, _TRAINER_START)
        heap, handlers = self._heap, self._handlers
        events = 0
        while heap and not self.finished and heap[0][0] <= self.horizon:
            at, _, kind, a, b = heapq.heappop(heap)
            self.now = at
            handlers[kind](a, b)
            events += 1
        return self._result(self.horizon, events, time.perf_counter() - started)

    # ------------------------------------------------------------------------------ workers
    @property
    def _next_step(self) -> int:
        return self.t_train + 1 if self.taken_at == self.t_train else self.t_train

    def _ahead(self) -> int:
        stragglers = 0
        if self.cfg.pacing and self.typical_group_seconds is not None:
            late = self.now - staleness.STRAGGLER_FACTOR * self.typical_group_seconds
            stragglers = self.ledger.leased_before(late)
        return staleness.ahead(self.ledger.buffered, self.ledger.leased, stragglers)

    def _floor(self, position: int) -> int:
        if not self.cfg.pacing:
            return self.policy.min_version(self.t_train)
        return staleness.lease_floor(self._next_step, position, self.cfg.batch_size, self.policy)

    def _paced(self, want: int) -> int:
        if not self.cfg.pacing:
            return want
        room = staleness.lease_room(
            self._next_step, self._ahead(), self.cfg.batch_size, self.policy, self.published
        )
        return min(want, room)

    def _available(self) -> int:
        return self._paced(self.ledger.pending + self.ledger.room())

    def _need(self) -> int:
        """What a worker's next task needs (capped at ``published``): the coordinator's load instruction."""
        return min(self._floor(self._ahead()), self.published)

    def _must_load(self, w: _Worker) -> bool:
        """The coordinator's instruction: load ``published`` once the loaded version is below the need."""
        return w.loaded < self._need() and w.loaded < self.published

    def _fast_enough(self, w: _Worker) -> bool:
        if not self.cfg.pacing:
            return True
        pace = None
        if self.trainer_seconds is not None:
            pace = max(self.trainer_seconds, self.now - self.asked_at if self.asked_at is not None else 0.0)
        budget = staleness.time_budget(pace, self._next_step, self.published, self.policy)
        return staleness.fast_enough(w.group_seconds, budget, self._fastest())

    def _fastest(self) -> float | None:
        """The fastest live worker's group time, refreshed once a simulated second (as the coordinator)."""
        at, value = self._fastest_cache
        if self.now - at >= 1.0:
            speeds = [
                x.group_seconds
                for x in self.workers
                if x.group_seconds is not None and x.state not in (_OFF, _DEAD)
            ]
            value = min(speeds) if speeds else None
            self._fastest_cache = (self.now, value)
        return value

    def _round(self, w: _Worker) -> None:
        """One turn of the worker loop: load if told, lease, generate — or wait for the next poll."""
        if self._must_load(w):
            self._start_load(w)
            return
        if not self._fast_enough(w):  # too slow for the steps left: asks again a poll interval later
            w.state = _POLLING
            self._push(self.now + self.retry, _POLL, w.id, w.inc)
            return
        ledger = self.ledger
        pending, room = ledger.pending, ledger.room()
        want = self._paced(self.classes[w.cls].capacity)
        if pending + room <= 0 or want <= 0:
            self._go_idle(w)
            return
        ahead = self._ahead()
        for _ in range(min(room, max(0, want - pending))):
            ledger.add(str(next(self._task_ids)), None)
        entries = ledger.lease(w.key, want, self.now, self.now + self.cfg.task_timeout)
        w.tasks = [e.id for e in entries]
        w.leased_at = self.now
        need = max((self._floor(ahead + i) for i in range(len(entries))), default=0)
        if w.loaded < need:  # the worker loads the newest version while holding the leases
            self._start_load(w)
            return
        self._start_gen(w)

    def _start_load(self, w: _Worker) -> None:
        w.state, w.since, w.load_version = _LOADING, self.now, self.published
        self._push(self.now + self.classes[w.cls].load_seconds(self.cfg.snapshot_mb), _LOAD_DONE, w.id, w.inc)

    def _start_gen(self, w: _Worker) -> None:
        cls = self.classes[w.cls]
        seconds = self._draw(cls.lease_seconds(len(w.tasks)), cls.group_cv) + cls.overhead_seconds
        w.state, w.since, w.version = _GENERATING, self.now, w.loaded
        self._push(self.now + seconds, _GEN_DONE, w.id, w.inc)
        if (
            seconds > self.cfg.task_timeout
        ):  # the coordinator re-issues it at its first sweep after the deadline
            sweep = self.now + self.cfg.task_timeout + self.rng.uniform(0.0, self.cfg.expire_interval)
            self._push(sweep, _DEADLINE)

    def _go_idle(self, w: _Worker) -> None:
        w.state, w.last_poll = _IDLE, self.now
        w.phase = self.now % self.retry
        # Long-poll: waiting requests are answered first come, first served, so order them by when they
        # went idle (≡ phase modulo the retry interval, which is all _next_poll needs); polling: by phase.
        bisect.insort(self._idle, (self.now if self.cfg.lease_wait > 0 else w.phase, w.id))

    def _next_poll(self, w: _Worker) -> float:
        at = self.now + ((w.phase - self.now) % self.retry)
        if at <= w.last_poll + _EPS:
            at += self.retry
        return at

    def _kick(self) -> None:
        """If work is available and nobody is on the way to take it, schedule the next idle poller."""
        if self._chain is not None or not self._idle or self._available() <= 0:
            return
        idle, n = self._idle, len(self._idle)
        if self.cfg.lease_wait > 0:  # long-poll: a waiting request is answered as soon as work appears
            _, wid = idle.pop(0)
            w = self.workers[wid]
            w.state = _POLLING
            self._chain = (wid, w.inc)
            self._push(self.now, _POLL, wid, w.inc)
            return
        start = bisect.bisect_left(idle, (self.now % self.retry, -1))
        best_at, best_index = math.inf, 0
        for j in range(n):  # the first in phase order, unless it only just went idle (rare ties)
            index = (start + j) % n
            at = self._next_poll(self.workers[idle[index][1]])
            if at < best_at:
                best_at, best_index = at, index
            if at < self.now + self.retry - _EPS:
                break
        _, wid = idle.pop(best_index)
        w = self.workers[wid]
        w.state = _POLLING
        self._chain = (wid, w.inc)
        self._push(best_at, _POLL, wid, w.inc)

    def _refresh_idle(self) -> None:
        """Idle workers told (by a heartbeat or an empty lease reply) to load a newer version do so."""
        if not self._idle:
            return
        floor = self._need()
        keep: list[tuple[float, int]] = []
        for item in self._idle:
            w = self.workers[item[1]]
            if w.loaded < floor:
                w.state = _POLLING
                # Long-poll: the announcement wakes the waiting lease, whose reply says what to load.
                self._push(self.now if self.cfg.lease_wait > 0 else self._next_poll(w), _POLL, w.id, w.inc)
            else:
                keep.append(item)
        self._idle = keep

    def _on_join(self, wid: int, inc: int) -> None:
        w = self.workers[wid]
        if w.inc != inc:
            return
        cls = self.classes[w.cls]
        w.key, w.loaded, w.alive_since = f"w{wid}.{inc}", 0, self.now
        if cls.mtbf_hours is not None and math.isfinite(cls.mtbf_hours):
            self._push(self.now + self.rng.expovariate(1.0 / (cls.mtbf_hours * 3600.0)), _FAIL, wid, inc)
        if self.trace is not None:
            self.trace.joins.append((self.now, wid, w.cls))
        if self.published > 0:  # registering with no version: told to load the newest published one
            self._start_load(w)
        else:
            self._round(w)
        self._kick()

    def _on_poll(self, wid: int, inc: int) -> None:
        if self._chain == (wid, inc):
            self._chain = None
        w = self.workers[wid]
        if w.inc == inc and w.state == _POLLING:
            self._round(w)
        self._kick()

    def _on_load_done(self, wid: int, inc: int) -> None:
        w = self.workers[wid]
        if w.inc != inc:
            return
        cls, seconds = w.cls, self.now - w.since
        w.loaded = w.load_version
        self.c.loads[cls] += 1
        self.c.load_seconds[cls] += seconds
        self.c.snapshot_mb += self.cfg.snapshot_mb
        if self.trace is not None:
            self.trace.loads.append((self.now, wid, seconds, w.loaded))
        if w.tasks:  # it loaded for the tasks it holds
            self._start_gen(w)
            return
        self._round(w)

    def _on_gen_done(self, wid: int, inc: int) -> None:
        w = self.workers[wid]
        if w.inc != inc:
            return
        ledger, c, cls = self.ledger, self.c, w.cls
        seconds = self.now - w.since
        took = self.now - w.leased_at
        w.group_seconds = took if w.group_seconds is None else 0.7 * w.group_seconds + 0.3 * took
        typical = self.typical_group_seconds
        self.typical_group_seconds = took if typical is None else 0.9 * typical + 0.1 * took
        c.gen_seconds[cls] += seconds
        c.generated[cls] += len(w.tasks)
        if self.trace is not None:
            sampling = max(0.0, seconds - self.classes[cls].overhead_seconds)  # as the worker times it
            self.trace.samples.append((self.now, wid, sampling, len(w.tasks), w.version))
        for task_id in w.tasks:
            entry = ledger.lease_of(task_id)
            if entry is None or entry.worker != w.key:
                c.wasted += 1  # the lease expired and the task was re-issued: the submit is refused
                continue
            if staleness.admit(w.version, self.t_train, self.policy).consume:
                ledger.complete(task_id, w.key, cls, w.version)
                self._buffered_versions[w.version] += 1
                c.accepted[cls] += 1
                self.accept_times.append(self.now)
            else:
                self._requeue([ledger.discard(task_id, w.key)])
                c.dropped_on_arrival += 1
        w.tasks = []
        self._trainer_check()
        self._round(w)
        self._kick()

    def _on_fail(self, wid: int, inc: int) -> None:
        w = self.workers[wid]
        if w.inc != inc:
            return
        c, cls, now = self.c, w.cls, self.now
        c.alive_seconds[cls] += now - w.alive_since
        c.failures[cls] += 1
        if w.state == _GENERATING:
            c.gen_seconds[cls] += now - w.since
            c.lost_seconds[cls] += now - w.since
            c.lost_in_flight += len(w.tasks)
        elif w.state == _LOADING:
            c.load_seconds[cls] += now - w.since
        elif w.state == _IDLE:
            index = bisect.bisect_left(self._idle, (w.phase, wid))
            if index < len(self._idle) and self._idle[index] == (w.phase, wid):
                del self._idle[index]
        if self._chain == (wid, inc):
            self._chain = None
        w.state, w.tasks = _DEAD, []
        w.inc += 1
        cfg = self.cfg
        last_seen = now - self.rng.uniform(0.0, cfg.heartbeat_interval)
        release = max(now, last_seen + cfg.lease_timeout) + self.rng.uniform(0.0, cfg.expire_interval)
        self._push(release, _RELEASE, wid, inc)
        self._push(now + self.classes[cls].rejoin_seconds, _JOIN, wid, w.inc)
        self._kick()

    def _on_release(self, wid: int, inc: int) -> None:
        self.c.reissued += len(self.ledger.release_worker(f"w{wid}.{inc}"))
        self._kick()

    def _on_deadline(self, _a: int, _b: int) -> None:
        self.c.reissued += len(self.ledger.expire(self.now))
        self._kick()

    # ------------------------------------------------------------------------------ trainer
    def _advance(self, version: int) -> None:
        """The coordinator's ``_advance``: t_train moves forward; newly too-stale buffered groups go."""
        self.t_train = max(self.t_train, version)
        t, policy = self.t_train, self.policy
        if not self._buffered_versions or staleness.admit(min(self._buffered_versions), t, policy).consume:
            return  # the oldest buffered group is still admissible, so every one is (admit is monotone)
        dropped = self.ledger.drop_buffered(lambda e: not staleness.admit(e.version or 0, t, policy).consume)
        self.c.dropped_in_buffer += len(dropped)
        self._forget_buffered(e.version for e in dropped)
        self._requeue(dropped)

    def _requeue(self, entries: list[buffer.Entry[None, int]]) -> None:
        """With pacing, the coordinator puts a dropped group's prompt back at the front of the queue."""
        if self.cfg.pacing:
            for _ in entries:
                self.ledger.add(str(next(self._task_ids)), None, front=True)

    def _forget_buffered(self, versions: Iterable[int | None]) -> None:
        for v in versions:
            assert v is not None
            self._buffered_versions[v] -= 1
            if not self._buffered_versions[v]:
                del self._buffered_versions[v]

    def _on_trainer_start(self, _a: int, _b: int) -> None:
        self.published = max(self.published, self.version)  # the trainer announces its start version
        self._advance(self.version)
        self._pull()

    def _pull(self) -> None:
        """``pull_batch(version)``: take a batch if one is ready, else wait (Sequential: open a round)."""
        self._advance(self.version)
        if self.ledger.buffered >= self.cfg.batch_size:
            self._take()
            return
        self.waiting = True
        if self.sequential and not self.round_open:
            self.round_open, self.ledger.capacity = True, self.cfg.batch_size
            self._kick()

    def _trainer_check(self) -> None:
        if self.waiting and self.ledger.buffered >= self.cfg.batch_size:
            self._pull()

    def _take(self) -> None:
        cfg, t = self.cfg, self.version
        entries = self.ledger.take(cfg.batch_size)
        self.taken_at = t
        self.last_take_at = self.now
        self.asked_at = None
        self._forget_buffered(e.version for e in entries)
        if self.sequential:
            self.round_open, self.ledger.capacity = False, 0
        bound = self.policy.bound
        for entry in entries:
            assert entry.version is not None and entry.group is not None
            age = t - entry.version  # from the raw versions: the oracle does not grade its own homework
            verdict = staleness.admit(entry.version, t, self.policy)
            if not verdict.consume or age > bound or age < 0:
                self.c.violations += 1
            self.histogram[age] += 1
            self.c.weighted += verdict.importance_weighted
            self.c.consumed[entry.group] += 1
        seconds = self._draw(cfg.trainer.step_seconds, cfg.trainer.step_cv)
        self.c.step_seconds += seconds
        self.waiting = False
        self.step_end = self.now + seconds
        if self.trace is not None:
            self.trace.steps.append([self.now, seconds, 0.0, 0.0, t + 1])
        self._push(self.step_end, _STEP_DONE)
        self._kick()

    def _on_step_done(self, _a: int, _b: int) -> None:
        trainer = self.cfg.trainer
        new = self.version + 1
        publish = trainer.publish_seconds
        checkpoint = 0.0
        due = trainer.checkpoint_every and new % trainer.checkpoint_every == 0
        if due or (self.cfg.max_steps is not None and new >= self.cfg.max_steps and trainer.checkpoint_every):
            checkpoint = trainer.checkpoint_seconds
        self.c.publish_seconds += publish + checkpoint
        self.publish_end = self.now + publish + checkpoint
        if self.trace is not None:
            self.trace.steps[-1][2:4] = [publish, checkpoint]
        self._push(self.publish_end, _PUBLISH_DONE)

    def _on_publish_done(self, _a: int, _b: int) -> None:
        self.version += 1
        self.published = self.version  # publish, then announce
        self.c.steps += 1
        self._advance(self.version)
        if self.cfg.max_steps is not None and self.version >= self.cfg.max_steps:
            # The trainer is done; the workers run on for tailSeconds (the trainer never pulls again).
            self.horizon = min(self.horizon, self.now + self.cfg.tail_seconds)
            self.finished = self.cfg.tail_seconds <= 0.0
            return
        if self.last_take_at is not None:  # the trainer asks for its next batch: its own step is over
            took = self.now - self.last_take_at
            self.trainer_seconds = (
                took if self.trainer_seconds is None else 0.8 * self.trainer_seconds + 0.2 * took
            )
        self.asked_at = self.now
        self._refresh_idle()
        self._kick()
        self._pull()

    # ------------------------------------------------------------------------------ result
    def _result(self, end: float, events: int, wall: float) -> results.SimResult:
        c = self.c
        for w in self.workers:  # close the books of whatever is in progress at the end
            if w.state in (_OFF, _DEAD):
                continue
            c.alive_seconds[w.cls] += end - w.alive_since
            if w.state == _GENERATING:
                c.gen_seconds[w.cls] += end - w.since
            elif w.state == _LOADING:
                c.load_seconds[w.cls] += end - w.since
        # A step or publish running past the end counts only up to it.
        c.step_seconds -= max(0.0, self.step_end - end)
        c.publish_seconds -= max(0.0, min(self.publish_end - end, self.publish_end - self.step_end))
        ledger = self.ledger
        ledger.check()
        return results.build(
            self.cfg,
            c,
            self.histogram,
            self.accept_times,
            end=end,
            events=events,
            wall=wall,
            pending=ledger.pending,
            leased=ledger.leased,
            buffered=ledger.buffered,
            created=ledger.created,
            ledger_consumed=ledger.consumed,
            ledger_dropped=ledger.dropped,
            trace=self.trace,
        )


def simulate(config: SimConfig, *, trace: bool = False) -> results.SimResult:
    """Simulate ``config`` once (deterministic in ``config.seed``)."""
    return Simulator(config, trace=trace).run()
