"""What the trainer is handed: the groups in the ledger, how one goes on the wire, and the batch memory.

A task's payload (:class:`TaskPayload`) and its completed group (an :class:`echo_runtime.rollout.Group`
of the rollouts the coordinator accepted and scored, :func:`.convert.accepted`) are what the
coordinator's :class:`~.buffer.TaskLedger` carries; :func:`group_out` turns a buffered entry into the
``GroupOut`` of a batch reply, admitted at the step that consumes it.

:class:`Handout` remembers the batches handed out, so that:

* there is one batch per version: asking again at the version of the last batch returns that batch
  (a retry after a lost reply), so a step consumes it exactly once;
* a trainer resumed at the version of one of the :data:`REWIND_BACK` batches before the last, none of
  the versions after it published (a prefetching trainer died after asking at ``t + 1``, or at
  ``t + 2`` with the upload of ``t + 1`` still in flight, and resumes from the newest published
  version ``t``), gets its own batch again and the later ones are withdrawn (:meth:`Handout.rewind`);
* a quarantined worker's groups are withdrawn from the batch the trainer is about to train on, and
  only from that one: an older batch was trained on already (:meth:`Handout.withdraw_worker`).

A :class:`Withdrawal` names groups no step will train on; the caller un-counts them and re-queues their
prompts. Pure and in-memory; the staleness rule is :func:`echo_runtime.staleness.admit`.
"""

from __future__ import annotations

import dataclasses

from echo_runtime import rollout, staleness
from echo_runtime.coordinator import buffer, convert, wire
from echo_runtime.tasks import base as tasks_base


@dataclasses.dataclass(frozen=True)
class TaskPayload:
    """What a task carries: its problem (the verifier needs the answer)."""

    problem: tasks_base.Problem


Ledger = buffer.TaskLedger[TaskPayload, rollout.Group]
Entry = buffer.Entry[TaskPayload, rollout.Group]


def group_out(entry: Entry, t: int, policy: staleness.StalenessPolicy) -> wire.GroupOut:
    """The buffered group of ``entry`` as consumed by the step ``t → t+1`` (it must be admissible)."""
    assert entry.group is not None and entry.version is not None
    verdict = staleness.admit(entry.version, t, policy)
    assert verdict.consume, verdict.reason  # the caller dropped everything else
    return convert.group_out(
        entry.group,
        entry.payload.problem,
        t,
        policy_version=entry.version,
        importance_weighted=verdict.importance_weighted,
    )


@dataclasses.dataclass(frozen=True)
class Withdrawal:
    """Groups handed out in the batch of ``version`` that no step will train on."""

    version: int
    entries: list[Entry]


REWIND_BACK = 2
"""Batches before the last one kept for a rewind: the trainer prefetches one batch ahead and uploads one
version in the background, so it can be two batches ahead of the newest published version."""


class Handout:
    """The last batches handed to the trainer; see the module docstring."""

    def __init__(self) -> None:
        self.last_batch: wire.BatchReply | None = None
        """The last batch handed out, returned again if the trainer retries the same version."""
        self._taken: list[Entry] = []
        # The batches before last_batch, oldest first: a prefetching trainer that dies before publishing
        # what it trained on them is resumed at one of their versions and gets that batch again (rewind).
        self._earlier: list[tuple[wire.BatchReply, list[Entry]]] = []

    @property
    def last_version(self) -> int | None:
        return None if self.last_batch is None else self.last_batch.version

    def next_step(self, t_train: int) -> int:
        """The step whose batch is not taken yet: ``t_train``, or ``t_train + 1`` once its batch went out."""
        return t_train + 1 if self.last_version == t_train else t_train

    def again(self, version: int) -> wire.BatchReply | None:
        """The batch already handed out at ``version``, if it is the last one (a retry)."""
        return self.last_batch if self.last_version == version else None

    def may_rewind(self, version: int, t_train: int, published: int) -> bool:
        """Whether a request at ``version`` is a resumed trainer's whose later batches never became a
        published version: ``version`` is one of the kept batches before the last, below ``t_train``, and
        not before ``published``."""
        return (
            any(batch.version == version for batch, _ in self._earlier)
            and version < t_train
            and published <= version
        )

    def rewind(self, version: int) -> tuple[wire.BatchReply, list[Withdrawal]]:
        """Hand the batch of ``version`` out again (the caller checked :meth:`may_rewind`); every batch
        handed after it, never trained into a published version, is withdrawn. ``t_train`` goes back to
        ``version``."""
        at = next(i for i, (batch, _) in enumerate(self._earlier) if batch.version == version)
        batch, taken = self._earlier[at]
        later = self._earlier[at + 1 :] + (
            [] if self.last_batch is None else [(self.last_batch, self._taken)]
        )
        withdrawn = [Withdrawal(b.version, t) for b, t in later if t]
        self.last_batch, self._taken, self._earlier = batch, taken, self._earlier[:at]
        return batch, withdrawn

    def hand(self, version: int, entries: list[Entry], groups: list[wire.GroupOut]) -> wire.BatchReply:
        """Record the batch of ``version``: ``entries`` taken from the ledger, as ``groups`` on the wire."""
        if self.last_batch is not None:
            self._earlier = [*self._earlier, (self.last_batch, self._taken)][-REWIND_BACK:]
        self._taken = entries
        self.last_batch = wire.BatchReply(ready=True, version=version, groups=groups)
        return self.last_batch

    def withdraw_worker(self, worker_id: str, version: int, t_train: int) -> Withdrawal | None:
        """Withdraw ``worker_id``'s groups from the last batch if it is the one the trainer is about to
        train on (of ``version``, which is ``t_train``); a retry at that version then gets a new batch."""
        if self.last_batch is None or not self.last_batch.version == version == t_train:
            return None
        handed = [e for e in self._taken if e.group is not None and e.group.worker == worker_id]
        if not handed:
            return None
        self.last_batch, self._taken = None, []
        return Withdrawal(version, handed)
