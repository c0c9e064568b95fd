"""The coordinator's state machine: workers, versions, leases, the buffer and both sync protocols.

No I/O, no clock, no threads: every method takes ``now`` (seconds, monotonic) and returns a wire model
or raises :class:`.errors.Rejected`. The HTTP layer (:mod:`.api`) is a thin shell around it, and the
property tests drive it directly through any interleaving of publishes, leases, submissions, expiries
and pulls.

:class:`CoordinatorState` composes the parts, each pure and tested on its own, and owns what ties them
together — ``t_train``, ``published``, the prompt stream and the task ledger (:mod:`.buffer`):

* :mod:`.roster` — the registered workers, and what each is told to load;
* :mod:`.pacing` — which tasks may be leased now, to whom, tagged with which ``minVersion``;
* :mod:`.handout` — the groups in the ledger, the batches handed to the trainer, retries and rewinds;
* :mod:`.quarantine` — the workers caught, and the lease-hoarding rule;
* :mod:`.counters` — the tallies the status document (:mod:`.report`) and Prometheus read.

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
* ``t_train`` never decreases, but for one case: a trainer resumed before a prefetched batch whose
  version was never published takes ``t_train`` back to its own version (:meth:`.handout.Handout.rewind`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import secrets
from collections.abc import Iterator, Sequence

from echo_runtime import rollout, staleness
from echo_runtime.backends import seeded
from echo_runtime.coordinator import (
    buffer,
    convert,
    counters,
    errors,
    handout,
    pacing,
    quarantine,
    roster,
    signal,
    trust,
    wire,
    withholding,
)
from echo_runtime.coordinator.config import CoordinatorConfig
from echo_runtime.tasks import base as tasks_base


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A validated submission waiting for its rewards (scoring runs off the event loop)."""

    worker_id: str
    task_id: str
    problem: tasks_base.Problem
    request: wire.SubmitRequest


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
        self._prompts = prompts if prompts is not None else self.default_prompts(task, config, t_train)
        self.epoch = secrets.token_hex(3)
        """Distinguishes task ids (and status counters) across coordinator restarts."""
        self._task_counter = itertools.count(1)
        self.ledger: handout.Ledger = buffer.TaskLedger(0 if self.sequential else config.buffer_capacity)
        self.round_open = False
        """Sequential mode: the trainer waits for a batch, so batchSize tasks may be leased."""
        self.roster = roster.Roster(config)
        self.quarantined = quarantine.Quarantines()
        self.tallies: dict[str, withholding.Tally] = {}
        """Per pool, over every worker it ever had: groups submitted, their rewards, leases lapsed."""
        self.pacing = pacing.Pacing(config)
        self.handout = handout.Handout()
        self.counters = counters.Counters(rate=counters.RateWindow(config.rate_window, now))
        self.signal = signal.SignalWatch(
            dynamic_sampling=config.dynamic_sampling, set_aside_after=config.set_aside_after
        )

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
        return self.handout.next_step(self.t_train)

    def versions(self) -> pacing.Versions:
        return pacing.Versions(self.t_train, self.published, self.next_step)

    # ------------------------------------------------------------------------------------- workers
    def register(self, req: wire.RegisterRequest, session_hash: bytes, now: float) -> wire.RegisterReply:
        worker = self.roster.register(req, session_hash, now, self.quarantined)
        t, min_version, load = self._instructions(worker, now)
        return wire.RegisterReply(
            worker_id=worker.id,
            session_key="",
            capacity=worker.capacity,
            lease_timeout_seconds=self.config.lease_timeout,
            heartbeat_interval_seconds=self.config.heartbeat_interval,
            policy_version=t,
            min_version=min_version,
            load_version=load,
        )

    def worker(self, worker_id: str) -> roster.WorkerRecord:
        """The registered worker ``worker_id``, or a 404 telling it to register again."""
        return self.roster.get(worker_id)

    def heartbeat(self, worker_id: str, req: wire.HeartbeatRequest, now: float) -> wire.HeartbeatReply:
        worker = self.roster.active(worker_id)
        self.roster.report(worker, req.loaded_version, self.published)
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
        self.roster.get(worker_id)
        del self.roster.workers[worker_id]
        return wire.LeaveReply(released_tasks=len(self.ledger.release_worker(worker_id)))

    def expire(self, now: float) -> tuple[list[str], int]:
        """Forget workers silent past the lease timeout and re-issue their and any overdue leases;
        quarantine a live worker whose leases overran too many sweeps in a row (a lease hoarder).

        Returns (expired worker ids, number of leases returned to the pending queue)."""
        dead = self.roster.silent(now)
        released = 0
        for worker_id in dead:
            del self.roster.workers[worker_id]
            released += len(self.ledger.release_worker(worker_id))
        self.counters.workers_expired += len(dead)
        overdue = self.ledger.overdue(now)
        hoarders = {worker for _, worker in overdue}
        for _, worker_id in overdue:
            lapsing = self.roster.workers.get(worker_id)
            if lapsing is not None:
                lapsing.tally.lapsed += 1
                self.tallies.setdefault(lapsing.pool, withholding.Tally()).lapsed += 1
        released += len(self.ledger.expire(now))
        for worker_id in sorted(hoarders):
            worker = self.roster.workers.get(worker_id)
            if worker is None or worker.quarantine is not None:
                continue
            worker.overdue += 1
            if quarantine.hoarding(worker.overdue):
                reason = quarantine.hoarding_reason(worker.overdue, self.config.task_timeout)
                self._quarantine(worker_id, reason, None, self.t_train)
        return dead, released

    def _instructions(self, worker: roster.WorkerRecord, now: float) -> tuple[int, int, int | None]:
        """(t_train, minVersion, loadVersion) for a reply to ``worker``: load the newest published
        version once its own is below what its next task needs (:meth:`.pacing.Pacing.need`)."""
        need = self.pacing.need(self.ledger, self.versions(), now)
        load = self.roster.instruct(worker, need, self.min_version, self.published, now)
        return self.t_train, max(self.min_version, need), load

    # ------------------------------------------------------------------------------------- leases
    def lease(
        self, worker_id: str, max_tasks: int, now: float, loaded_version: int | None = None
    ) -> wire.LeaseReply:
        worker = self.roster.active(worker_id)
        self.roster.report(worker, loaded_version, self.published)
        worker.last_seen = now
        want = min(max_tasks, worker.capacity - self.ledger.leases_of(worker_id))
        pool_limit = self.config.pool_max_leases.get(worker.pool)
        if pool_limit is not None:
            held = sum(self.ledger.leases_of(w.id) for w in self.roster.in_pool(worker.pool))
            want = min(want, pool_limit - held)
        at = self.versions()
        ahead = self.pacing.ahead(self.ledger, now)
        want = self.pacing.paced(want, worker, ahead, at, now, self.roster.workers.values())
        floors = [
            self.pacing.floor(ahead + math.floor(i * self.pacing.keep), at) for i in range(max(0, want))
        ]
        for _ in range(min(self.ledger.room(), max(0, len(floors) - self.ledger.pending))):
            if not self._new_task():
                break
        entries = self.ledger.lease(worker_id, len(floors), now, now + self.config.task_timeout)
        tasks = []
        for entry, floor in zip(entries, floors, strict=False):
            problem = entry.payload.problem
            entry.key = secrets.token_hex(seeded.KEY_BITS // 8)  # fresh each lease: unknown until leased
            tasks.append(
                wire.TaskOut(
                    task_id=entry.id,
                    problem_id=problem.id,
                    prompt=problem.prompt,
                    group_size=self.config.group_size,
                    min_version=floor,
                    sampling=wire.TaskSampling(
                        temperature=self.config.temperature,
                        top_p=self.config.top_p,
                        max_new_tokens=self.config.max_new_tokens,
                        key=entry.key,
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
        while problem is not None and self.signal.set_aside(problem.id):
            problem = next(self._prompts, None)
        if problem is None:
            return False
        self.ledger.add(self._task_id(), handout.TaskPayload(problem))
        return True

    def _task_id(self) -> str:
        return f"{self.epoch}-{next(self._task_counter)}"

    def _requeue(self, entries: list[handout.Entry]) -> None:
        """Give the prompts of dropped groups back to the front of the queue, in their order."""
        for entry in reversed(entries):
            self.ledger.add(self._task_id(), entry.payload, front=True)
        self.counters.requeued_prompts += len(entries)

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
        malformed group or a rollout that fails a trust check raises :class:`.errors.Rejected`. Changes
        nothing but the worker's last-seen time and the per-pool rejection counts."""
        worker = self.roster.active(worker_id)
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
        have expired, or the worker been quarantined, while the group was scored). Then the worker's
        record of submissions and lapses is judged for withholding (:mod:`.withholding`)."""
        reply = self._commit(prepared, rewards, now, timeouts=timeouts, errors=errors)
        if reply.outcome != "duplicate":
            self._watch(prepared.worker_id, reply.rewards)
        return reply

    def _watch(self, worker_id: str, rewards: Sequence[float]) -> None:
        worker = self.roster.workers.get(worker_id)
        if worker is None or worker.quarantine is not None:
            return
        worker.tally.submitted(list(rewards))
        pool = self.tallies.setdefault(worker.pool, withholding.Tally())
        pool.submitted(list(rewards))
        if not withholding.due(worker.tally.groups):
            return
        others = pool.minus(worker.tally)
        if others.groups < withholding.MIN_GROUPS:  # too few others in its pool: the whole job's
            everyone = withholding.Tally()
            for tally in self.tallies.values():
                everyone = everyone.plus(tally)
            others = everyone.minus(worker.tally)
        verdict = withholding.judge(worker.tally, others)
        worker.withholding = None if verdict is None else verdict.message
        if verdict is not None and verdict.quarantine:
            self._quarantine(worker_id, f"withholding: {verdict.message}", None, self.t_train)

    def _commit(
        self,
        prepared: Prepared,
        rewards: Sequence[tasks_base.Reward],
        now: float,
        *,
        timeouts: int,
        errors: int,
    ) -> wire.SubmitReply:
        worker_id, task_id, req = prepared.worker_id, prepared.task_id, prepared.request
        worker = self.roster.active(worker_id)
        repeat = self._duplicate(worker, task_id, now)
        if repeat is not None:
            return repeat
        entry = self._held(worker_id, task_id)
        self.pacing.delivered(worker, max(0.0, now - entry.leased_at))
        scored = tuple(
            convert.accepted(r, reward, backend=worker.backend, device=worker.device, dtype=worker.dtype)
            for r, reward in zip(req.rollouts, rewards, strict=True)
        )
        worker.last_seen = now
        self.counters.verifier_timeouts += timeouts
        self.counters.verifier_errors += errors
        self.counters.generated_groups += 1
        version = min(r.policy_version for r in req.rollouts)
        verdict = staleness.admit(version, self.t_train, self.config.policy)
        values = [r.reward for r in scored]
        if not verdict.consume:
            self._requeue([self.ledger.discard(task_id, worker_id)])
            self.counters.dropped_stale += 1
            return wire.SubmitReply(
                outcome="dropped", rewards=values, staleness=verdict.staleness, reason=verdict.reason
            )
        if not self.signal.completed(prepared.problem.id, values):
            self.ledger.discard(task_id, worker_id)  # its prompt had nothing to teach: not re-queued
            self._plan_for_filter()
            return wire.SubmitReply(
                outcome="dropped",
                rewards=values,
                staleness=verdict.staleness,
                reason="filtered: every reward of the group is equal (dynamic sampling)",
            )
        self._plan_for_filter()
        key = entry.key if worker.backend in seeded.BACKENDS else None  # vLLM: not drawn with keys
        self.ledger.complete(
            task_id, worker_id, rollout.Group(scored, id=task_id, worker=worker_id, key=key), version
        )
        worker.overdue = 0
        worker.rate.add(now, len(scored))
        self.counters.accepted(len(scored), now, worker.pool)
        return wire.SubmitReply(outcome="buffered", rewards=values, staleness=verdict.staleness)

    def _plan_for_filter(self) -> None:
        """Dynamic sampling (Async): a leased task yields a group only ``keepRate`` of the time, so pacing
        counts it as that much of a group and the buffer bounds ``bufferSize ÷ keepRate`` outstanding
        tasks (:mod:`.signal`). Sequential rounds refill themselves: a filtered task frees its place."""
        if not self.config.dynamic_sampling:
            return
        keep = self.signal.planning_keep
        self.pacing.keep = keep
        if not self.sequential:
            self.ledger.capacity = math.ceil(self.config.buffer_capacity / keep)

    def _duplicate(self, worker: roster.WorkerRecord, task_id: str, now: float) -> wire.SubmitReply | None:
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

    def _held(self, worker_id: str, task_id: str) -> handout.Entry:
        entry = self.ledger.lease_of(task_id)
        if entry is None or entry.worker != worker_id:
            raise errors.Rejected(
                409,
                "lease_not_held",
                "taskId",
                f"worker {worker_id} holds no lease on task {task_id!r} (it expired and the task was "
                "re-issued, or it was never leased to this worker)",
            )
        return entry

    def _validate(self, worker: roster.WorkerRecord, req: wire.SubmitRequest) -> None:
        cfg = self.config
        refusal = trust.group_refusal(
            req,
            group_size=cfg.group_size,
            max_new_tokens=cfg.max_new_tokens,
            vocab_size=cfg.vocab_size,
            published=self.published,
            known_versions=worker.known_versions,
            detokenizer=self.detokenizer,
            known_floor=worker.known_floor,
            registered={"backend": worker.backend, "device": worker.device, "dtype": worker.dtype},
        )
        if refusal is not None:
            if refusal.reason is not None:
                self.counters.rejected.add(worker.pool, refusal.reason)
            raise errors.Rejected(422, "invalid", refusal.field, refusal.message)

    # ------------------------------------------------------------------------------------- trainer
    def announce(self, version: int) -> wire.AnnounceReply:
        """The trainer published snapshot ``version``: workers may load it; newly too-stale groups go."""
        if version < self.published:
            raise errors.Rejected(
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
        worker = self.roster.workers.get(worker_id)
        released = len(self.ledger.release_worker(worker_id))
        doomed = self.ledger.drop_buffered(lambda e: e.group is not None and e.group.worker == worker_id)
        self._requeue(doomed)
        self.counters.dropped_quarantined += len(doomed)
        withdrawn = self.handout.withdraw_worker(worker_id, version, self.t_train)
        if withdrawn is not None:
            self._withdraw(withdrawn)
            self.counters.dropped_quarantined += len(withdrawn.entries)
        handed = 0 if withdrawn is None else len(withdrawn.entries)
        # What is left handed out is what steps trained on before the worker was caught: counted, never silent.
        record = self.quarantined.catch(
            worker_id,
            pool=worker.pool if worker is not None else (pool or ""),
            host=worker.host if worker is not None else None,
            reason=reason,
            mismatch=mismatch,
            version=version,
            trained_groups=worker.consumed_groups if worker is not None else 0,
        )
        if worker is not None:
            worker.quarantine = record
        return wire.QuarantineReply(dropped_groups=len(doomed) + handed, released_leases=released)

    def pull_batch(self, version: int, now: float, step_seconds: float | None = None) -> wire.BatchReply:
        """The batch for the step ``version -> version+1``, or ``ready=False`` if not enough groups yet.

        One batch per version: asking again at the version of the last batch returns that batch again
        (a retry after a lost reply), so the step consumes it exactly once — unless a quarantine
        withdrew it, in which case a new one is assembled. ``step_seconds``: the trainer's own time for
        its last version, when it says (a prefetching trainer); otherwise the time from the last batch
        taken to this first request stands for it."""
        again = self.handout.again(version)
        if again is not None:
            return again
        if self.handout.may_rewind(version, self.t_train, self.published):
            batch, withdrawn = self.handout.rewind(version)
            for withdrawal in withdrawn:
                self._withdraw(withdrawal)
            self.t_train = batch.version
            self.pacing.rewound()
            return batch
        if version < self.t_train:
            raise errors.Rejected(
                409,
                "conflict",
                "version",
                f"the trainer asks at version {version} but t_train is already {self.t_train}; "
                "policy versions never go back",
            )
        self._advance(version)
        self.pacing.asked(version, now, step_seconds, self.handout.last_version)
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
        self.pacing.taken(now)
        if self.sequential:
            self.round_open, self.ledger.capacity = False, 0
        groups = [handout.group_out(e, version, self.config.policy) for e in entries]
        for group in groups:
            self.counters.consumed(group.staleness, group.importance_weighted)
        self.counters.handed([r.reward for g in groups for r in g.rollouts])
        self.signal.handed([[r.reward for r in g.rollouts] for g in groups])
        for entry in entries:
            self._consumed(entry, +1)
        return self.handout.hand(version, entries, groups)

    def _withdraw(self, withdrawal: handout.Withdrawal) -> None:
        """Take back groups handed out that no step will train on: they no longer count as consumed, and
        their prompts go back to the front of the queue."""
        for entry in withdrawal.entries:
            self.counters.withdrawn(withdrawal.version - (entry.version or 0))
            self._consumed(entry, -1)
        self._requeue(withdrawal.entries)

    def _consumed(self, entry: handout.Entry, change: int) -> None:
        """Count ``entry``'s group as handed to a step (+1) or taken back (−1) for the worker that made it."""
        worker = self.roster.workers.get(entry.group.worker) if entry.group is not None else None
        if worker is not None:
            worker.consumed_groups += change

    def _advance(self, version: int) -> int:
        """Move t_train forward (never back) and drop, counted, every buffered group now too stale."""
        self.t_train = max(self.t_train, version)
        policy, t = self.config.policy, self.t_train
        dropped = self.ledger.drop_buffered(lambda e: not staleness.admit(e.version or 0, t, policy).consume)
        self._requeue(dropped)
        # A rewind takes t_train back to a version ≥ published, never below: versions under
        # min(t_train, published) − Δmax can never be admitted again, and no worker need be known to hold them.
        self.roster.forget_below(min(t, self.published) - policy.bound)
        self.counters.dropped_stale += len(dropped)
        return len(dropped)
