"""The coordinator's state machine: workers, versions, leases, the buffer and both sync protocols.

No I/O, no clock, no threads: every method takes ``now`` (seconds, monotonic) and returns a wire model
or raises :class:`Rejected`. The HTTP layer (:mod:`.api`) is a thin shell around it, and the property
tests drive it directly through any interleaving of publishes, leases, submissions, expiries and pulls.

Protocols (docs/coordinator.md has the whole story):

* ``t_train`` is the trainer's version (the larger of the versions it announced and asked a batch at);
  ``published`` is the newest version it announced as published, the newest a worker can load (0 is
  the base model). ``bound`` is Δmax in Async mode and the refresh threshold in Sequential mode.
* **Pacing** (:func:`echo_runtime.staleness.lease_floor`): each leased task is tagged with the oldest
  version its group may be generated with and still be consumed in bound, given its place behind the
  groups buffered and in flight; a task whose floor no published version reaches is not leased. A
  worker below the floor of its next task is told to load ``published`` (register, heartbeat and lease
  replies). So generation runs ahead of the trainer by at most ``(bound + 1) × batchSize`` groups and
  groups are not born too stale; a group dropped anyway (a slow worker) gives its prompt back to the
  front of the queue. ``--no-pacing`` (comparisons only) tags every task ``t_train - bound`` instead.
* **Async**: leasing is open whenever the ledger has room and pacing allows; the room is the
  replay-buffer capacity minus pending, leased and buffered tasks, so a full buffer pauses leasing
  (backpressure). The trainer pulls batches whenever it likes; a batch holds the oldest versions first.
* **Sequential**: leasing opens only while the trainer waits for a batch (a *round* at version t,
  capacity batchSize); the round closes when the batch is handed out.
* **Trust** (:mod:`.trust`): token ids must decode to the scored text, a claimed policy version must be
  one the worker reported holding, a pool holds at most ``maxWorkers`` registrations and ``maxLeases``
  leases, and a worker the trainer quarantines (its behaviour log-probs disagree with the trainer's
  recomputation) is refused from then on and its buffered groups are dropped, their prompts re-queued.

Invariants (property-tested):

* every group handed to the trainer passes :func:`.staleness.admit` at the trainer's version — so no
  batch holds a rollout with staleness > Δmax;
* a group is handed out at most once; every task ends consumed, dropped-and-counted, or back in the
  pending queue to be re-leased (:mod:`.buffer`); every prompt drawn is consumed or still on its way
  (a dropped group's prompt is re-queued);
* a rejected request changes nothing: validation completes before the first mutation;
* ``t_train`` never decreases.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import secrets
from collections.abc import Iterator, Sequence

from echo_runtime import staleness
from echo_runtime.coordinator import buffer, trust, wire
from echo_runtime.coordinator.config import CoordinatorConfig
from echo_runtime.tasks import base as tasks_base


class Rejected(Exception):
    """A request the coordinator refuses; maps to a 4xx reply naming ``field``. Nothing was changed."""

    def __init__(self, status: int, code: str, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.status = status
        self.code = code
        self.field = field
        self.message = message


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
class Worker:
    id: str
    pool: str
    backend: str
    device: str
    dtype: str
    external: bool
    capacity: int
    host: str | None
    session_hash: bytes
    last_seen: float
    rate: RateWindow
    loaded_version: int | None = None
    told_version: int | None = None
    told_at: float | None = None
    """When the worker was first told to load ``told_version`` (for ``stuck``)."""
    known_versions: set[int] = dataclasses.field(default_factory=set)
    """Every version the coordinator told the worker to load or the worker reported holding (only
    published ones are accepted): the versions its rollouts may claim."""
    quarantine: Quarantine | None = None
    overdue: int = 0
    """Expiry sweeps that found its leases past the task timeout while it stayed alive, since its last
    submission."""
    group_seconds: float | None = None
    """How long its groups take, lease to submission (a moving average; pacing in time)."""


HOARDING_EXPIRIES = 3
"""A live worker whose leases run past the task timeout this many times in a row, with no submission
in between, is quarantined as a lease hoarder (or hung: its pod should be restarted either way)."""


@dataclasses.dataclass(frozen=True)
class Quarantine:
    """Why and when the trainer quarantined a worker (kept for the job's life, also after it expires)."""

    worker_id: str
    pool: str
    host: str | None
    reason: str
    mismatch: float | None
    version: int
    """The trainer version at which the worker was caught."""


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A validated submission waiting for its rewards (scoring runs off the event loop)."""

    worker_id: str
    task_id: str
    problem: tasks_base.Problem
    request: wire.SubmitRequest


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What a task carries: its problem (the verifier needs the answer)."""

    problem: tasks_base.Problem


@dataclasses.dataclass(frozen=True)
class ScoredRollout:
    rollout: wire.RolloutIn
    reward: tasks_base.Reward
    backend: str
    device: str
    dtype: str


@dataclasses.dataclass(frozen=True)
class Group:
    rollouts: tuple[ScoredRollout, ...]
    worker_id: str


Ledger = buffer.TaskLedger[TaskSpec, Group]


class CoordinatorState:
    """See the module docstring. Not thread-safe: one event loop drives it."""

    def __init__(
        self,
        config: CoordinatorConfig,
        task: tasks_base.Task,
        *,
        now: float,
        t_train: int = 0,
        prompts: Iterator[tasks_base.Problem] | None = None,
        detokenizer: trust.Detokenizer | None = None,
    ) -> None:
        self.config = config
        self.task = task
        self.detokenizer = detokenizer
        """Checks that token ids decode to the scored text; None skips that check (state-machine tests
        with synthetic ids only: ``echorl coordinator`` always loads the job's tokenizer)."""
        self.t_train = t_train
        """The trainer's version: the larger of the versions it announced and asked batches at."""
        self.published = t_train
        """The newest version announced as published: the newest a worker can load (0: the base model)."""
        self.last_batch: wire.BatchReply | None = None
        """The last batch handed out, returned again if the trainer retries the same version."""
        self._last_taken: list[buffer.Entry[TaskSpec, Group]] = []
        # The batch before last_batch: a prefetching trainer that dies after asking at v + 1 but before
        # publishing it is resumed at v, and gets v's batch again (pull_batch).
        self._previous: tuple[wire.BatchReply, list[buffer.Entry[TaskSpec, Group]]] | None = None
        self._prompts = prompts if prompts is not None else self.default_prompts(task, config, t_train)
        self.epoch = secrets.token_hex(3)
        """Distinguishes task ids (and status counters) across coordinator restarts."""
        self._task_counter = itertools.count(1)
        self.ledger: Ledger = buffer.TaskLedger(0 if self.sequential else config.buffer_capacity)
        self.workers: dict[str, Worker] = {}
        self.quarantined: dict[str, Quarantine] = {}
        self.round_open = False
        self.staleness_histogram: collections.Counter[int] = collections.Counter()
        self.max_observed_staleness: int | None = None
        self.dropped_stale = 0
        self.dropped_quarantined = 0
        self.requeued_prompts = 0
        self.weighted_stale = 0
        self.consumed_groups = 0
        self.generated_groups = 0
        """Valid group submissions (buffered or dropped as stale on arrival): what the swarm generated."""
        self.accepted_rollouts = 0
        self.batches = 0
        self.last_reward: float | None = None
        self.workers_expired = 0
        self.verifier_timeouts = 0
        self.verifier_errors = 0
        self.rejected = trust.PoolCounters()
        self.rate = RateWindow(config.rate_window, now)
        self.trainer_seconds: float | None = None
        """The trainer's own time per step — from handing it a batch to its asking for the next, waits for
        groups excluded — a moving average (pacing in time)."""
        self._last_take_at: float | None = None
        self._asked: tuple[int, float] | None = None
        """(version, when) of the trainer's first request for the batch it waits for now."""
        self._fastest: tuple[float, float | None] = (-math.inf, None)
        """(when computed, the fastest live worker's group seconds): refreshed at most once a second."""
        self.typical_group_seconds: float | None = None
        """Lease to submission over all workers (a moving average): what makes a lease a straggler's."""

    @staticmethod
    def default_prompts(
        task: tasks_base.Task, config: CoordinatorConfig, t_train: int
    ) -> Iterator[tasks_base.Problem]:
        """The train stream, skipped ahead past what ``t_train`` steps consumed (a restart resumes there;
        dropped groups re-queue their prompts, so at most the groups in flight at the restart are off)."""
        stream = task.prompts("train", config.seed)
        return itertools.islice(stream, t_train * config.batch_size, None)

    @property
    def sequential(self) -> bool:
        return self.config.policy.mode == "Sequential"

    @property
    def min_version(self) -> int:
        return self.config.policy.min_version(self.t_train)

    @property
    def next_step(self) -> int:
        """The step whose batch is not taken yet: ``t_train``, or ``t_train + 1`` once its batch went out."""
        taken = self.last_batch is not None and self.last_batch.version == self.t_train
        return self.t_train + 1 if taken else self.t_train

    def pace_seconds(self, now: float) -> float | None:
        """Seconds per version for pacing in time: the trainer's own step time, or — while it waits for
        a batch — how long it has waited, if longer: a trainer starved by the workers fast enough for
        its pace admits slower ones, the longer it waits (:func:`~echo_runtime.staleness.fast_enough`)."""
        if self.trainer_seconds is None:
            return None
        waiting = self._asked is not None and self.next_step == self._asked[0] == self.t_train
        waited = now - self._asked[1] if waiting and self._asked is not None else 0.0
        return max(self.trainer_seconds, waited)

    def fastest_group_seconds(self, now: float) -> float | None:
        """The group time of the fastest live worker whose speed is known (refreshed once a second)."""
        at, value = self._fastest
        if now - at >= 1.0:
            speeds = [
                w.group_seconds
                for w in self.workers.values()
                if w.group_seconds is not None and w.quarantine is None
            ]
            value = min(speeds) if speeds else None
            self._fastest = (now, value)
        return value

    def ahead(self, now: float) -> int:
        """Groups pacing counts ahead of a new lease (:func:`~echo_runtime.staleness.ahead`)."""
        stragglers = 0
        if self.config.pacing and self.typical_group_seconds is not None:
            late = now - staleness.STRAGGLER_FACTOR * self.typical_group_seconds
            stragglers = self.ledger.leased_before(late)
        return staleness.ahead(self.ledger.buffered, self.ledger.leased, stragglers)

    def floor(self, position: int) -> int:
        """The ``minVersion`` of a task leased now at ``position`` (0-based) behind the groups buffered and
        in flight: pacing's :func:`~echo_runtime.staleness.lease_floor`, or ``t_train − bound`` without it."""
        if not self.config.pacing:
            return self.min_version
        return staleness.lease_floor(self.next_step, position, self.config.batch_size, self.config.policy)

    # ------------------------------------------------------------------------------------- workers
    def register(self, req: wire.RegisterRequest, session_hash: bytes, now: float) -> wire.RegisterReply:
        if req.pool not in self.config.pools:
            raise Rejected(
                422,
                "invalid",
                "pool",
                f"unknown pool {req.pool!r}; this job's pools: {', '.join(self.config.pools)}",
            )
        limit = self.config.pool_max_workers.get(req.pool)
        if limit is not None:
            members = sum(1 for w in self.workers.values() if w.pool == req.pool and w.quarantine is None)
            caught = sum(1 for q in self.quarantined.values() if q.pool == req.pool)
            if members + caught >= limit:
                raise Rejected(
                    429,
                    "limit",
                    "pool",
                    f"pool {req.pool!r} is full: maxWorkers is {limit} ({members} registered, {caught} "
                    "quarantined); try again when a worker leaves",
                )
        worker_id = f"w-{secrets.token_hex(4)}"
        while worker_id in self.workers or worker_id in self.quarantined:
            worker_id = f"w-{secrets.token_hex(4)}"
        capacity = min(req.capacity, self.config.pool_capacity.get(req.pool, req.capacity))
        worker = Worker(
            id=worker_id,
            pool=req.pool,
            backend=req.backend,
            device=req.device,
            dtype=req.dtype,
            external=req.external,
            capacity=capacity,
            host=req.host,
            session_hash=session_hash,
            last_seen=now,
            rate=RateWindow(self.config.rate_window, now),
        )
        self.workers[worker_id] = worker
        t, min_version, load = self._instructions(worker, now)
        return wire.RegisterReply(
            worker_id=worker_id,
            session_key="",
            capacity=capacity,
            lease_timeout_seconds=self.config.lease_timeout,
            heartbeat_interval_seconds=self.config.heartbeat_interval,
            policy_version=t,
            min_version=min_version,
            load_version=load,
        )

    def worker(self, worker_id: str) -> Worker:
        """The registered worker ``worker_id``, or a 404 telling it to register again."""
        worker = self.workers.get(worker_id)
        if worker is None:
            raise Rejected(
                404,
                "unknown_worker",
                "workerId",
                f"worker {worker_id!r} is not registered (its lease timed out or the coordinator restarted); "
                "register again",
            )
        return worker

    def active(self, worker_id: str) -> Worker:
        """:meth:`worker`, refusing (403) a quarantined one."""
        worker = self.worker(worker_id)
        if worker.quarantine is not None:
            raise Rejected(
                403,
                "quarantined",
                "workerId",
                f"worker {worker_id} is quarantined: {worker.quarantine.reason}",
            )
        return worker

    def _report(self, worker: Worker, loaded_version: int | None) -> None:
        """Record the version a worker says it holds (refused if it was never published)."""
        if loaded_version is None:
            return
        if loaded_version > self.published:
            raise Rejected(
                422,
                "invalid",
                "loadedVersion",
                f"version {loaded_version} was never published: the newest is {self.published}",
            )
        worker.loaded_version = loaded_version
        worker.known_versions.add(loaded_version)

    def heartbeat(self, worker_id: str, req: wire.HeartbeatRequest, now: float) -> wire.HeartbeatReply:
        worker = self.active(worker_id)
        self._report(worker, req.loaded_version)
        if req.loaded_version is None:
            worker.loaded_version = None
        worker.last_seen = now
        t, min_version, load = self._instructions(worker, now)
        return wire.HeartbeatReply(
            lease_timeout_seconds=self.config.lease_timeout,
            heartbeat_interval_seconds=self.config.heartbeat_interval,
            policy_version=t,
            min_version=min_version,
            load_version=load,
        )

    def leave(self, worker_id: str) -> wire.LeaveReply:
        self.worker(worker_id)
        del self.workers[worker_id]
        return wire.LeaveReply(released_tasks=len(self.ledger.release_worker(worker_id)))

    def expire(self, now: float) -> tuple[list[str], int]:
        """Forget workers silent past the lease timeout and re-issue their and any overdue leases.

        Returns (expired worker ids, number of leases returned to the pending queue)."""
        dead = [w.id for w in self.workers.values() if now - w.last_seen > self.config.lease_timeout]
        released = 0
        for worker_id in dead:
            del self.workers[worker_id]
            released += len(self.ledger.release_worker(worker_id))
        self.workers_expired += len(dead)
        hoarders = {worker for _, worker in self.ledger.overdue(now)}
        released += len(self.ledger.expire(now))
        for worker_id in sorted(hoarders):
            worker = self.workers.get(worker_id)
            if worker is None or worker.quarantine is not None:
                continue
            worker.overdue += 1
            if worker.overdue >= HOARDING_EXPIRIES:
                self._quarantine(
                    worker_id,
                    f"lease hoarding: its leases ran past the task timeout ({self.config.task_timeout:g}s) "
                    f"{worker.overdue} times in a row while it kept heartbeating, with no submission",
                    None,
                    self.t_train,
                )
        return dead, released

    def _instructions(self, worker: Worker, now: float) -> tuple[int, int, int | None]:
        """(t_train, minVersion, loadVersion): tell a worker to load the newest published version once its
        own is below what the next task needs — in Async the pacing floor of the next position (at most
        ``published``), in Sequential the round's ``t − refreshThreshold``.

        ``stuck`` is judged against the bound alone: a worker is on the clock only while its version
        could no longer be consumed at all (below ``t_train − bound``), never for lagging pacing's
        floor while it finishes a long generation."""
        if self.sequential:
            need = min(self.min_version, self.published)
        else:
            need = min(self.floor(self.ahead(now)), self.published)
        loaded = worker.loaded_version
        load: int | None = None
        if loaded is None or (loaded < need and loaded < self.published):
            load = self.published
            worker.known_versions.add(load)
        if loaded is None or (loaded < self.min_version and loaded < self.published):
            if worker.told_version != self.published:
                worker.told_version, worker.told_at = self.published, now
        else:
            worker.told_version = worker.told_at = None
        return self.t_train, max(self.min_version, need), load

    def stuck(self, worker: Worker, now: float) -> bool:
        """Told to load a version, still below it after a lease timeout."""
        if worker.told_version is None or worker.told_at is None:
            return False
        behind = worker.loaded_version is None or worker.loaded_version < worker.told_version
        return behind and now - worker.told_at > self.config.lease_timeout

    # ------------------------------------------------------------------------------------- leases
    def lease(
        self, worker_id: str, max_tasks: int, now: float, loaded_version: int | None = None
    ) -> wire.LeaseReply:
        worker = self.active(worker_id)
        self._report(worker, loaded_version)
        worker.last_seen = now
        want = min(max_tasks, worker.capacity - self.ledger.leases_of(worker_id))
        pool_limit = self.config.pool_max_leases.get(worker.pool)
        if pool_limit is not None:
            held = sum(self.ledger.leases_of(w.id) for w in self.workers.values() if w.pool == worker.pool)
            want = min(want, pool_limit - held)
        ahead = self.ahead(now)
        if self.config.pacing:  # beyond this room no published version is fresh enough: wait for one
            room = staleness.lease_room(
                self.next_step, ahead, self.config.batch_size, self.config.policy, self.published
            )
            budget = staleness.time_budget(
                self.pace_seconds(now), self.next_step, self.published, self.config.policy
            )
            fast = staleness.fast_enough(worker.group_seconds, budget, self.fastest_group_seconds(now))
            want = min(want, room) if fast else 0
        floors = [self.floor(ahead + i) for i in range(max(0, want))]
        for _ in range(min(self.ledger.room(), max(0, len(floors) - self.ledger.pending))):
            if not self._new_task():
                break
        entries = self.ledger.lease(worker_id, len(floors), now, now + self.config.task_timeout)
        tasks = []
        for entry, floor in zip(entries, floors, strict=False):
            problem = entry.payload.problem
            tasks.append(
                wire.TaskOut(
                    task_id=entry.id,
                    problem_id=problem.id,
                    prompt=problem.prompt,
                    group_size=self.config.group_size,
                    min_version=floor,
                    sampling=wire.SamplingParams(
                        temperature=self.config.temperature,
                        top_p=self.config.top_p,
                        max_new_tokens=self.config.max_new_tokens,
                    ),
                    lease_seconds=self.config.task_timeout,
                )
            )
        retry = None if tasks else min(1.0, self.config.heartbeat_interval)
        t, min_version, load = self._instructions(worker, now)
        return wire.LeaseReply(
            tasks=tasks,
            retry_after_seconds=retry,
            policy_version=t,
            min_version=min_version,
            load_version=load,
        )

    def _new_task(self) -> bool:
        """Draw the next prompt into a new pending task; False once the task's stream is exhausted."""
        problem = next(self._prompts, None)
        if problem is None:
            return False
        self.ledger.add(self._task_id(), TaskSpec(problem))
        return True

    def _task_id(self) -> str:
        return f"{self.epoch}-{next(self._task_counter)}"

    def _requeue(self, entries: list[buffer.Entry[TaskSpec, Group]]) -> None:
        """Give the prompts of dropped groups back to the front of the queue, in their order."""
        for entry in reversed(entries):
            self.ledger.add(self._task_id(), entry.payload, front=True)
        self.requeued_prompts += len(entries)

    # ------------------------------------------------------------------------------------- rollouts
    def submit(self, worker_id: str, task_id: str, req: wire.SubmitRequest, now: float) -> wire.SubmitReply:
        """Validate, re-score (here, synchronously) and buffer or drop one group: :meth:`prepare_submit`
        then :meth:`commit_submit`. The service scores off the event loop between the two."""
        prepared = self.prepare_submit(worker_id, task_id, req, now)
        if isinstance(prepared, wire.SubmitReply):
            return prepared
        rewards = tuple(self.task.score(prepared.problem, r.completion) for r in req.rollouts)
        return self.commit_submit(prepared, rewards, now)

    def prepare_submit(
        self, worker_id: str, task_id: str, req: wire.SubmitRequest, now: float
    ) -> Prepared | wire.SubmitReply:
        """Check a submission before it is scored: a repeat answers ``duplicate``; a lease not held, a
        malformed group or a rollout that fails a trust check raises :class:`Rejected`. Changes nothing
        but the worker's last-seen time and the per-pool rejection counts."""
        worker = self.active(worker_id)
        repeat = self._duplicate(worker, task_id, now)
        if repeat is not None:
            return repeat
        entry = self._held(worker_id, task_id)
        self._validate(worker, req)
        worker.last_seen = now
        return Prepared(worker_id, task_id, entry.payload.problem, req)

    def commit_submit(
        self,
        prepared: Prepared,
        rewards: Sequence[tasks_base.Reward],
        now: float,
        *,
        timeouts: int = 0,
        errors: int = 0,
    ) -> wire.SubmitReply:
        """Buffer (or drop as stale) a prepared group with its rewards. The lease is checked again (it may
        have expired, or the worker been quarantined, while the group was scored)."""
        worker_id, task_id, req = prepared.worker_id, prepared.task_id, prepared.request
        worker = self.active(worker_id)
        repeat = self._duplicate(worker, task_id, now)
        if repeat is not None:
            return repeat
        entry = self._held(worker_id, task_id)
        took = max(0.0, now - entry.leased_at)
        worker.group_seconds = (
            took if worker.group_seconds is None else 0.7 * worker.group_seconds + 0.3 * took
        )
        typical = self.typical_group_seconds
        self.typical_group_seconds = took if typical is None else 0.9 * typical + 0.1 * took
        scored = tuple(
            ScoredRollout(
                rollout=r,
                reward=reward,
                backend=r.backend or worker.backend,
                device=r.device or worker.device,
                dtype=r.dtype or worker.dtype,
            )
            for r, reward in zip(req.rollouts, rewards, strict=True)
        )
        worker.last_seen = now
        self.verifier_timeouts += timeouts
        self.verifier_errors += errors
        self.generated_groups += 1
        version = min(r.policy_version for r in req.rollouts)
        verdict = staleness.admit(version, self.t_train, self.config.policy)
        values = [s.reward.value for s in scored]
        if not verdict.consume:
            self._requeue([self.ledger.discard(task_id, worker_id)])
            self.dropped_stale += 1
            return wire.SubmitReply(
                outcome="dropped", rewards=values, staleness=verdict.staleness, reason=verdict.reason
            )
        self.ledger.complete(task_id, worker_id, Group(scored, worker_id), version)
        worker.overdue = 0
        self.accepted_rollouts += len(scored)
        worker.rate.add(now, len(scored))
        self.rate.add(now, len(scored))
        return wire.SubmitReply(outcome="buffered", rewards=values, staleness=verdict.staleness)

    def _duplicate(self, worker: Worker, task_id: str, now: float) -> wire.SubmitReply | None:
        outcome = self.ledger.outcome(task_id)
        if (
            outcome is not None
            and outcome[0] in ("buffered", "consumed", "dropped")
            and outcome[1] == worker.id
        ):
            worker.last_seen = now
            return wire.SubmitReply(
                outcome="duplicate", rewards=[], reason=f"task {task_id} was already submitted ({outcome[0]})"
            )
        return None

    def _held(self, worker_id: str, task_id: str) -> buffer.Entry[TaskSpec, Group]:
        entry = self.ledger.lease_of(task_id)
        if entry is None or entry.worker != worker_id:
            raise Rejected(
                409,
                "lease_not_held",
                "taskId",
                f"worker {worker_id} holds no lease on task {task_id!r} (it expired and the task was "
                "re-issued, or it was never leased to this worker)",
            )
        return entry

    def _validate(self, worker: Worker, req: wire.SubmitRequest) -> None:
        cfg = self.config
        refusal = trust.group_refusal(
            req,
            group_size=cfg.group_size,
            max_new_tokens=cfg.max_new_tokens,
            vocab_size=cfg.vocab_size,
            published=self.published,
            known_versions=worker.known_versions,
            detokenizer=self.detokenizer,
        )
        if refusal is not None:
            if refusal.reason is not None:
                self.rejected.add(worker.pool, refusal.reason)
            raise Rejected(422, "invalid", refusal.field, refusal.message)

    # ------------------------------------------------------------------------------------- trainer
    def announce(self, version: int) -> wire.AnnounceReply:
        """The trainer published snapshot ``version``: workers may load it; newly too-stale groups go."""
        if version < self.published:
            raise Rejected(
                409,
                "conflict",
                "version",
                f"published versions never decrease: the newest is {self.published}, announced {version}",
            )
        self.published = version
        dropped = self._advance(version)
        return wire.AnnounceReply(policy_version=self.t_train, dropped_stale=dropped)

    def quarantine(self, req: wire.QuarantineRequest) -> wire.QuarantineReply:
        """The trainer caught a worker whose behaviour log-probs disagree with its recomputation: refuse
        the worker from now on, drop its buffered groups (their prompts go back to the queue), return its
        leases, and withdraw its groups from the batch the trainer is about to train on (a retry at that
        version gets a new batch)."""
        return self._quarantine(req.worker_id, req.reason, req.mismatch, req.version, req.pool)

    def _quarantine(
        self, worker_id: str, reason: str, mismatch: float | None, version: int, pool: str | None = None
    ) -> wire.QuarantineReply:
        worker = self.workers.get(worker_id)
        known = self.quarantined.get(worker_id)
        if known is None:
            self.quarantined[worker_id] = Quarantine(
                worker_id=worker_id,
                pool=worker.pool if worker is not None else (pool or ""),
                host=worker.host if worker is not None else None,
                reason=reason,
                mismatch=mismatch,
                version=version,
            )
        if worker is not None:
            worker.quarantine = self.quarantined[worker_id]
        released = len(self.ledger.release_worker(worker_id))
        doomed = self.ledger.drop_buffered(lambda e: e.group is not None and e.group.worker_id == worker_id)
        self._requeue(doomed)
        self.dropped_quarantined += len(doomed)
        batch = self.last_batch
        current = batch is not None and batch.version == version == self.t_train
        handed = [e for e in self._last_taken if e.group is not None and e.group.worker_id == worker_id]
        if not current:
            handed = []
        if handed and self.last_batch is not None:
            # The trainer checks a batch before training on it: the worker's groups in the batch it is
            # about to train on are withdrawn (counted as dropped, prompts re-queued), and a retry at that
            # version gets a new batch. A batch of an older version was trained on already.
            self._withdraw(handed, self.last_batch.version)
            self.dropped_quarantined += len(handed)
            self.last_batch, self._last_taken = None, []
        return wire.QuarantineReply(dropped_groups=len(doomed) + len(handed), released_leases=released)

    def pull_batch(self, version: int, now: float, step_seconds: float | None = None) -> wire.BatchReply:
        """The batch for the step ``version -> version+1``, or ``ready=False`` if not enough groups yet.

        One batch per version: asking again at the version of the last batch returns that batch again
        (a retry after a lost reply), so the step consumes it exactly once — unless a quarantine
        withdrew it, in which case a new one is assembled. ``step_seconds``: the trainer's own time for
        its last version, when it says (a prefetching trainer); otherwise the time from the last batch
        taken to this first request stands for it."""
        if self.last_batch is not None and version == self.last_batch.version:
            return self.last_batch
        if (
            self._previous is not None
            and version == self._previous[0].version
            and version < self.t_train
            and self.published <= version
        ):
            return self._rewind()
        if version < self.t_train:
            raise Rejected(
                409,
                "conflict",
                "version",
                f"the trainer asks at version {version} but t_train is already {self.t_train}; "
                "policy versions never go back",
            )
        self._advance(version)
        if self._asked is None or self._asked[0] != version:  # its first request for this step
            if step_seconds is not None:
                own = self.trainer_seconds
                self.trainer_seconds = step_seconds if own is None else 0.8 * own + 0.2 * step_seconds
            elif (
                self._last_take_at is not None
                and self.last_batch is not None
                and self.last_batch.version == version - 1
            ):
                took = max(0.0, now - self._last_take_at)
                own = self.trainer_seconds
                self.trainer_seconds = took if own is None else 0.8 * own + 0.2 * took
            self._asked = (version, now)
        size = self.config.batch_size
        if self.ledger.buffered < size:
            if self.sequential and not self.round_open:
                self.round_open, self.ledger.capacity = True, size
            return wire.BatchReply(
                ready=False,
                version=version,
                groups=[],
                retry_after_seconds=min(1.0, self.config.heartbeat_interval),
            )
        entries = self.ledger.take(size)
        self._previous = None if self.last_batch is None else (self.last_batch, self._last_taken)
        self._last_taken = entries
        self._last_take_at = now
        if self.sequential:
            self.round_open, self.ledger.capacity = False, 0
        groups = [self._group_out(e, version) for e in entries]
        self.batches += 1
        rewards = [r.reward for g in groups for r in g.rollouts]
        self.last_reward = sum(rewards) / len(rewards)
        self.last_batch = wire.BatchReply(ready=True, version=version, groups=groups)
        return self.last_batch

    def _rewind(self) -> wire.BatchReply:
        """A trainer resumed at the version before ``t_train``, whose successor was never published: the
        one that asked at ``t_train`` (prefetching) died before publishing. It gets its version's batch
        again, as a retry would; the batch prefetched at ``t_train`` was never trained on, so its groups
        are withdrawn and their prompts re-queued; ``t_train`` goes back to the resumed version."""
        assert self._previous is not None
        batch, taken = self._previous
        if self.last_batch is not None:
            self._withdraw(self._last_taken, self.last_batch.version)
        self.last_batch, self._last_taken, self._previous = batch, taken, None
        self.t_train = batch.version
        self._asked = None
        return batch

    def _withdraw(self, entries: list[buffer.Entry[TaskSpec, Group]], version: int) -> None:
        """Take back groups handed out in the batch of ``version`` that no step will train on: they no
        longer count as consumed, and their prompts go back to the front of the queue."""
        for entry in entries:
            self.consumed_groups -= 1
            self.staleness_histogram[version - (entry.version or 0)] -= 1
        self._requeue(entries)

    def _group_out(self, entry: buffer.Entry[TaskSpec, Group], t: int) -> wire.GroupOut:
        assert entry.group is not None and entry.version is not None
        verdict = staleness.admit(entry.version, t, self.config.policy)
        assert verdict.consume, verdict.reason  # _advance dropped everything else
        self.consumed_groups += 1
        self.staleness_histogram[verdict.staleness] += 1
        self.max_observed_staleness = max(self.max_observed_staleness or 0, verdict.staleness)
        self.weighted_stale += verdict.importance_weighted
        rollouts = [
            wire.RolloutOut(
                completion=s.rollout.completion,
                token_ids=s.rollout.token_ids,
                logprobs=s.rollout.logprobs,
                policy_version=s.rollout.policy_version,
                staleness=t - s.rollout.policy_version,
                reward=s.reward.value,
                reward_components=dict(s.reward.components),
                reward_reason=s.reward.reason,
                backend=s.backend,
                device=s.device,
                dtype=s.dtype,
                finish_reason=s.rollout.finish_reason,
            )
            for s in entry.group.rollouts
        ]
        problem = entry.payload.problem
        return wire.GroupOut(
            task_id=entry.id,
            problem_id=problem.id,
            prompt=problem.prompt,
            worker_id=entry.group.worker_id,
            policy_version=entry.version,
            staleness=verdict.staleness,
            importance_weighted=verdict.importance_weighted,
            rollouts=rollouts,
        )

    def _advance(self, version: int) -> int:
        """Move t_train forward (never back) and drop, counted, every buffered group now too stale."""
        self.t_train = max(self.t_train, version)
        policy, t = self.config.policy, self.t_train
        dropped = self.ledger.drop_buffered(lambda e: not staleness.admit(e.version or 0, t, policy).consume)
        self._requeue(dropped)
        self.dropped_stale += len(dropped)
        return len(dropped)

    # ------------------------------------------------------------------------------------- status
    def status(self, now: float, wall_now: float) -> wire.StatusDocument:
        """The status document (``GET /v1/status``; :func:`.report.status_document`)."""
        from echo_runtime.coordinator import report

        return report.status_document(self, now, wall_now)
