"""Bounds on the work a verifier does for untrusted model text, and the optional libraries verifiers use.

The built-in verifiers are Echo's own code and take microseconds. Two call libraries that parse model
text with sympy (math-verify, for the ``dataset`` task's ``MathVerify`` checker) or run a dataset's own
scorer (reasoning-gym), where a completion like ``\\boxed{9^{9^{9^9}}}`` can take hours. So they run
inside :func:`deadline`:

* In the main thread it raises :class:`Overrun` after ``seconds`` (``SIGALRM`` through ``ITIMER_REAL``),
  and nests with a timer that is already armed — the coordinator's per-rollout alarm
  (:mod:`echo_runtime.coordinator.scoring`): whichever deadline is earlier fires; if it is the outer one,
  the section ends with :class:`Overrun` and the outer timer is re-armed to fire at once, so the outer
  timeout is reported as its own; otherwise the outer timer gets back what is left of it. Once due, it
  rings every :data:`RETRY_SECONDS` until the section ends, since an exception raised inside a gc
  callback or met by a bare ``except:`` is lost. The libraries' own timeouts are switched off:
  math-verify's ``signal.alarm`` would cancel the coordinator's timer, and it raises in any thread but
  the main one.
* Off the main thread no signal can be used and the section runs unbounded. Echo's trust boundary is
  still covered: the coordinator re-scores what workers send in its scoring processes, in their main
  thread, and kills a process stuck in native code, where no signal handler runs (``int()`` of a
  ``Decimal`` with a huge exponent).

:func:`require` imports an optional extra lazily, so that Echo without it still imports, and a task
that needs it says what to install.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType, ModuleType

VERIFIER_SECONDS = 5.0
"""Time a library-backed verifier may spend on one completion (the coordinator allows 10 s per rollout)."""


RETRY_SECONDS = 0.1
"""After a deadline, how often it rings again until the section has ended (an Overrun can be lost)."""


class Overrun(BaseException):
    """The section's time is up. A BaseException, so that a library's ``except Exception`` (math-verify
    and reasoning-gym have several) cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Overrun` in the main thread after ``seconds`` (see the module docstring)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return
    outer_handler = signal.getsignal(signal.SIGALRM)
    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    start = time.monotonic()
    mine = outer_left == 0.0 or seconds <= outer_left

    def ring(signum: int, frame: FrameType | None) -> None:
        # Ring again soon, in case this Overrun is swallowed: raised in a gc callback or a __del__ it is
        # only printed, and a library may hold a bare ``except:``.
        signal.setitimer(signal.ITIMER_REAL, RETRY_SECONDS)
        raise Overrun()

    signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds if mine else outer_left)
    try:
        yield
    finally:
        while True:  # a last Overrun may land in the middle of this; then do it again
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, outer_handler if outer_handler is not None else signal.SIG_DFL)
                if outer_left > 0.0:
                    # An outer deadline that passed meanwhile fires as soon as possible, in the outer code.
                    left = outer_left - (time.monotonic() - start)
                    signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6), outer_interval)
                break
            except Overrun:
                continue


def require(module: str, extra: str, user: str) -> ModuleType:
    """``import module``, or a ValueError saying that ``user`` needs the optional ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(
            f"{user} needs the optional {extra!r} extra: pip install 'echorl[{extra}]' ({exc})"
        ) from exc
