"""``echorl run`` from start to end: pick the job's arrangement and take it through its phases.

A Colocated job runs as :class:`~.colocated.ColocatedRun` (one process samples and trains), every other
mode as :class:`~.local.LocalRun` (coordinator, workers, trainer); either is prepared, gets its model,
starts, is followed to the end and finishes with ``summary.json``.

Promises: Ctrl-C and SIGTERM (``kill``, a timeout) stop the run the same way — every child process is
stopped and ``summary.json`` is written — and the exception says which it was (:class:`Terminated`
carries ``signum``, so the command line exits 143 rather than 130).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from echo_runtime.runner import local


class Terminated(KeyboardInterrupt):
    """SIGTERM reached ``echorl run``: stop like Ctrl-C (the children run in sessions of their own, so a
    signal to the runner alone would otherwise orphan them)."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(job_path: Path, options: local.RunOptions, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the job to completion (or Ctrl-C / SIGTERM); return its summary."""
    with _sigterm_as_interrupt():
        return _run(job_path, options, echo)


def _run(job_path: Path, options: local.RunOptions, echo: Callable[[str], None]) -> dict[str, Any]:
    run = local.LocalRun(job_path, options, echo)
    if run.job.sync_policy.mode == "Colocated":  # one process samples and trains: see colocated.py
        if run.job.spec.reward_models:
            raise local.RunError(
                "spec.rewardModels: a Colocated run has no coordinator to call the scoring pools; "
                "use syncPolicy.mode Sequential or Async"
            )
        from echo_runtime.runner import colocated  # torch, which only this mode needs in the runner

        run = colocated.ColocatedRun(job_path, options, echo)
    run.prepare()
    run.resolve_model()
    interrupted = False
    try:
        run.start()
        run.open_reporter()
        code = run.monitor()
        if code != 0:
            raise local.RunError(
                f"the trainer exited with code {code}:\n{run.procs.children['trainer'].log_tail()}"
            )
        summary = run.finish()
    except KeyboardInterrupt as exc:
        interrupted = True
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        echo(f"{what}: stopping every process (resume with --resume)")
        raise
    finally:
        run.procs.stop_all(grace_s=10.0)
        if interrupted or not (run.dir / "summary.json").exists():
            with contextlib.suppress(Exception):
                run.write_summary()
        run.close_reporter()
    return summary
