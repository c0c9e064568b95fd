"""How one optimizer step spreads its batch over ranks: slots, sharding, micro-batches.

The batch itself — :class:`~echo_runtime.rollout.Batch` of :class:`~echo_runtime.rollout.Group` s of
:class:`~echo_runtime.rollout.Rollout` s — is Echo's one rollout type (:mod:`echo_runtime.rollout`); the
trainer receives it from the coordinator through :func:`echo_runtime.coordinator.convert.batch_in`.

Promises:

* Nothing here touches torch: slots are cheap to build in tests and to broadcast between ranks.
* :func:`shard` splits the rollouts of a batch over data-parallel ranks deterministically and so that
  every rank gets the same number of slots (ranks with fewer rollouts get zero-weight fillers), which
  keeps DDP's collective calls in step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from echo_runtime.rollout import Rollout


@dataclasses.dataclass(frozen=True)
class Slot:
    """One rollout a rank processes, with its advantage and how its loss is formed."""

    rollout: Rollout
    advantage: float
    decoupled: bool = False
    """Importance-weighted (the staleness rule said so): the decoupled surrogate of
    :mod:`echo_runtime.trainer.loss` applies."""
    filler: bool = False
    """A zero-weight copy that keeps ranks in step (see :func:`shard`); it contributes nothing."""
    masked: bool = False
    """Left out of the loss (a completion the length budget cut, with ``overlong.maskTruncated``): its
    reward counted in its group's advantages, its tokens count nowhere."""
    reward: float = 0.0
    """The reward its advantage was computed from: the task's, plus any overlong penalty."""
    token_advantages: tuple[float, ...] | None = None
    """One advantage per model token (REINFORCE++ with the KL in the reward), overriding ``advantage``."""


def shard(slots: Sequence[Slot], rank: int, world_size: int) -> list[Slot]:
    """The slots rank ``rank`` of ``world_size`` processes: every ``world_size``-th, from ``rank``.

    Every rank gets ``ceil(len(slots) / world_size)`` slots; a rank that runs out is padded with
    zero-weight copies of the batch's first slot, so all ranks run the same number of forward/backward
    passes (DDP's gradient all-reduce needs every rank to join it).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    if not slots:
        raise ValueError("cannot shard an empty batch")
    mine = list(slots[rank::world_size])
    per_rank = -(-len(slots) // world_size)
    filler = dataclasses.replace(slots[0], filler=True)
    return mine + [filler] * (per_rank - len(mine))


def micro_batches(slots: Sequence[Slot], size: int) -> list[list[Slot]]:
    """Consecutive chunks of at most ``size`` slots."""
    if size < 1:
        raise ValueError(f"micro-batch size must be ≥ 1, got {size}")
    return [list(slots[i : i + size]) for i in range(0, len(slots), size)]
