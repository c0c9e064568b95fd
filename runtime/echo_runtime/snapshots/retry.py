"""Retries with exponential backoff and full jitter, for transient failures of a store.

:func:`call` runs a function until it succeeds, the error is not transient, or the attempts run out;
the last error is then re-raised unchanged, so the caller decides how to word it. The delays grow
``base_s * 2**n`` capped at ``max_s``, each drawn uniformly from ``[0, delay]`` ("full jitter") so that
many workers retrying against one recovering server do not retry in lockstep.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger("echo_runtime.snapshots")


@dataclasses.dataclass(frozen=True)
class Backoff:
    """How often and how patiently to retry."""

    attempts: int = 5
    """Total tries, the first included (1 = no retry)."""
    base_s: float = 0.2
    max_s: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts: must be ≥ 1, got {self.attempts}")
        if self.base_s < 0 or self.max_s < 0:
            raise ValueError("base_s and max_s: must be ≥ 0")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """The sleeps between tries: ``attempts - 1`` values, jittered."""
        draw = (rng or random).uniform
        for n in range(self.attempts - 1):
            yield draw(0.0, min(self.max_s, self.base_s * (2**n)))


NO_RETRY = Backoff(attempts=1)


def call(
    fn: Callable[[], T],
    *,
    transient: Callable[[BaseException], bool],
    backoff: Backoff,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Return ``fn()``, retrying while it raises errors that ``transient`` accepts."""
    delays = backoff.delays()
    attempt = 1
    while True:
        try:
            return fn()
        except Exception as exc:
            delay = next(delays, None)
            if delay is None or not transient(exc):
                raise
            log.warning(
                "%s failed (attempt %d of %d, retrying in %.2f s): %s",
                what,
                attempt,
                backoff.attempts,
                delay,
                exc,
            )
            sleep(delay)
            attempt += 1
