"""Re-scoring rollouts off the event loop, with a per-rollout timeout.

The coordinator re-computes every reward itself (nothing a worker says is trusted). A task's verifier is
user code (``module:function`` tasks, the ``dataset`` task's reward functions): if it ran on the event
loop, one slow or hanging call would stall every heartbeat and lease until the workers' leases expired.
So scoring happens in a pool of processes, and the handler awaits it without blocking the loop.

Promises:

* Each rollout gets at most ``timeout_s`` of verifier time: the child process interrupts a Python-level
  overrun (``SIGALRM``), and the parent kills a child stuck in native code after the whole group's
  allowance, starting a fresh one (pebble's process pool). A timed-out rollout scores 0 with the reason
  ``"verifier timed out after …"``; :class:`Scores` counts them.
* A verifier that raises — which a task must never do — also scores 0 with the reason, counted as an
  error, so a buggy verifier cannot turn submissions into 5xx replies.
* The child builds the task from the job's ``spec.task``, exactly as the coordinator does
  (:func:`echo_runtime.tasks.from_spec`), so it scores with the same verifier.

:class:`InlineScorer` scores in the calling thread (tests, and tasks given as objects rather than by
name); it enforces the Python-level timeout only when called from the main thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from echo_runtime.tasks import base as tasks_base

if TYPE_CHECKING:
    from echo_runtime.spec.policy import Task as TaskSpec

log = logging.getLogger("echorl.coordinator")

DEFAULT_TIMEOUT_S = 10.0
"""Verifier time per rollout. Built-in verifiers take microseconds; this only stops runaway user code."""
GRACE_S = 5.0
"""Extra time the parent allows a whole group (process start-up, pickling) before killing the child."""


@dataclasses.dataclass(frozen=True)
class Scores:
    """The rewards of one group's completions, and how many hit the timeout or raised."""

    rewards: tuple[tasks_base.Reward, ...]
    timeouts: int = 0
    errors: int = 0


class Scorer(Protocol):
    """Scores the completions of one problem; never raises for what a verifier does."""

    async def score(self, problem: tasks_base.Problem, completions: Sequence[str]) -> Scores: ...

    def close(self) -> None: ...


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`_Timeout` in this (main) thread after ``seconds``; a no-op elsewhere."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def ring(signum: int, frame: Any) -> None:
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def timed_out(seconds: float) -> tasks_base.Reward:
    return tasks_base.Reward(0.0, {}, f"verifier timed out after {seconds:g}s")


def score_group(
    task: tasks_base.Task, problem: tasks_base.Problem, completions: Sequence[str], timeout_s: float
) -> Scores:
    """Score each completion with ``task``'s verifier, each within ``timeout_s`` (in the main thread)."""
    rewards: list[tasks_base.Reward] = []
    timeouts = errors = 0
    for completion in completions:
        try:
            with _alarm(timeout_s):
                reward = task.score(problem, completion)
            if not isinstance(reward, tasks_base.Reward):
                raise TypeError(f"the verifier returned {type(reward).__name__}, not a Reward")
        except _Timeout:
            timeouts += 1
            reward = timed_out(timeout_s)
        except Exception as exc:
            errors += 1
            reward = tasks_base.Reward(0.0, {}, f"verifier error: {type(exc).__name__}: {exc}"[:500])
        rewards.append(reward)
    return Scores(tuple(rewards), timeouts, errors)


class InlineScorer:
    """Scores in the calling thread (see the module docstring)."""

    def __init__(self, task: tasks_base.Task, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.task = task
        self.timeout_s = timeout_s

    async def score(self, problem: tasks_base.Problem, completions: Sequence[str]) -> Scores:
        return score_group(self.task, problem, completions, self.timeout_s)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------- process pool
_CHILD_TASK: tasks_base.Task | None = None


def _child_init(spec: TaskSpec) -> None:
    global _CHILD_TASK
    from echo_runtime import tasks

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    _CHILD_TASK = tasks.from_spec(spec)


def _child_score(problem: tasks_base.Problem, completions: Sequence[str], timeout_s: float) -> Scores:
    assert _CHILD_TASK is not None, "the scoring process was not initialised"
    return score_group(_CHILD_TASK, problem, completions, timeout_s)


class ProcessScorer:
    """Scores in ``processes`` child processes that build the task from the job's ``spec.task``."""

    def __init__(self, spec: TaskSpec, *, processes: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import pebble

        self.timeout_s = timeout_s
        self._pool = pebble.ProcessPool(
            max_workers=processes,
            initializer=_child_init,
            initargs=(spec,),
            context=multiprocessing.get_context("forkserver"),
        )

    async def score(self, problem: tasks_base.Problem, completions: Sequence[str]) -> Scores:
        allowance = self.timeout_s * len(completions) + GRACE_S
        future = self._pool.schedule(
            _child_score, args=(problem, list(completions), self.timeout_s), timeout=allowance
        )
        try:
            result: Scores = await asyncio.wrap_future(future)
            return result
        except TimeoutError:
            log.warning("a verifier ran past %.1fs on one group; its scoring process was replaced", allowance)
            return Scores(tuple(timed_out(self.timeout_s) for _ in completions), timeouts=len(completions))
        except Exception as exc:  # the child died (OOM, a native crash): score 0, say why, keep serving
            log.error("the scoring process failed (%s: %s); the group scores 0", type(exc).__name__, exc)
            reason = f"verifier process failed: {type(exc).__name__}"
            return Scores(
                tuple(tasks_base.Reward(0.0, {}, reason) for _ in completions), errors=len(completions)
            )

    def close(self) -> None:
        self._pool.stop()  # type: ignore[no-untyped-call]
        self._pool.join(timeout=5)
