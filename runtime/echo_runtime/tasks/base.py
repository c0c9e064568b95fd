"""The task interface: a seeded prompt source plus an exact, never-raising verifier.

A task is what the coordinator hands out (prompts), what every worker and the coordinator score with
(the verifier), and what the trainer evaluates on (the held-out stream). Promises:

* ``prompts(split, seed)`` is deterministic for a given (split, seed); the ``train`` and ``heldout``
  streams never share a problem (tasks key their problems and partition the key space).
* ``score(problem, completion)`` returns a :class:`Reward` with ``value`` in [0, 1] for *any*
  string — malformed model output scores 0 with a reason; it never raises.
* ``reference(problem)`` is a completion that scores 1: used for the supervised warm-up and for tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

Split = Literal["train", "heldout"]

Prompt = str | tuple[Mapping[str, str], ...]
"""Text, or chat messages ``({"role": ..., "content": ...}, ...)``; :mod:`echo_runtime.models.prompts`
renders either for the model."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """One prompt with everything the verifier needs to score a completion of it."""

    id: str
    prompt: Prompt
    answer: Any
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Reward:
    """A score in [0, 1], its named components, and why (for malformed or wrong answers)."""

    value: float
    components: Mapping[str, float] = dataclasses.field(default_factory=dict)
    reason: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.value <= 1.0:
            raise ValueError(f"reward must be in [0, 1], got {self.value}")


@runtime_checkable
class Task(Protocol):
    """A prompt source with an exact verifier. See the module docstring for the promises."""

    name: str

    def prompts(self, split: Split, seed: int) -> Iterator[Problem]:
        """An endless (or long) deterministic stream of problems of one split."""
        ...

    def score(self, problem: Problem, completion: str) -> Reward:
        """Score a completion; never raises."""
        ...

    def reference(self, problem: Problem) -> str:
        """A completion that scores 1.0."""
        ...
