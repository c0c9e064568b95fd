"""What the reconciler's parts share: the API, the settings, the Event recorder and each job's memory.

:class:`Context` is handed to every part (:mod:`echo_operator.references`,
:mod:`echo_operator.credentials`, :mod:`echo_operator.tokens`, :mod:`echo_operator.apply`,
:mod:`echo_operator.status_pass`). :class:`JobMemory` is what the operator remembers about one job
between passes: it is lost on restart and rebuilt by the next passes (what must survive a restart is
read back from the job's ``status`` and annotations). :class:`Faults` is how a part reports a
fault a user can fix: the pass ends, and the faults go into ``status``.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from echo_operator import events, lifecycle, pool_lag, storage
from echo_operator import status as status_mod
from echo_operator.children import inputs
from echo_operator.config import Settings
from echo_operator.kube import Kube
from echo_runtime import spec
from echo_runtime.coordinator import wire

Object = dict[str, Any]
GV = spec.GROUP_VERSION


@dataclasses.dataclass
class JobMemory:
    """What the operator remembers about one job between passes (lost on restart, rebuilt by them)."""

    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    job: inputs.JobInput | None = None
    faults: tuple[status_mod.Fault, ...] = ()
    applied_generation: int | None = None
    """The newest generation whose children were applied (None: none yet in this operator run)."""
    status_token: str | None = None
    """The read-only token the status pass reads the coordinator with."""
    storage_ready: str | None = None
    """Fingerprint of the storage settings whose bucket and marker were last ensured."""
    readonly_unsupported: str | None = None
    """Why the store could not issue read-only credentials (asked once per operator run)."""
    doc: wire.StatusDocument | None = None
    doc_error: str | None = None
    doc_error_since: float | None = None
    """When (monotonic) the coordinator's status started failing to read, on consecutive tries."""
    behind_since: dict[str, float] = dataclasses.field(default_factory=dict)
    behind: dict[str, pool_lag.PoolLag] = dataclasses.field(default_factory=dict)
    """Pools that cannot keep up, as of the last status pass."""
    restarted: dict[str, float] = dataclasses.field(default_factory=dict)
    outcome: lifecycle.Outcome | None = None
    """How the job ended, once it did (also read back from ``status`` after an operator restart)."""
    final_version: int | None = None
    restarts: int | None = None
    """``status.restarts`` as last written (None: read it from the job's status)."""
    last_counted: str | None = None
    """``status.lastCountedTrainer`` as last written (None: read it from the job's status)."""
    pods_ready: bool = False
    """Every pod the job runs was ready at the last status pass (its Workload's ``PodsReady``)."""
    status_written_at: float | None = None
    """When (monotonic) this operator last wrote the job's status."""
    settled: bool = False
    """The job is over and its last status pass found nothing to write: no more passes are due."""
    released: bool = False
    """``ttlSecondsAfterFinished`` passed and the job's children were deleted."""
    counted_jobs: set[str] = dataclasses.field(default_factory=set)
    """UIDs of failed trainer Jobs already acted on (their deletion takes a moment)."""
    store_credentials: storage.Credentials | None = None
    trainer_history: list[Object] | None = None
    """``status.trainerHistory`` as last written (None: read it from the job's status)."""
    trainer_pods: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """The running trainer Job's UID → its pods seen by the status passes, by rank
    (:class:`echo_operator.trainer_record.PodSeen`): a record still names a pod deleted before it."""
    captured: dict[str, int] = dataclasses.field(default_factory=dict)
    """The trainer Job whose logs were read as soon as a rank went down → the number they were kept
    under (:func:`echo_operator.trainer_record.remember`)."""


class Faults(Exception):
    """Faults a user can fix; they end the pass and are reported in ``status``."""

    def __init__(self, faults: Sequence[status_mod.Fault]) -> None:
        super().__init__("; ".join(p.message for p in faults))
        self.faults = tuple(faults)


@dataclasses.dataclass
class Context:
    """The operator's API access, settings, Event recorder and the memory of every job."""

    kube: Kube
    settings: Settings
    events: events.Recorder
    _memory: dict[tuple[str, str], JobMemory] = dataclasses.field(default_factory=dict)
    _memory_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def memory(self, namespace: str, name: str) -> JobMemory:
        with self._memory_lock:
            return self._memory.setdefault((namespace, name), JobMemory())

    def forget(self, namespace: str, name: str) -> None:
        with self._memory_lock:
            self._memory.pop((namespace, name), None)

    def phases(self) -> dict[str, int]:
        """How many of the jobs this operator follows are in each phase (its ``/metrics``)."""
        with self._memory_lock:
            jobs = list(self._memory.values())
        counts: dict[str, int] = {}
        for mem in jobs:
            counts[phase_of(mem)] = counts.get(phase_of(mem), 0) + 1
        return counts

    def fault(self, body: Mapping[str, Any], reason: str, message: str) -> Faults:
        """Post the problem as a Warning Event; return it to be raised."""
        self.events.post(body, "Warning", reason, message)
        return Faults([status_mod.Fault(reason, message)])


def phase_of(mem: JobMemory) -> str:
    """Pending (not reconciled into processes yet), Running, Suspended, Succeeded or Failed."""
    if mem.outcome is not None:
        return mem.outcome.type
    if mem.job is None:
        return "Pending"
    return "Suspended" if mem.job.suspended else "Running"


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``obj`` has an owner reference to the object with ``uid``."""
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def owner(body: Mapping[str, Any]) -> Object:
    """The controller owner reference to the EchoJob ``body``."""
    meta = body["metadata"]
    return {
        "apiVersion": GV,
        "kind": "EchoJob",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
