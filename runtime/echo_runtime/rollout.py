"""A rollout — Echo's one data type for a sampled episode, from the backend to the loss.

A backend samples a :class:`Rollout` (prompt ids, completion ids, behaviour log-probs, text, finish
reason); the coordinator scores it (``reward``) and tags it with the backend that sampled it; the trainer
takes it in a :class:`Group` (the ``n`` rollouts of one prompt, GRPO's unit) inside a :class:`Batch` (what
one optimizer step consumes). The same frozen type all the way: no fields are copied by hand between
hops. :mod:`echo_runtime.coordinator.rollouts` is the one place that converts it to and from the wire
schema (:mod:`echo_runtime.coordinator.wire`).

The shape is the episode's: ``completion_ids`` are every id after the prompt, and ``kinds`` says, per
id, whether the model sampled it (:data:`MODEL`: it has a behaviour log-prob and is in the loss) or an
environment put it there (:data:`ENVIRONMENT`: no log-prob, loss mask 0). A single-turn completion is
the one-turn episode: ``kinds`` empty means every completion id is the model's, and then
``logprobs`` has one entry per completion id — exactly as before episodes existed.

Promises:

* Construction validates: token ids are non-negative ints, one finite behaviour log-prob per model id,
  a finite reward, versions ≥ 0, a non-empty group; a batch's groups have ≥ 2 rollouts each
  (advantages are normalised within a group). A
  malformed rollout fails where it is built, naming the field, instead of deep inside the loss.
* Nothing here touches torch or pydantic: rollouts are cheap to build in tests, from the wire, and to
  broadcast between ranks.
* Behaviour log-probs are ≤ 0 by definition; a backend's float rounding can report a tiny positive
  value, so :func:`sampled` (how every backend builds a rollout) clamps them once, here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Final, Literal

FinishReason = Literal["stop", "length"]

PROMPT: Final = 0
"""Token kind of the prompt's ids (never in ``kinds``, which covers the completion only)."""
MODEL: Final = 1
"""Token kind of an id the backend sampled: it has a behaviour log-prob and is in the loss."""
ENVIRONMENT: Final = 2
"""Token kind of an id an environment added between model turns: no log-prob, loss mask 0."""


_INT = frozenset({int})


def _check_ids(name: str, ids: tuple[int, ...]) -> None:
    # The coordinator builds a rollout for every one it accepts: the common case runs in C (``bool`` is
    # its own type, so True is refused), and only a bad tuple is walked to name its first bad id.
    if not ids or (_INT.issuperset(map(type, ids)) and min(ids) >= 0):
        return
    bad = next(x for x in ids if type(x) is not int or x < 0)
    raise ValueError(f"{name}: token ids must be non-negative integers, got {bad!r}")


def _all_finite(values: tuple[float, ...]) -> bool:
    # A sum of finite values is finite unless it overflows; only then is each value looked at.
    return math.isfinite(sum(values)) or all(math.isfinite(x) for x in values)


@dataclasses.dataclass(frozen=True)
class Rollout:
    """One sampled episode of a prompt: what a backend sampled, scored and tagged on its way."""

    prompt_ids: tuple[int, ...]
    """The prompt as the backend fed it to the model. Empty only at the coordinator, which keeps the
    prompt once per task and never tokenizes it; the trainer encodes it again, as the workers did."""
    completion_ids: tuple[int, ...]
    """Every id after the prompt, including a final end-of-sequence id if one was sampled."""
    logprobs: tuple[float, ...]
    """Behaviour log-prob of each model id (``log softmax(logits / temperature)`` at sampling), in order."""
    reward: float = 0.0
    """The coordinator's reward (re-scored with the task's verifier, never taken from a worker); 0.0 as
    a backend returns it, before anyone scored it."""
    policy_version: int = 0
    """The snapshot version the backend had loaded when it sampled this rollout."""
    backend: str = "unknown"
    """The backend's name (``transformers``, ``mlx``, ``vllm``); log-prob mismatch is reported per backend."""
    device: str = ""
    dtype: str = ""
    text: str = ""
    """The decoded completion (without the EOS token): what the verifier scores."""
    finish_reason: FinishReason | None = None
    """``stop`` (an EOS id ended it) or ``length`` (the token budget did); None where not reported."""
    reward_components: Mapping[str, float] = dataclasses.field(default_factory=dict)
    reward_reason: str = ""
    kinds: tuple[int, ...] = ()
    """Per completion id, :data:`MODEL` or :data:`ENVIRONMENT`; empty: every id is the model's."""

    def __post_init__(self) -> None:
        if not self.completion_ids:
            raise ValueError("completion_ids: must not be empty (a completion holds at least its EOS)")
        _check_ids("prompt_ids", self.prompt_ids)
        _check_ids("completion_ids", self.completion_ids)
        if self.kinds:
            if len(self.kinds) != len(self.completion_ids):
                raise ValueError(
                    f"kinds: need one per completion id ({len(self.completion_ids)}), got {len(self.kinds)}"
                )
            if any(k not in (MODEL, ENVIRONMENT) for k in self.kinds):
                raise ValueError(f"kinds: each must be MODEL ({MODEL}) or ENVIRONMENT ({ENVIRONMENT})")
        if len(self.logprobs) != self.model_tokens:
            raise ValueError(
                f"logprobs: need one per model token ({self.model_tokens}), got {len(self.logprobs)}"
            )
        if not _all_finite(self.logprobs):
            raise ValueError("logprobs: must all be finite")
        if not math.isfinite(self.reward):
            raise ValueError(f"reward: must be finite, got {self.reward!r}")
        if isinstance(self.policy_version, bool) or self.policy_version < 0:
            raise ValueError(f"policy_version: must be an integer ≥ 0, got {self.policy_version!r}")

    @property
    def model_tokens(self) -> int:
        """How many completion ids the model sampled (all of them in a single-turn rollout)."""
        if not self.kinds:
            return len(self.completion_ids)
        return sum(1 for k in self.kinds if k == MODEL)

    @property
    def loss_mask(self) -> tuple[float, ...]:
        """Per completion id: 1.0 where the model sampled it (in the loss), 0.0 where an environment did."""
        if not self.kinds:
            return (1.0,) * len(self.completion_ids)
        return tuple(1.0 if k == MODEL else 0.0 for k in self.kinds)

    @property
    def token_logprobs(self) -> tuple[float, ...]:
        """Per completion id: the behaviour log-prob of a model id, 0.0 for an environment id."""
        if not self.kinds:
            return self.logprobs
        values = iter(self.logprobs)
        return tuple(next(values) if k == MODEL else 0.0 for k in self.kinds)

    def staleness(self, version: int) -> int:
        """Staleness when consumed by the step that turns ``version`` into ``version + 1``."""
        return version - self.policy_version


def sampled(
    prompt_ids: Iterable[int],
    completion_ids: Iterable[int],
    logprobs: Iterable[float],
    *,
    text: str,
    finish_reason: FinishReason,
) -> Rollout:
    """A rollout as a backend returns it: not scored, no version yet (the worker knows which it loaded),
    behaviour log-probs clamped to ≤ 0 (float rounding in a backend can report a tiny positive value;
    the wire and the loss take log-probabilities)."""
    return Rollout(
        prompt_ids=tuple(int(i) for i in prompt_ids),
        completion_ids=tuple(int(i) for i in completion_ids),
        logprobs=tuple(min(0.0, float(x)) for x in logprobs),
        text=text,
        finish_reason=finish_reason,
    )


@dataclasses.dataclass(frozen=True)
class Group:
    """The rollouts of one prompt; advantages are normalised within it."""

    rollouts: tuple[Rollout, ...]
    id: str = ""
    """The coordinator's task id (for logs)."""
    worker: str = ""
    """The id of the worker that generated it (the trainer's log-prob check convicts workers)."""
    key: str | None = None
    """The seeded-draw key of the lease it was sampled under (``backends/seeded.py``): rollout ``i`` drew
    its token at position ``t`` from ``uniform(key, i, t)``. None: not drawn with a key."""

    def __post_init__(self) -> None:
        if not self.rollouts:
            raise ValueError(f"group {self.id!r}: has no rollouts")

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
        for i, group in enumerate(self.groups):
            if len(group.rollouts) < 2:  # a job's groupSize is ≥ 2; the coordinator's state takes any
                raise ValueError(
                    f"groups[{i}]: group {group.id!r}: needs ≥ 2 rollouts (advantages are normalised within "
                    f"a group), got {len(group.rollouts)}"
                )

    @property
    def rollouts(self) -> list[Rollout]:
        """All rollouts, group by group."""
        return [r for g in self.groups for r in g.rollouts]

    @property
    def num_tokens(self) -> int:
        """Completion tokens in the batch."""
        return sum(len(r.completion_ids) for r in self.rollouts)
