"""The coordinator's state machine: workers, versions, leases, the buffer and both sync protocols.

No I/O, no clock, no threads: every method takes ``now`` (seconds, monotonic) and returns a wire model
or raises :class:`Rejected`. The HTTP layer (:mod:`.api`) is a thin shell around it, and the property
tests drive it directly through any interleaving of publishes, leases, submissions, expiries and pulls.

Protocols (docs/coordinator.md has the whole story):

* ``t_train`` is the trainer's version (the larger of the versions it announced and asked a batch at);
  ``published`` is the newest version it announced as published, the newest a worker can load (0 is
  the base model). Tasks are tagged ``minVersion = t_train - bound``; a worker whose loaded version is
  below that is told to load ``published`` (in register, heartbeat and lease replies). ``bound`` is Δmax
  in Async mode and the refresh threshold in Sequential mode (:mod:`.staleness`).
* **Async**: leasing is open whenever the ledger has room; the room is the replay-buffer capacity minus
  pending, leased and buffered tasks, so a full buffer pauses leasing (backpressure). The trainer pulls
  batches whenever it likes.
* **Sequential**: leasing opens only while the trainer waits for a batch (a *round* at version t,
  capacity batchSize); the round closes when the batch is handed out.

Invariants (property-tested):

* every group handed to the trainer passes :func:`.staleness.admit` at the trainer's version — so no
  batch holds a rollout with staleness > Δmax;
* a group is handed out at most once; every task ends consumed, dropped-and-counted, or back in the
  pending queue to be re-leased (:mod:`.buffer`);
* a rejected request changes nothing: validation completes before the first mutation;
* ``t_train`` never decreases.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import itertools
import math
import secrets
from collections.abc import Iterator

from echo_runtime import staleness

from echo_runtime.coordinator import buffer, wire
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
    ) -> None:
        self.config = config
        self.task = task
        self.t_train = t_train
        """The trainer's version: the larger of the versions it announced and asked batches at."""
        self.published = t_train
        """The newest version announced as published: the newest a worker can load (0: the base model)."""
        self.last_batch: wire.BatchReply | None = None
        """The last batch handed out, returned again if the trainer retries the same version."""
        self._prompts = prompts if prompts is not None else self.default_prompts(task, config, t_train)
        self.epoch = secrets.token_hex(3)
        """Distinguishes task ids across coordinator restarts."""
        self._task_counter = itertools.count(1)
        self.ledger: Ledger = buffer.TaskLedger(0 if self.sequential else config.buffer_capacity)
        self.workers: dict[str, Worker] = {}
        self.round_open = False
        self.staleness_histogram: collections.Counter[int] = collections.Counter()
        self.max_observed_staleness: int | None = None
        self.dropped_stale = 0
        self.weighted_stale = 0
        self.consumed_groups = 0
        self.accepted_rollouts = 0
        self.batches = 0
        self.last_reward: float | None = None
        self.workers_expired = 0
        self.rate = RateWindow(config.rate_window, now)

    @staticmethod
    def default_prompts(
        task: tasks_base.Task, config: CoordinatorConfig, t_train: int
    ) -> Iterator[tasks_base.Problem]:
        """The train stream, skipped ahead past what ``t_train`` steps consumed (a restart resumes there;
        exact when no group was dropped)."""
        stream = task.prompts("train", config.seed)
        return itertools.islice(stream, t_train * config.batch_size, None)

    @property
    def sequential(self) -> bool:
        return self.config.policy.mode == "Sequential"

    @property
    def min_version(self) -> int:
        return self.config.policy.min_version(self.t_train)

    # ------------------------------------------------------------------------------------- workers
    def register(self, req: wire.RegisterRequest, session_hash: bytes, now: float) -> wire.RegisterReply:
        if req.pool not in self.config.pools:
            raise Rejected(
                422,
                "invalid",
                "pool",
                f"unknown pool {req.pool!r}; this job's pools: {', '.join(self.config.pools)}",
            )
        worker_id = f"w-{secrets.token_hex(4)}"
        while worker_id in self.workers:
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

    def heartbeat(self, worker_id: str, req: wire.HeartbeatRequest, now: float) -> wire.HeartbeatReply:
        worker = self.worker(worker_id)
        if req.loaded_version is not None and req.loaded_version > self.published:
            raise Rejected(
                422,
                "invalid",
                "loadedVersion",
                f"version {req.loaded_version} was never published: the newest is {self.published}",
            )
        worker.last_seen = now
        worker.loaded_version = req.loaded_version
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
        released += len(self.ledger.expire(now))
        return dead, released

    def _instructions(self, worker: Worker, now: float) -> tuple[int, int, int | None]:
        """(t_train, minVersion, loadVersion): tell a worker to load the newest published version once its
        own would break the bound."""
        min_version, loaded = self.min_version, worker.loaded_version
        load: int | None = None
        if loaded is None or (loaded < min_version and loaded < self.published):
            load = self.published
            if worker.told_version != load:
                worker.told_version, worker.told_at = load, now
        else:
            worker.told_version = worker.told_at = None
        return self.t_train, min_version, load

    def _stuck(self, worker: Worker, now: float) -> bool:
        """Told to load a version, still below it after a lease timeout."""
        if worker.told_version is None or worker.told_at is None:
            return False
        behind = worker.loaded_version is None or worker.loaded_version < worker.told_version
        return behind and now - worker.told_at > self.config.lease_timeout

    # ------------------------------------------------------------------------------------- leases
    def lease(self, worker_id: str, max_tasks: int, now: float) -> wire.LeaseReply:
        worker = self.worker(worker_id)
        worker.last_seen = now
        want = min(max_tasks, worker.capacity - self.ledger.leases_of(worker_id))
        for _ in range(min(self.ledger.room(), max(0, want - self.ledger.pending))):
            if not self._new_task():
                break
        min_version = self.min_version
        entries = self.ledger.lease(worker_id, max(0, want), now, now + self.config.task_timeout)
        tasks = []
        for entry in entries:
            problem = entry.payload.problem
            tasks.append(
                wire.TaskOut(
                    task_id=entry.id,
                    problem_id=problem.id,
                    prompt=problem.prompt,
                    group_size=self.config.group_size,
                    min_version=min_version,
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
        self.ledger.add(f"{self.epoch}-{next(self._task_counter)}", TaskSpec(problem))
        return True

    # ------------------------------------------------------------------------------------- rollouts
    def submit(self, worker_id: str, task_id: str, req: wire.SubmitRequest, now: float) -> wire.SubmitReply:
        """Validate, re-score and buffer (or drop as stale) one group. Raises Rejected, changing nothing."""
        worker = self.worker(worker_id)
        outcome = self.ledger.outcome(task_id)
        if (
            outcome is not None
            and outcome[0] in ("buffered", "consumed", "dropped")
            and outcome[1] == worker_id
        ):
            worker.last_seen = now
            return wire.SubmitReply(
                outcome="duplicate", rewards=[], reason=f"task {task_id} was already submitted ({outcome[0]})"
            )
        entry = self.ledger.lease_of(task_id)
        if entry is None or entry.worker != worker_id:
            raise Rejected(
                409,
                "lease_not_held",
                "taskId",
                f"worker {worker_id} holds no lease on task {task_id!r} (it expired and the task was "
                "re-issued, or it was never leased to this worker)",
            )
        self._validate(req)
        problem = entry.payload.problem
        scored = tuple(
            ScoredRollout(
                rollout=r,
                reward=self.task.score(problem, r.completion),
                backend=r.backend or worker.backend,
                device=r.device or worker.device,
                dtype=r.dtype or worker.dtype,
            )
            for r in req.rollouts
        )
        worker.last_seen = now
        version = min(r.policy_version for r in req.rollouts)
        verdict = staleness.admit(version, self.t_train, self.config.policy)
        rewards = [s.reward.value for s in scored]
        if not verdict.consume:
            self.ledger.discard(task_id, worker_id)
            self.dropped_stale += 1
            return wire.SubmitReply(
                outcome="dropped", rewards=rewards, staleness=verdict.staleness, reason=verdict.reason
            )
        self.ledger.complete(task_id, worker_id, Group(scored, worker_id), version)
        self.accepted_rollouts += len(scored)
        worker.rate.add(now, len(scored))
        self.rate.add(now, len(scored))
        return wire.SubmitReply(outcome="buffered", rewards=rewards, staleness=verdict.staleness)

    def _validate(self, req: wire.SubmitRequest) -> None:
        cfg = self.config
        if len(req.rollouts) != cfg.group_size:
            raise Rejected(
                422,
                "invalid",
                "rollouts",
                f"a group has exactly {cfg.group_size} rollouts, got {len(req.rollouts)}",
            )
        for i, r in enumerate(req.rollouts):
            where = f"rollouts[{i}]"
            if len(r.token_ids) > cfg.max_new_tokens:
                raise Rejected(
                    422,
                    "invalid",
                    f"{where}.tokenIds",
                    f"at most maxNewTokens ({cfg.max_new_tokens}) tokens, got {len(r.token_ids)}",
                )
            if len(r.logprobs) != len(r.token_ids):
                raise Rejected(
                    422,
                    "invalid",
                    f"{where}.logprobs",
                    f"one log-prob per token id: {len(r.token_ids)} token ids, {len(r.logprobs)} log-probs",
                )
            if max(r.token_ids) >= cfg.vocab_size:
                j = next(j for j, tok in enumerate(r.token_ids) if tok >= cfg.vocab_size)
                raise Rejected(
                    422,
                    "invalid",
                    f"{where}.tokenIds[{j}]",
                    f"token id {r.token_ids[j]} is outside the vocabulary (0..{cfg.vocab_size - 1})",
                )
            if r.policy_version > self.published:
                raise Rejected(
                    422,
                    "invalid",
                    f"{where}.policyVersion",
                    f"version {r.policy_version} was never published: the newest is {self.published}",
                )
            if not all(math.isfinite(x) and x <= 0.0 for x in r.logprobs):  # the wire model checks too
                raise Rejected(422, "invalid", f"{where}.logprobs", "log-probs must be finite and ≤ 0")

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

    def pull_batch(self, version: int, now: float) -> wire.BatchReply:
        """The batch for the step ``version -> version+1``, or ``ready=False`` if not enough groups yet.

        One batch per version: asking again at the version of the last batch returns that batch again
        (a retry after a lost reply), so the step consumes it exactly once."""
        if self.last_batch is not None and version == self.last_batch.version:
            return self.last_batch
        if version < self.t_train:
            raise Rejected(
                409,
                "conflict",
                "version",
                f"the trainer asks at version {version} but t_train is already {self.t_train}; "
                "policy versions never go back",
            )
        self._advance(version)
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
        if self.sequential:
            self.round_open, self.ledger.capacity = False, 0
        groups = [self._group_out(e, version) for e in entries]
        self.batches += 1
        rewards = [r.reward for g in groups for r in g.rollouts]
        self.last_reward = sum(rewards) / len(rewards)
        self.last_batch = wire.BatchReply(ready=True, version=version, groups=groups)
        return self.last_batch

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
        self.dropped_stale += len(dropped)
        return len(dropped)

    # ------------------------------------------------------------------------------------- status
    def status(self, now: float, wall_now: float) -> wire.StatusDocument:
        pools: dict[str, list[Worker]] = {name: [] for name in self.config.pools}
        workers = []
        for w in self.workers.values():
            pools.setdefault(w.pool, []).append(w)
            seen = datetime.datetime.fromtimestamp(wall_now - (now - w.last_seen), tz=datetime.UTC)
            workers.append(
                wire.WorkerStatus(
                    id=w.id,
                    pool=w.pool,
                    host=w.host,
                    backend=w.backend,
                    device=w.device,
                    dtype=w.dtype,
                    external=w.external,
                    loaded_version=w.loaded_version,
                    last_heartbeat=seen.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    rollouts_per_second=round(w.rate.rate(now), 3),
                    stuck=self._stuck(w, now),
                )
            )
        summaries = {}
        for name, members in pools.items():
            loaded = [w.loaded_version for w in members if w.loaded_version is not None]
            summaries[name] = wire.PoolSummary(
                workers=len(members),
                min_loaded_version=min(loaded) if len(loaded) == len(members) and loaded else None,
            )
        capacity = self.config.batch_size if self.sequential else self.config.buffer_capacity
        return wire.StatusDocument(
            job=self.config.job,
            mode=self.config.policy.mode,
            max_staleness=self.config.policy.max_staleness,
            policy_version=self.t_train,
            buffer=wire.BufferStatus(groups=self.ledger.buffered, capacity=capacity),
            max_observed_staleness=self.max_observed_staleness,
            staleness_histogram={str(k): v for k, v in sorted(self.staleness_histogram.items())},
            dropped_stale=self.dropped_stale,
            weighted_stale=self.weighted_stale,
            consumed_groups=self.consumed_groups,
            rollouts_per_second=round(self.rate.rate(now), 3),
            reward=self.last_reward,
            workers=workers,
            pools=summaries,
        )
