"""Whether a job still learns: groups without signal, DAPO's dynamic sampling, and the warnings both faces show.

A group whose rewards are all equal has zero GRPO (and RLOO) advantage on every rollout: it costs a
forward and backward pass and moves nothing. Two things follow:

* **Dynamic sampling** (Yu et al. 2025, DAPO §3.2; ``spec.algorithm.dynamicSampling``): with the option
  on, the coordinator keeps such groups out of batches. A filtered group is counted (``filteredGroups``)
  and its prompt is *not* re-queued — it was used and had nothing to teach. A prompt whose last
  ``setAsideAfter`` groups were all filtered is *set aside*: the next time the prompt stream offers it
  (its next epoch), it is skipped once and counted (``setAsidePrompts``), then it gets another chance.
  Pacing counts a leased task as ``keepRate`` of a group (:class:`SignalWatch.keep_rate`, a moving
  average of the fraction of groups kept), so the swarm keeps enough tasks in flight that the trainer
  does not wait longer than it would without the filter, and Δmax is still enforced on every group.
* **A job that learns nothing says so**, with or without the option: when the last
  :data:`NO_SIGNAL_BATCHES` batches handed to the trainer held only groups without signal (or, with
  dynamic sampling, when fewer than :data:`NEARLY_ALL` of the last :data:`WINDOW` groups had signal),
  :meth:`SignalWatch.warnings` returns a message. The status document carries it; ``echorl run`` prints
  it and the operator turns it into the EchoJob's ``LearningSignal`` condition and a Warning Event.

Pure and in-memory.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

WINDOW = 64
"""Completed groups the signal fraction is measured over."""
NO_SIGNAL_BATCHES = 5
"""Consecutive batches without a group with signal before the job says it learns nothing."""
NEARLY_ALL = 0.05
"""With dynamic sampling: a signal fraction below this over a full window is "nearly all filtered"."""
MIN_KEEP = 0.05
"""The lowest keep rate pacing plans with: at most 1/MIN_KEEP tasks per group it needs."""


def has_signal(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ (compared exactly: the trainer's advantages are 0 otherwise)."""
    return any(r != rewards[0] for r in rewards)


@dataclasses.dataclass
class SignalWatch:
    """What the coordinator has seen of the signal in its groups and batches."""

    dynamic_sampling: bool = False
    set_aside_after: int = 2
    filtered_groups: int = 0
    set_aside_prompts: int = 0
    no_signal_batches: int = 0
    """Consecutive batches handed out whose every group had equal rewards."""
    keep_rate: float = 1.0
    """Moving average of the fraction of completed groups kept (1 without dynamic sampling)."""
    _recent: collections.deque[bool] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=WINDOW)
    )
    _streaks: dict[str, int] = dataclasses.field(default_factory=dict)

    def completed(self, problem_id: str, rewards: Sequence[float]) -> bool:
        """A group of ``problem_id`` arrived (and passed the staleness rule); True to keep it, False when
        dynamic sampling filters it (counted here)."""
        signal = has_signal(rewards)
        self._recent.append(signal)
        if signal:
            self._streaks.pop(problem_id, None)
        else:
            self._streaks[problem_id] = self._streaks.get(problem_id, 0) + 1
        if not self.dynamic_sampling:
            return True
        self.keep_rate = 0.9 * self.keep_rate + 0.1 * (1.0 if signal else 0.0)
        if not signal:
            self.filtered_groups += 1
        return signal

    def set_aside(self, problem_id: str) -> bool:
        """The prompt stream offers ``problem_id``: True to skip it this once (counted)."""
        if not self.dynamic_sampling or self.set_aside_after <= 0:
            return False
        if self._streaks.get(problem_id, 0) < self.set_aside_after:
            return False
        self._streaks[problem_id] = 0
        self.set_aside_prompts += 1
        return True

    def handed(self, groups: Sequence[Sequence[float]]) -> None:
        """A batch with these groups' rewards went to the trainer."""
        if groups and not any(has_signal(g) for g in groups):
            self.no_signal_batches += 1
        else:
            self.no_signal_batches = 0

    @property
    def planning_keep(self) -> float:
        """The keep rate pacing plans with (never below :data:`MIN_KEEP`)."""
        return max(MIN_KEEP, self.keep_rate)

    @property
    def signal_fraction(self) -> float | None:
        """The fraction of the last :data:`WINDOW` completed groups with signal; None before any."""
        return sum(self._recent) / len(self._recent) if self._recent else None

    def warnings(self) -> list[str]:
        out = []
        if self.no_signal_batches >= NO_SIGNAL_BATCHES:
            out.append(
                f"no learning signal: the last {self.no_signal_batches} batches held only groups whose rewards "
                "were all equal, so every advantage and gradient was zero; the task may be too hard or too "
                "easy for the model, or its verifier may score everything alike"
            )
        fraction = self.signal_fraction
        if (
            self.dynamic_sampling
            and len(self._recent) == WINDOW
            and fraction is not None
            and fraction < NEARLY_ALL
        ):
            out.append(
                f"nearly every group is filtered: {WINDOW - sum(self._recent)} of the last {WINDOW} had equal "
                "rewards (dynamic sampling keeps them out), so batches fill slowly"
            )
        return out
