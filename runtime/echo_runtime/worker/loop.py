"""The worker loop: keep the backend at a permitted policy version, lease, sample, submit.

Promises:

* Every rollout carries the policy version the backend *actually* held while sampling it, and the
  worker never samples a task with a loaded version below the task's ``minVersion``. The coordinator
  accepts only versions a worker reported holding, so the worker reports each version it loads (a
  heartbeat) before it submits rollouts of it, and reports its version with every lease request.
* A version is loaded only through the snapshot store's verified fetch (checksums checked), and is
  pinned in the store while in use so retention never deletes it from under a reader.
* On SIGTERM (:meth:`Worker.stop`) the worker finishes the group in hand, submits it, leaves the swarm
  (its other leases return to the queue at once) and exits 0. Once stopping, calls to the coordinator
  give up after ``STOP_RETRY_S`` instead of the usual deadline, so a worker whose coordinator is gone
  still exits promptly (its leases then return when they expire).
* A coordinator restart costs at most the groups in flight: the client re-registers and retries.

Timing (load vs. sample vs. wall-clock) is written as JSON lines to ``metrics_path`` if given, so the
overhead of loading versions can be measured.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from echo_runtime.backends import base as backend_base
from echo_runtime.backends import seeded
from echo_runtime.coordinator import client as coord
from echo_runtime.coordinator import convert, wire
from echo_runtime.snapshots import SnapshotStore
from echo_runtime.snapshots import errors as snapshot_errors

log = logging.getLogger("echorl.worker")

PIN_TTL_S = 600.0
STOP_RETRY_S = 10.0
"""Once stopping, how long any coordinator call may keep retrying."""
LEASE_WAIT_S = 2.0
"""Lease long-poll: the coordinator answers as soon as work appears (a Sequential round opening), so
an idle worker neither polls hard nor adds up to a poll interval to every Sequential step."""


class Worker:
    """One worker process's state: a backend, a coordinator client, a snapshot store."""

    def __init__(
        self,
        backend: backend_base.Backend,
        client: coord.WorkerClient,
        store: SnapshotStore,
        cache_dir: Path,
        *,
        capacity: int = 1,
        metrics_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.client = client
        self.store = store
        self.cache_dir = cache_dir
        self.capacity = capacity
        self._clock = clock
        self._stop = threading.Event()
        self._wanted = 0
        """The newest version the coordinator told us to load (monotone)."""
        self._announced = 0
        """The newest ``t_train`` the coordinator reported: the newest version it knows is published."""
        self._lock = threading.Lock()
        self._metrics: IO[str] | None = metrics_path.open("a") if metrics_path else None
        self.started = clock()
        self.load_seconds = 0.0
        self.sample_seconds = 0.0
        self.lease_seconds = 0.0
        """Time inside lease requests, long-poll waits included (idle time, not overhead)."""
        self.rollouts = 0
        self.groups = 0
        self.loads = 0

    # ---------------------------------------------------------------------------------- versions
    @property
    def loaded_version(self) -> int:
        """The policy version the backend holds; the base model is version 0."""
        return self.backend.loaded_version or 0

    def _instructions(self, reply: wire.Instructions) -> None:
        with self._lock:
            self._announced = max(self._announced, reply.policy_version)
            if reply.load_version is not None:
                self._wanted = max(self._wanted, reply.load_version)

    def ensure_version(self, at_least: int) -> None:
        """Load the newest published version if the loaded one is older than ``at_least``."""
        with self._lock:
            wanted = max(self._wanted, at_least)
            # Load the newest version the coordinator has *announced*, never one merely published:
            # a rollout tagged with a version the coordinator has not heard of would be rejected.
            target = max(wanted, self._announced)
        if self.loaded_version >= wanted:
            return
        published = self.store.latest_version()
        if published is None or published < wanted:
            # The coordinator only asks for announced (hence published) versions; a store that lags
            # (eventual listing) is retried by the caller's next lease.
            raise VersionNotYetVisible(wanted, published)
        latest = min(target, published)
        started = self._clock()
        # Pin before fetching, so retention cannot collect the version mid-download. A pin is a
        # courtesy to retention (a read-only credential may refuse it), never a reason to stop.
        with contextlib.suppress(Exception):
            self.store.pin(latest, self._reader_id(), PIN_TTL_S)
        try:
            path = self.store.fetch(latest, self.cache_dir, keep_cached=3)
        except snapshot_errors.VersionNotFoundError as exc:
            # Retention collected it (a worker told long ago, or one that could not pin): a newer version
            # is announced by now; the caller retries with the coordinator's next instructions.
            raise VersionCollected(latest) from exc
        kind = json.loads((path / "manifest.json").read_text())["kind"]  # the verified copy: no request
        previous = self.loaded_version
        self.backend.apply_snapshot(latest, path, kind)
        seconds = self._clock() - started
        self.load_seconds += seconds
        self.loads += 1
        log.info("loaded policy version %d (%s) in %.2fs", latest, kind, seconds)
        self._emit({"event": "load", "version": latest, "seconds": seconds})
        self._report_loaded()
        if previous:
            with contextlib.suppress(Exception):
                self.store.unpin(previous, self._reader_id())

    def _report_loaded(self) -> None:
        """Tell the coordinator which version the backend holds now (its rollouts may claim only that)."""
        try:
            self._instructions(self.client.heartbeat(self.loaded_version))
        except coord.Unauthorized:
            raise
        except coord.CoordinatorError as exc:  # the next lease request reports it too
            log.warning("could not report policy version %d: %s", self.loaded_version, exc)

    def _reader_id(self) -> str:
        return f"worker-{self.client.worker_id or 'unregistered'}"

    # ---------------------------------------------------------------------------------- main loop
    def stop(self) -> None:
        """Ask the loop to finish the group in hand and exit (safe from a signal handler)."""
        self._stop.set()
        self.client.give_up_after(STOP_RETRY_S)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, max_groups: int | None = None) -> None:
        """Serve until :meth:`stop` (or ``max_groups`` groups submitted)."""
        reply = self.client.register()
        self._instructions(reply)
        beats = threading.Thread(
            target=self._heartbeats,
            name="heartbeats",
            daemon=True,
        )
        beats.start()
        try:
            while not self._stop.is_set() and (max_groups is None or self.groups < max_groups):
                self._one_round()
        finally:
            self.stop()
            # The heartbeat thread first, so that a beat racing the leave cannot register us again.
            beats.join(timeout=2 * STOP_RETRY_S)
            with contextlib.suppress(coord.CoordinatorError):
                self.client.leave()
            self._emit({"event": "exit"})
            if self._metrics:
                self._metrics.close()

    def _heartbeats(self) -> None:
        try:
            self.client.run_heartbeats(self._stop, lambda: self.loaded_version, self._instructions)
        except coord.Unauthorized as exc:
            log.error("the coordinator rejected this worker's token: %s", exc)
            self._stop.set()

    def _one_round(self) -> None:
        try:
            self.ensure_version(0)
        except VersionNotYetVisible as exc:
            log.info("%s; retrying", exc)
            self._stop.wait(0.5)
            return
        asked = self._clock()
        lease = self.client.lease(self.capacity, wait=LEASE_WAIT_S, loaded_version=self.loaded_version)
        self.lease_seconds += self._clock() - asked
        self._instructions(lease)
        if not lease.tasks:
            if self._clock() - asked < LEASE_WAIT_S / 2:  # answered early and empty: back off as told
                self._stop.wait(min(5.0, lease.retry_after_seconds or 0.2))
            return
        need = max(t.min_version for t in lease.tasks)
        if self._load_holding_lease(need):
            self._sample_and_submit(lease.tasks)

    def _load_holding_lease(self, need: int) -> bool:
        """Load ``need`` while keeping the leased tasks; False if the worker is stopping first.

        The tasks stay ours: the coordinator counts them against this worker's capacity and would not
        lease them (or others) to it again before they time out, so dropping them here would idle the
        worker. A store whose listing lags the announcement (eventual consistency) catches up; on stop,
        :meth:`run` leaves the swarm and the tasks go back to the queue at once.
        """
        started, logged = self._clock(), -math.inf
        while not self._stop.is_set():
            try:
                self.ensure_version(need)
                return True
            except VersionNotYetVisible as exc:
                waited = self._clock() - started
                if waited - logged >= 10.0:
                    log.info("%s; holding the lease and retrying (%.0fs so far)", exc, waited)
                    logged = waited
                self._stop.wait(0.5)
        return False

    def _sample_and_submit(self, tasks: list[wire.TaskOut]) -> None:
        # Tasks of one lease share sampling settings and group size (one job); batch them together.
        first = tasks[0]
        keys = [t.sampling.key for t in tasks]
        # Seeded draws when every task has a key and the backend draws with keys (backends/seeded.py).
        keyed = self.backend.name in seeded.BACKENDS and all(k is not None for k in keys)
        params = backend_base.SamplingParams(
            temperature=first.sampling.temperature,
            top_p=first.sampling.top_p,
            max_new_tokens=first.sampling.max_new_tokens,
            keys=tuple(seeded.parse_key(k) for k in keys if k is not None) if keyed else None,
        )
        version = self.loaded_version
        started = self._clock()
        groups = self.backend.sample([wire.plain_prompt(t.prompt) for t in tasks], first.group_size, params)
        seconds = self._clock() - started
        self.sample_seconds += seconds
        for task, samples in zip(tasks, groups, strict=True):
            rollouts = [convert.submission(s, version) for s in samples]
            try:
                reply = self._submit(task.task_id, rollouts, version)
            except coord.LeaseLost as exc:
                log.warning("task %s: lease lost (%s); the group is discarded", task.task_id, exc.message)
                continue
            self.groups += 1
            self.rollouts += len(rollouts)
            log.debug("task %s: %s, rewards %s", task.task_id, reply.outcome, reply.rewards)
        self._emit({"event": "sample", "groups": len(tasks), "seconds": seconds, "version": version})

    def _submit(self, task_id: str, rollouts: list[wire.RolloutIn], version: int) -> wire.SubmitReply:
        """Submit a group; if the coordinator has no record of ``version`` (a report lost, or it
        restarted and we registered again), report it and try once more."""
        try:
            return self.client.submit(task_id, rollouts)
        except coord.Invalid as exc:
            if not exc.field.endswith(".policyVersion") or self.loaded_version != version:
                raise
            self._report_loaded()
            return self.client.submit(task_id, rollouts)

    def _emit(self, record: dict[str, Any]) -> None:
        if self._metrics is None:
            return
        record = {
            **record,
            "time": self._clock() - self.started,
            "loadSeconds": self.load_seconds,
            "sampleSeconds": self.sample_seconds,
            "leaseSeconds": self.lease_seconds,
            "rollouts": self.rollouts,
            "backend": self.backend.name,
        }
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()


class VersionNotYetVisible(RuntimeError):
    """The coordinator asked for a version the store does not list yet."""

    def __init__(self, wanted: int, latest: int | None) -> None:
        super().__init__(f"policy version {wanted} is not in the snapshot store yet (latest: {latest})")


class VersionCollected(VersionNotYetVisible):
    """The version the worker set out to load was collected by retention before it fetched it."""

    def __init__(self, version: int) -> None:
        RuntimeError.__init__(
            self,
            f"policy version {version} was collected by the store's retention before this worker fetched it "
            "(a newer one is announced by now)",
        )
