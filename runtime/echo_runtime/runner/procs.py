"""Child processes of a local run: each in its own process group, logging to its own file.

Promises: every process started here is stopped by :meth:`Processes.stop_all` — SIGTERM to its
whole process group, then SIGKILL after a grace period — including when the runner itself is
interrupted (Ctrl-C) or fails; nothing is left running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence, Set
from pathlib import Path
from typing import IO


@dataclasses.dataclass
class Child:
    """One running child process."""

    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """The environment it was started with on top of the runner's (to restart it the same way)."""
    cpus: frozenset[int] | None = None
    """The CPUs it is pinned to, if any (to restart it the same way)."""

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Processes:
    """The set of children of one run."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: dict[str, Child] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cpus: Set[int] | None = None,
    ) -> Child:
        """Start ``argv`` as child ``name``; its stdout and stderr go to ``<log_dir>/<name>.log``.
        ``cpus``: pin it to these CPUs (set before the interpreter has started any thread, which
        inherit it)."""
        if name in self.children and self.children[name].returncode is None:
            raise RuntimeError(f"a process named {name!r} is already running")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            list(argv),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=True,  # its own process group: signals reach its children too
        )
        if cpus is not None:
            os.sched_setaffinity(proc.pid, cpus)
        child = Child(
            name,
            list(argv),
            proc,
            log_path,
            log_file,
            dict(env or {}),
            None if cpus is None else frozenset(cpus),
        )
        self.children[name] = child
        return child

    def exited(self) -> list[Child]:
        """Children that have exited (with any code)."""
        return [c for c in self.children.values() if c.returncode is not None]

    def stop(self, name: str, grace_s: float = 10.0) -> int | None:
        """Stop one child: SIGTERM its group, SIGKILL after ``grace_s``; returns its exit code."""
        child = self.children[name]
        if child.returncode is None:
            _signal_group(child.proc, signal.SIGTERM)
            try:
                child.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(child.proc, signal.SIGKILL)
                child.proc.wait()
        _signal_group(child.proc, signal.SIGKILL)  # stragglers in its group
        with contextlib.suppress(OSError):
            child.log_file.close()
        return child.returncode

    def stop_all(self, grace_s: float = 10.0, order: Sequence[str] = ()) -> None:
        """Stop every child, those named in ``order`` first (in that order), the rest together."""
        for name in order:
            if name in self.children:
                self.stop(name, grace_s)
        rest = [c for c in self.children.values() if c.returncode is None]
        for child in rest:
            _signal_group(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in rest:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for name in list(self.children):
            self.stop(name, grace_s=0.0)


class NotHealthy(RuntimeError):
    """A served child (the coordinator) exited, or did not answer ``/healthz``, before the deadline."""


def wait_healthy(url: str, child: Child, timeout_s: float = 120.0) -> None:
    """Poll ``url``/healthz until it answers 200; :class:`NotHealthy` (with the log tail) if ``child``
    exits first or ``timeout_s`` passes."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.returncode is not None:
            raise NotHealthy(f"the {child.name} exited with code {child.returncode}:\n{child.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise NotHealthy(f"the {child.name} did not become healthy in {timeout_s:.0f}s:\n{child.log_tail()}")


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
