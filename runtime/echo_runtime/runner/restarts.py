"""When ``echorl run`` restarts a process that died: a pod's ``restartPolicy: OnFailure``, locally.

The coordinator, the trainer, the evaluator and every worker are restarted when they exit before the
run is over (the trainer: when it exits with an error; its clean exit ends the run). Like Kubernetes'
CrashLoopBackOff, the delay doubles with each restart — 1 s, 2 s, 4 s … up to ``cap_s`` — and starts
again from 1 s once a process has run ``healthy_s`` without dying. Unlike a pod, a local run gives up:
after ``max_quick`` restarts in a row that each died within ``healthy_s``, the process is taken to be
broken (a bad manifest, a missing model) and the run fails with its log.

Pure bookkeeping: the caller passes the clock, starts the processes and shows :meth:`Restarts.counts`.
"""

from __future__ import annotations

import dataclasses


class GaveUp(RuntimeError):
    """A process kept dying right after each restart."""


@dataclasses.dataclass
class _History:
    restarts: int = 0
    quick: int = 0
    """Consecutive restarts after a run shorter than ``healthy_s``."""
    started: float = 0.0


@dataclasses.dataclass
class Restarts:
    """Restart decisions for the named processes of one run."""

    base_s: float = 1.0
    cap_s: float = 30.0
    healthy_s: float = 60.0
    max_quick: int = 5
    _history: dict[str, _History] = dataclasses.field(default_factory=dict)

    def started(self, name: str, now: float) -> None:
        """``name`` was (re)started at ``now``."""
        self._history.setdefault(name, _History()).started = now

    def on_exit(self, name: str, now: float) -> float:
        """``name`` died at ``now``: the delay before restarting it; :class:`GaveUp` if it keeps dying."""
        history = self._history.setdefault(name, _History(started=now))
        if now - history.started >= self.healthy_s:
            history.quick = 0
        if history.quick >= self.max_quick:
            raise GaveUp(
                f"{name} died {history.quick + 1} times in a row, each within {self.healthy_s:.0f}s of starting"
            )
        delay = min(self.cap_s, self.base_s * float(2**history.quick))
        history.quick += 1
        history.restarts += 1
        return delay

    def counts(self) -> dict[str, int]:
        """Restarts so far, per process (only those restarted at least once)."""
        return {name: h.restarts for name, h in sorted(self._history.items()) if h.restarts}
