"""How one optimizer step spreads its batch over ranks: slots, sharding, micro-batches.

The batch itself — :class:`~echo_runtime.rollout.Batch` of :class:`~echo_runtime.rollout.Group` s of
:class:`~echo_runtime.rollout.Rollout` s — is Echo's one rollout type (:mod:`echo_runtime.rollout`); the
trainer receives it from the coordinator through :func:`echo_runtime.coordinator.convert.batch_in`.

Promises:

* Nothing here touches torch: slots are cheap to build in tests and to broadcast between ranks.
* :func:`shard` splits the rollouts of a batch over data-parallel ranks deterministically and so that
  every rank gets the same number of slots (ranks with fewer rollouts get zero-weight fillers), which
  keeps DDP's collective calls in step.
* :func:`by_tokens` forms micro-batches by a token budget instead (``algorithm.microBatchTokens``):
  rollouts sorted by length, longest first, each micro-batch as many as fit the budget once padded,
  spread over the ranks so that each has the same number of micro-batches (FSDP and DDP run one
  collective per micro-batch) and about the same tokens. A rollout is never split; one longer than
  the budget is a micro-batch alone. Which rollouts share a micro-batch does not change the loss
  (token weights come from the whole batch), only the padding and the peak memory.
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


def padded_tokens(rollouts: Sequence[Rollout]) -> int:
    """The cells of one micro-batch as :func:`echo_runtime.trainer.policy.pack` lays it out: rows times
    the longest prompt plus the longest completion."""
    if not rollouts:
        return 0
    start = max(len(r.prompt_ids) for r in rollouts)
    width = max(len(r.completion_ids) for r in rollouts)
    return len(rollouts) * (start + width)


def real_tokens(rollouts: Sequence[Rollout]) -> int:
    """Prompt and completion ids of ``rollouts``: the cells of their micro-batch that are not padding."""
    return sum(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)


def by_tokens(slots: Sequence[Slot], budget: int, rank: int, world_size: int) -> list[list[Slot]]:
    """Rank ``rank``'s micro-batches of ``slots`` under a budget of ``budget`` padded tokens each.

    Deterministic (every rank computes the whole layout and takes its part): slots sorted by
    prompt + completion length, longest first (ties in batch order); each micro-batch filled while its
    :func:`padded_tokens` stay within ``budget``; the micro-batches dealt out longest-first to the rank
    with the fewest tokens so far; ranks left with fewer micro-batches than the others get
    zero-weight micro-batches of one filler slot (a copy of the shortest rollout) to keep in step.
    """
    if budget < 1:
        raise ValueError(f"microBatchTokens must be ≥ 1, got {budget}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    if not slots:
        raise ValueError("cannot split an empty batch")
    order = sorted(
        range(len(slots)),
        key=lambda i: (-(len(slots[i].rollout.prompt_ids) + len(slots[i].rollout.completion_ids)), i),
    )
    chunks: list[list[Slot]] = []
    for i in order:
        slot = slots[i]
        if chunks and padded_tokens([s.rollout for s in [*chunks[-1], slot]]) <= budget:
            chunks[-1].append(slot)
        else:
            chunks.append([slot])
    loads = [0] * world_size
    per_rank: list[list[list[Slot]]] = [[] for _ in range(world_size)]
    for chunk in chunks:  # longest first: the greedy assignment balances the tokens well
        target = min(range(world_size), key=lambda r: (loads[r], len(per_rank[r]), r))
        per_rank[target].append(chunk)
        loads[target] += padded_tokens([s.rollout for s in chunk])
    most = max(len(mine) for mine in per_rank)
    filler = dataclasses.replace(slots[order[-1]], filler=True)
    mine = per_rank[rank]
    return mine + [[filler] for _ in range(most - len(mine))]
