"""How a local run divides this machine's CPUs among its processes.

:func:`plan_cores` sizes each process's thread pool (:class:`CorePlan`); with ``echorl run --pin-cores``,
:func:`pin_plan` also gives each process its own CPUs (:class:`CpuSets`). Both are pure: the runner
(:mod:`.local`, :mod:`.colocated`) applies them, ``echorl bench sync`` reports them.

Promises: every process gets at least one thread and one CPU; with fewer CPUs than the plan asks,
sets wrap around and share rather than fail.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class CorePlan:
    """How many threads each process gets; a documented, honest split of the machine."""

    trainer: int
    worker: int
    evaluator: int


def plan_cores(cores: int, workers: int) -> CorePlan:
    """Split ``cores`` between one trainer and ``workers`` workers (the evaluator runs rarely: 1).

    The trainer gets half (at least 1); workers share the rest (at least 1 each). On 2 cores: trainer 1,
    each worker 1 — the two halves of the decoupled pipeline run side by side.
    """
    trainer = max(1, cores // 2)
    worker = max(1, (cores - trainer) // max(1, workers))
    return CorePlan(trainer=trainer, worker=worker, evaluator=1)


@dataclasses.dataclass(frozen=True)
class CpuSets:
    """Which CPUs each process may run on, when ``echorl run --pin-cores`` pins them."""

    trainer: frozenset[int]
    workers: tuple[frozenset[int], ...]
    evaluator: frozenset[int]


def pin_plan(available: Sequence[int], cores: int, plan: CorePlan, workers: int) -> CpuSets:
    """Pin the trainer to the first ``plan.trainer`` of the run's ``cores`` CPUs and the workers to the
    rest (``plan.worker`` each, taken in turn); the evaluator, which measures the run and is no part of
    it, to every CPU of the machine the trainer does not have. A Colocated run (no workers) keeps its
    ``cores`` CPUs to itself. With fewer CPUs than the plan asks, sets wrap around (and share)."""
    cpus = sorted(available)[: max(1, cores)]
    if not cpus:
        raise ValueError("no CPU to pin to")
    trainer = frozenset(cpus[: max(1, min(plan.trainer, len(cpus)))])
    rest = [c for c in cpus if c not in trainer] or cpus
    chosen = []
    for i in range(workers):
        start = (i * plan.worker) % len(rest)
        chosen.append(frozenset(rest[(start + k) % len(rest)] for k in range(min(plan.worker, len(rest)))))
    evaluator = frozenset(c for c in available if c not in trainer) or frozenset(available)
    return CpuSets(trainer=trainer, workers=tuple(chosen), evaluator=evaluator)
