"""Task factories with misbehaving verifiers, for the scoring tests (``misbehaving_tasks:misbehaving``).

Each wraps the arithmetic task and misbehaves only on completions that say so, so one group can hold
honest and hostile completions side by side.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

from echo_runtime import tasks
from echo_runtime.tasks import base


class _Misbehaving:
    name = "misbehaving"

    def __init__(self, how: str) -> None:
        self.inner = tasks.get_task("arithmetic")
        self.how = how

    def prompts(self, split: base.Split, seed: int) -> Iterator[base.Problem]:
        return self.inner.prompts(split, seed)

    def reference(self, problem: base.Problem) -> str:
        return self.inner.reference(problem)

    def score(self, problem: base.Problem, completion: str) -> base.Reward:
        if completion == "spin":
            while True:  # a Python-level runaway: the child's alarm interrupts it
                pass
        if completion == "native":
            # A hang the alarm cannot interrupt (as in a C extension): only killing the process ends it.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        if completion == "raise":
            raise RuntimeError("the verifier broke")
        return self.inner.score(problem, completion)


def misbehaving(how: str = "") -> base.Task:
    return _Misbehaving(how)
