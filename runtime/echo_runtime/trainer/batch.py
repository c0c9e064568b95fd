"""What one optimizer step consumes: a batch of groups of rollouts, as plain frozen dataclasses.

A :class:`Rollout` is one sampled completion with its behaviour log-probs, reward, the policy version
that produced it and the backend that sampled it; a :class:`Group` is the ``n`` rollouts of one prompt
(GRPO's unit); a :class:`Batch` is the groups the trainer consumes at version ``t`` (the optimizer step
that turns ``t`` into ``t + 1``).

Promises:

* Construction validates: token ids are non-negative ints, there is one finite behaviour log-prob per
  completion token, prompts and completions are non-empty, a group has ≥ 2 rollouts (advantages are
  normalised within it), versions are ≥ 0. A malformed rollout from the wire fails here, with its
  place in the batch, instead of deep inside the loss.
* Nothing here touches torch: batches are cheap to build in tests and from the coordinator's JSON
  (:func:`batch_from_wire`), and to broadcast between ranks.
* :func:`shard` splits the rollouts of a batch over data-parallel ranks deterministically and so that
  every rank gets the same number of slots (ranks with fewer rollouts get zero-weight fillers), which
  keeps DDP's collective calls in step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One sampled completion of a prompt, as a worker reported it (reward re-scored by the coordinator)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """Behaviour log-prob of each completion token (``log softmax(logits / temperature)`` at sampling)."""
    reward: float
    policy_version: int
    """The snapshot version the backend had loaded when it sampled this completion."""
    backend: str = "unknown"
    """The backend's name (``transformers``, ``mlx``, ``vllm``); log-prob mismatch is reported per backend."""
    device: str = ""
    dtype: str = ""

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids: must not be empty")
        if not self.completion_ids:
            raise ValueError("completion_ids: must not be empty (a completion holds at least its EOS)")
        for name in ("prompt_ids", "completion_ids"):
            ids = getattr(self, name)
            bad = next((x for x in ids if isinstance(x, bool) or not isinstance(x, int) or x < 0), None)
            if bad is not None:
                raise ValueError(f"{name}: token ids must be non-negative integers, got {bad!r}")
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(
                f"logprobs: need one per completion token ({len(self.completion_ids)}), got {len(self.logprobs)}"
            )
        if not all(math.isfinite(x) for x in self.logprobs):
            raise ValueError("logprobs: must all be finite")
        if not math.isfinite(self.reward):
            raise ValueError(f"reward: must be finite, got {self.reward!r}")
        if isinstance(self.policy_version, bool) or self.policy_version < 0:
            raise ValueError(f"policy_version: must be an integer ≥ 0, got {self.policy_version!r}")

    def staleness(self, version: int) -> int:
        """Staleness when consumed by the step that turns ``version`` into ``version + 1``."""
        return version - self.policy_version


@dataclasses.dataclass(frozen=True)
class Group:
    """The rollouts of one prompt; advantages are normalised within it."""

    rollouts: tuple[Rollout, ...]
    id: str = ""
    """The coordinator's task id (for logs)."""
    worker: str = ""
    """The id of the worker that generated it (the trainer's log-prob check convicts workers)."""

    def __post_init__(self) -> None:
        if len(self.rollouts) < 2:
            raise ValueError(
                f"group {self.id!r}: needs ≥ 2 rollouts (GRPO normalises within a group), got {len(self.rollouts)}"
            )

    @property
    def policy_version(self) -> int:
        """The oldest version among the group's rollouts (what bounds the group's staleness)."""
        return min(r.policy_version for r in self.rollouts)

    def staleness(self, version: int) -> int:
        """The group's staleness at trainer version ``version``: that of its oldest rollout."""
        return version - self.policy_version


@dataclasses.dataclass(frozen=True)
class Batch:
    """The groups one optimizer step consumes at trainer version ``version``."""

    version: int
    groups: tuple[Group, ...]

    def __post_init__(self) -> None:
        if isinstance(self.version, bool) or self.version < 0:
            raise ValueError(f"version: must be an integer ≥ 0, got {self.version!r}")

    @property
    def rollouts(self) -> list[Rollout]:
        """All rollouts, group by group."""
        return [r for g in self.groups for r in g.rollouts]

    @property
    def num_tokens(self) -> int:
        """Completion tokens in the batch."""
        return sum(len(r.completion_ids) for r in self.rollouts)


def _field(data: Mapping[str, Any], *names: str, default: Any = dataclasses.MISSING) -> Any:
    for name in names:
        if name in data:
            return data[name]
    if default is dataclasses.MISSING:
        raise ValueError(f"missing field {names[0]!r}")
    return default


def rollout_from_wire(data: Mapping[str, Any], prompt_ids: Sequence[int]) -> Rollout:
    """A :class:`Rollout` from the coordinator's JSON (``RolloutOut``: camelCase, completion ``tokenIds``).

    The wire carries the prompt (text or chat messages) once per group; ``prompt_ids`` is its encoding
    (the one :func:`echo_runtime.backends.sampling.encode_prompt` every backend uses, with the job's prompt
    style: the chat template of a chat model).
    """
    return Rollout(
        prompt_ids=tuple(int(x) for x in prompt_ids),
        completion_ids=tuple(int(x) for x in _field(data, "tokenIds", "token_ids", "completion_ids")),
        logprobs=tuple(float(x) for x in _field(data, "logprobs")),
        reward=float(_field(data, "reward")),
        policy_version=int(_field(data, "policyVersion", "policy_version")),
        backend=str(_field(data, "backend", default="unknown")),
        device=str(_field(data, "device", default="")),
        dtype=str(_field(data, "dtype", default="")),
    )


def batch_from_wire(
    version: int, groups: Sequence[Mapping[str, Any]], encode: Callable[[Any], Sequence[int]]
) -> Batch:
    """A :class:`Batch` from the coordinator's JSON groups (``GroupOut``: ``taskId``, ``prompt``, ``rollouts``).

    ``encode`` turns a group's prompt — text, or chat messages as a list of ``{role, content}`` — into
    token ids, as the workers did. Errors name the place: ``groups[2].rollouts[5]: logprobs: must all be
    finite``.
    """
    built: list[Group] = []
    for gi, group in enumerate(groups):
        try:
            prompt = _field(group, "prompt")
            prompt_ids = list(encode(prompt if isinstance(prompt, list) else str(prompt)))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"groups[{gi}]: {exc}") from exc
        rollouts: list[Rollout] = []
        for ri, raw in enumerate(_field(group, "rollouts", default=())):
            try:
                rollouts.append(rollout_from_wire(raw, prompt_ids))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"groups[{gi}].rollouts[{ri}]: {exc}") from exc
        try:
            built.append(
                Group(
                    rollouts=tuple(rollouts),
                    id=str(_field(group, "taskId", "task_id", "id", default="")),
                    worker=str(_field(group, "workerId", "worker_id", "worker", default="")),
                )
            )
        except ValueError as exc:
            raise ValueError(f"groups[{gi}]: {exc}") from exc
    return Batch(version=version, groups=tuple(built))


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
