"""The reward convention shared by the built-in tasks.

A correct answer scores 1. A well-formed but wrong answer scores :data:`FORMAT_CREDIT` (0.1): a small
signal that lets a policy that has not yet learned the answer format learn it first, without paying
enough to make well-formed guessing a good strategy. Anything else scores 0. Every reward names its
components (always ``format`` and ``correct``, plus task-specific ones) and says why when it is below 1.
"""

from __future__ import annotations

from collections.abc import Mapping

from echo_runtime.tasks import base

FORMAT_CREDIT = 0.1


def graded(well_formed: bool, correct: bool, reason: str = "", **extra: float) -> base.Reward:
    """The reward for an answer that parsed (or not) and was right (or not)."""
    components: Mapping[str, float] = {
        "format": 1.0 if well_formed else 0.0,
        "correct": 1.0 if well_formed and correct else 0.0,
        **extra,
    }
    if well_formed and correct:
        return base.Reward(1.0, components, "")
    return base.Reward(FORMAT_CREDIT if well_formed else 0.0, components, reason)
