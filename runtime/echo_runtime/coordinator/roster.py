"""The coordinator's roster of registered workers, and what each is told to load.

A :class:`WorkerRecord` is the coordinator's view of one registration (``POST /v1/workers``): its
pool, backend, the session key's digest, when it was last heard from, which versions it holds or was
given, how fast its groups come back. (The process that *is* a worker is :class:`echo_runtime.worker.loop.Worker`.)

Promises (:class:`Roster`):

* a pool admits at most its ``maxWorkers`` registrations, quarantined workers included, and a
  worker holds at most its pool's ``capacity`` leases (the capacity it asked for, capped);
* a worker id is never reused while the worker, or its quarantine record, is known;
* a worker silent for the lease timeout is :meth:`~Roster.silent`, to be forgotten;
* a claimed version is accepted only if it was published; every version a worker reported or was
  told to load is in its ``known_versions`` (what its rollouts may claim, :mod:`.trust`), down to its
  ``known_floor``: versions no step can consume any more are forgotten (:meth:`Roster.forget_below`),
  so the record stays bounded over a run of any length;
* ``stuck``: told to load a version and still behind it a lease timeout later.

Pure and in-memory: ``now`` is passed in. Refusals raise :class:`.errors.Rejected` before any change.
"""

from __future__ import annotations

import dataclasses
import secrets

from echo_runtime.coordinator import counters, errors, quarantine, wire, withholding
from echo_runtime.coordinator.config import CoordinatorConfig


@dataclasses.dataclass
class WorkerRecord:
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
    rate: counters.RateWindow
    loaded_version: int | None = None
    told_version: int | None = None
    told_at: float | None = None
    """When the worker was first told to load ``told_version`` (for ``stuck``)."""
    known_versions: set[int] = dataclasses.field(default_factory=set)
    """Every version the coordinator told the worker to load or the worker reported holding (only
    published ones are accepted): the versions its rollouts may claim, from ``known_floor`` up."""
    known_floor: int = 0
    """Versions below it were forgotten: no step can consume them any more (:meth:`Roster.forget_below`),
    so a claim of one is let through the version check to be dropped as stale, never trained on."""
    quarantine: quarantine.Quarantine | None = None
    overdue: int = 0
    """Expiry sweeps that found its leases past the task timeout while it stayed alive, since its last
    submission."""
    group_seconds: float | None = None
    """How long its groups take, lease to submission (a moving average; pacing in time)."""
    consumed_groups: int = 0
    """Its groups handed to the trainer in batches and not withdrawn: what steps trained on."""
    tally: withholding.Tally = dataclasses.field(default_factory=withholding.Tally)
    """Groups it submitted, their rewards, and its leases that lapsed (:mod:`.withholding`)."""
    withholding: str | None = None
    """Why it looks like it withholds groups, when its last test said so."""


class Roster:
    """The registered workers by id; see the module docstring."""

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.workers: dict[str, WorkerRecord] = {}

    def register(
        self, req: wire.RegisterRequest, session_hash: bytes, now: float, caught: quarantine.Quarantines
    ) -> WorkerRecord:
        """Admit a new worker to its pool (422 for an unknown pool, or a backend or dtype other than the
        pool's; 429 for a full one)."""
        if req.pool not in self.config.pools:
            raise errors.Rejected(
                422,
                "invalid",
                "pool",
                f"unknown pool {req.pool!r}; this job's pools: {', '.join(self.config.pools)}",
            )
        engine = self.config.pool_engine.get(req.pool)
        if engine is not None:
            for field, registered, wanted in (
                ("backend", req.backend, engine[0]),
                ("dtype", req.dtype, engine[1]),
            ):
                if registered != wanted:
                    raise errors.Rejected(
                        422,
                        "invalid",
                        field,
                        f"pool {req.pool!r} runs {wanted!r} workers ({field} of the pool, or the model's dtype), "
                        f"this worker registered {registered!r}: join a pool of its {field}, or start it with "
                        f"--{field} {wanted}",
                    )
        limit = self.config.pool_max_workers.get(req.pool)
        if limit is not None:
            members = sum(1 for w in self.workers.values() if w.pool == req.pool and w.quarantine is None)
            quarantined = caught.in_pool(req.pool)
            if members + quarantined >= limit:
                raise errors.Rejected(
                    429,
                    "limit",
                    "pool",
                    f"pool {req.pool!r} is full: maxWorkers is {limit} ({members} registered, {quarantined} "
                    "quarantined); try again when a worker leaves",
                )
        worker_id = f"w-{secrets.token_hex(4)}"
        while worker_id in self.workers or worker_id in caught:
            worker_id = f"w-{secrets.token_hex(4)}"
        worker = WorkerRecord(
            id=worker_id,
            pool=req.pool,
            backend=req.backend,
            device=req.device,
            dtype=req.dtype,
            external=req.external,
            capacity=min(req.capacity, self.config.pool_capacity.get(req.pool, req.capacity)),
            host=req.host,
            session_hash=session_hash,
            last_seen=now,
            rate=counters.RateWindow(self.config.rate_window, now),
        )
        self.workers[worker_id] = worker
        return worker

    def get(self, worker_id: str) -> WorkerRecord:
        """The registered worker ``worker_id``, or a 404 telling it to register again."""
        worker = self.workers.get(worker_id)
        if worker is None:
            raise errors.Rejected(
                404,
                "unknown_worker",
                "workerId",
                f"worker {worker_id!r} is not registered (its lease timed out or the coordinator restarted); "
                "register again",
            )
        return worker

    def active(self, worker_id: str) -> WorkerRecord:
        """:meth:`get`, refusing (403) a quarantined one."""
        worker = self.get(worker_id)
        if worker.quarantine is not None:
            raise errors.Rejected(
                403,
                "quarantined",
                "workerId",
                f"worker {worker_id} is quarantined: {worker.quarantine.reason}",
            )
        return worker

    def forget_below(self, floor: int) -> None:
        """Forget, for every worker, the known versions below ``floor``: the caller passes a version below
        which nothing can be admitted again (the trainer's version never goes back past the newest
        published one, :mod:`.handout`), so what a worker may claim stays bounded by Δmax, not by the
        length of the run."""
        for worker in self.workers.values():
            if floor > worker.known_floor:
                worker.known_floor = floor
                worker.known_versions = {v for v in worker.known_versions if v >= floor}

    def in_pool(self, pool: str) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.pool == pool]

    def silent(self, now: float) -> list[str]:
        """The workers not heard from for longer than the lease timeout (dead, to be forgotten)."""
        return [w.id for w in self.workers.values() if now - w.last_seen > self.config.lease_timeout]

    @staticmethod
    def report(worker: WorkerRecord, loaded_version: int | None, published: int) -> None:
        """Record the version a worker says it holds (422 if it was never published)."""
        if loaded_version is None:
            return
        if loaded_version > published:
            raise errors.Rejected(
                422,
                "invalid",
                "loadedVersion",
                f"version {loaded_version} was never published: the newest is {published}",
            )
        worker.loaded_version = loaded_version
        worker.known_versions.add(loaded_version)

    @staticmethod
    def instruct(worker: WorkerRecord, need: int, min_version: int, published: int, now: float) -> int | None:
        """The ``loadVersion`` for a reply to ``worker``: ``published`` once the worker's version is below
        ``need`` (what its next task needs, at most ``published``), else None.

        ``stuck`` is judged against ``min_version`` (``t_train − bound``) alone: a worker is on the clock
        only while its version could no longer be consumed at all, never for lagging pacing's floor while
        it finishes a long generation."""
        loaded = worker.loaded_version
        load: int | None = None
        if loaded is None or (loaded < need and loaded < published):
            load = published
            worker.known_versions.add(load)
        if loaded is None or (loaded < min_version and loaded < published):
            if worker.told_version != published:
                worker.told_version, worker.told_at = published, now
        else:
            worker.told_version = worker.told_at = None
        return load

    def stuck(self, worker: WorkerRecord, now: float) -> bool:
        """Told to load a version, still below it after a lease timeout."""
        if worker.told_version is None or worker.told_at is None:
            return False
        behind = worker.loaded_version is None or worker.loaded_version < worker.told_version
        return behind and now - worker.told_at > self.config.lease_timeout
