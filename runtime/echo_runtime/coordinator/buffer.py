"""The task ledger: every task's life from prompt to optimizer step, and the bounded replay buffer.

A *task* is one prompt × group size n. Each task the coordinator creates is, at every moment, in
exactly one of five places::

    pending ──lease──▶ leased ──complete──▶ buffered ──take──▶ consumed
       ▲                 │                      │
       └──expire/release─┘                      └──drop──▶ dropped (counted)

A dropped group's *prompt* is not lost: the caller puts it back at the front of the pending queue as a
new task (:meth:`TaskLedger.add` with ``front=True``), so every prompt drawn ends up consumed.

Invariants (checked by :meth:`TaskLedger.check` and by the property tests):

* conservation: ``created == pending + leased + buffered + consumed + dropped``: nothing is silently
  lost; a lease that expires puts its task back at the *front* of the pending queue, to be re-leased;
* a task is leased to at most one worker, and only that worker can complete it;
* a task leaves ``buffered`` once, so no group is delivered twice;
* :meth:`take` hands out the groups of the oldest policy version first (earliest deadline first: a
  group of version ``v`` can be consumed until step ``v + bound``), ties in lease order, so a fresh group
  never overtakes one that would otherwise go stale;
* ``outstanding = pending + leased + buffered`` is what the capacity bounds: :meth:`room` is how many
  *new* tasks may be created, so when the buffer is full no work is handed out that would be thrown
  away (backpressure).

Pure and in-memory: no clock of its own (``now`` is passed in), no I/O, no threads. The staleness rule is
not here: the caller decides what to drop (:mod:`.staleness`).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator
from typing import Generic, Literal, TypeVar

P = TypeVar("P")
"""What a task carries (the prompt/problem)."""
G = TypeVar("G")
"""What a completed group carries (the rollouts)."""

Place = Literal["pending", "leased", "buffered", "consumed", "dropped"]

RECENT_OUTCOMES = 65_536
"""How many finished tasks are remembered (to answer a repeated submission idempotently)."""


@dataclasses.dataclass
class Entry(Generic[P, G]):
    """One task and where it is."""

    id: str
    payload: P
    place: Place = "pending"
    worker: str | None = None
    """The worker holding the lease (leased) or that completed it (buffered and after)."""
    leased_at: float = 0.0
    deadline: float = 0.0
    """When the lease expires even if its worker is alive."""
    leases: int = 0
    """How many times the task was leased (1 + re-issues)."""
    lease_seq: int = 0
    """Order of the task's latest lease among all leases (ties in :meth:`TaskLedger.take`)."""
    group: G | None = None
    version: int | None = None
    """The group's policy version (the oldest of its rollouts) once buffered."""
    key: str | None = None
    """The seeded-draw key of its latest lease (:mod:`echo_runtime.backends.seeded`), fresh each lease."""


class TaskLedger(Generic[P, G]):
    """Pending queue, lease table and replay buffer of complete groups; see the module docstring."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        """Bound on outstanding tasks (pending + leased + buffered); the caller may change it."""
        self._pending: collections.deque[Entry[P, G]] = collections.deque()
        self._leased: dict[str, Entry[P, G]] = {}
        self._buffered: dict[str, Entry[P, G]] = {}  # insertion order = completion order
        self._by_worker: dict[str, set[str]] = collections.defaultdict(set)
        self._finished: collections.OrderedDict[str, tuple[Place, str | None]] = collections.OrderedDict()
        self._ids: set[str] = set()
        self.created = 0
        self.consumed = 0
        self.dropped = 0
        self.reissued = 0
        self._lease_seq = 0

    # ------------------------------------------------------------------ views
    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def leased(self) -> int:
        return len(self._leased)

    @property
    def buffered(self) -> int:
        return len(self._buffered)

    @property
    def outstanding(self) -> int:
        return len(self._pending) + len(self._leased) + len(self._buffered)

    def room(self) -> int:
        """How many new tasks may be created now without exceeding the capacity."""
        return max(0, self.capacity - self.outstanding)

    def lease_of(self, task_id: str) -> Entry[P, G] | None:
        """The live lease on ``task_id``, if any."""
        return self._leased.get(task_id)

    def leases_of(self, worker: str) -> int:
        return len(self._by_worker.get(worker, ()))

    def outcome(self, task_id: str) -> tuple[Place, str | None] | None:
        """Where a task is (or ended), and its worker; None for an unknown (or long-forgotten) id."""
        for table in (self._leased, self._buffered):
            entry = table.get(task_id)
            if entry is not None:
                return entry.place, entry.worker
        if task_id in self._finished:
            return self._finished[task_id]
        if task_id in self._ids:
            return "pending", None
        return None

    def buffered_entries(self) -> Iterator[Entry[P, G]]:
        """Buffered groups, oldest completion first."""
        return iter(list(self._buffered.values()))

    def outstanding_entries(self) -> Iterator[Entry[P, G]]:
        """Every task not yet consumed or dropped: pending (queue order), leased, buffered."""
        return iter([*self._pending, *self._leased.values(), *self._buffered.values()])

    # ------------------------------------------------------------------ transitions
    def add(self, task_id: str, payload: P, *, front: bool = False) -> Entry[P, G]:
        """Create a task at the back of the pending queue (at the front with ``front``: a prompt whose
        group was dropped goes out again before any new one)."""
        if task_id in self._ids or task_id in self._finished:
            raise ValueError(f"task id {task_id!r} already used")
        entry: Entry[P, G] = Entry(task_id, payload)
        if front:
            self._pending.appendleft(entry)
        else:
            self._pending.append(entry)
        self._ids.add(task_id)
        self.created += 1
        return entry

    def lease(self, worker: str, count: int, now: float, deadline: float) -> list[Entry[P, G]]:
        """Lease up to ``count`` pending tasks (oldest first) to ``worker`` until ``deadline``."""
        out: list[Entry[P, G]] = []
        while self._pending and len(out) < count:
            entry = self._pending.popleft()
            entry.place, entry.worker, entry.leased_at, entry.deadline = "leased", worker, now, deadline
            entry.leases += 1
            self._lease_seq += 1
            entry.lease_seq = self._lease_seq
            self._leased[entry.id] = entry
            self._by_worker[worker].add(entry.id)
            out.append(entry)
        return out

    def complete(self, task_id: str, worker: str, group: G, version: int) -> Entry[P, G]:
        """Move a leased task to the buffer with its group. The caller has checked the lease."""
        entry = self._leased.get(task_id)
        if entry is None or entry.worker != worker:
            raise KeyError(f"task {task_id!r} is not leased to worker {worker!r}")
        self._unlease(entry)
        entry.place, entry.group, entry.version = "buffered", group, version
        self._buffered[task_id] = entry
        return entry

    def discard(self, task_id: str, worker: str) -> Entry[P, G]:
        """Drop (and count) a leased task's group on arrival: it is already too stale to be consumed."""
        entry = self._leased.get(task_id)
        if entry is None or entry.worker != worker:
            raise KeyError(f"task {task_id!r} is not leased to worker {worker!r}")
        self._unlease(entry)
        self._finish(entry, "dropped")
        return entry

    def leased_before(self, when: float) -> int:
        """How many live leases were handed out before ``when`` (the table is in lease order, so this
        costs one step per such lease, not one per lease)."""
        count = 0
        for entry in self._leased.values():
            if entry.leased_at >= when:
                break
            count += 1
        return count

    def overdue(self, now: float) -> list[tuple[str, str]]:
        """``(task id, worker)`` of every lease past its deadline (what :meth:`expire` would return)."""
        return [(e.id, e.worker) for e in self._leased.values() if e.deadline <= now and e.worker is not None]

    def expire(self, now: float, dead_workers: set[str] | frozenset[str] = frozenset()) -> list[Entry[P, G]]:
        """Return to the pending queue every lease past its deadline or held by a dead worker."""
        expired = [e for e in self._leased.values() if e.deadline <= now or e.worker in dead_workers]
        for entry in reversed(expired):  # appendleft in reverse keeps their relative order
            self._requeue(entry)
        return expired

    def release_worker(self, worker: str) -> list[Entry[P, G]]:
        """Return every lease of ``worker`` to the pending queue (it left or was declared dead)."""
        entries = [self._leased[i] for i in sorted(self._by_worker.get(worker, ()))]
        entries.sort(key=lambda e: e.leased_at)
        for entry in reversed(entries):
            self._requeue(entry)
        self._by_worker.pop(worker, None)
        return entries

    def drop_buffered(self, should_drop: Callable[[Entry[P, G]], bool]) -> list[Entry[P, G]]:
        """Drop (and count) every buffered group for which ``should_drop`` is true."""
        doomed = [e for e in self._buffered.values() if should_drop(e)]
        for entry in doomed:
            del self._buffered[entry.id]
            self._finish(entry, "dropped")
        return doomed

    def take(self, count: int) -> list[Entry[P, G]]:
        """Consume ``count`` buffered groups (all or nothing): the oldest policy versions first, ties in
        lease order."""
        if count > len(self._buffered):
            raise ValueError(f"asked for {count} groups, {len(self._buffered)} buffered")
        order = sorted(self._buffered.values(), key=lambda e: (e.version or 0, e.lease_seq))
        taken = [self._buffered.pop(e.id) for e in order[:count]]
        for entry in taken:
            self._finish(entry, "consumed")
        return taken

    def check(self) -> None:
        """Assert the ledger's invariants (for tests; O(tasks))."""
        total = self.pending + self.leased + self.buffered + self.consumed + self.dropped
        assert total == self.created, f"conservation broken: {total} != {self.created}"
        seen: set[str] = set()
        for entry in [*self._pending, *self._leased.values(), *self._buffered.values()]:
            assert entry.id not in seen, f"task {entry.id} in two places"
            seen.add(entry.id)
        for worker, ids in self._by_worker.items():
            for task_id in ids:
                assert self._leased[task_id].worker == worker

    # ------------------------------------------------------------------ internals
    def _unlease(self, entry: Entry[P, G]) -> None:
        del self._leased[entry.id]
        assert entry.worker is not None
        held = self._by_worker.get(entry.worker)
        if held is not None:
            held.discard(entry.id)
            if not held:
                del self._by_worker[entry.worker]

    def _requeue(self, entry: Entry[P, G]) -> None:
        self._unlease(entry)
        entry.place, entry.worker = "pending", None
        self._pending.appendleft(entry)
        self.reissued += 1

    def _finish(self, entry: Entry[P, G], place: Literal["consumed", "dropped"]) -> None:
        entry.place = place
        if place == "consumed":
            self.consumed += 1
        else:
            self.dropped += 1
        self._ids.discard(entry.id)
        self._finished[entry.id] = (place, entry.worker)
        while len(self._finished) > RECENT_OUTCOMES:
            self._finished.popitem(last=False)
