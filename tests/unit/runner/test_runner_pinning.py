"""``echorl run --pin-cores``: which CPUs each process gets, and that a child really runs on them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from echo_runtime.runner import cpus
from echo_runtime.runner.procs import Processes


def test_two_cores_trainer_on_one_worker_on_the_other() -> None:
    plan = cpus.plan_cores(2, 1)
    pins = cpus.pin_plan([0, 1], 2, plan, 1)
    assert (pins.trainer, pins.workers, pins.evaluator) == ({0}, ({1},), {1})


def test_colocated_keeps_its_share_and_the_evaluator_gets_the_rest() -> None:
    pins = cpus.pin_plan([0, 1, 2, 3], 1, cpus.CorePlan(trainer=1, worker=1, evaluator=1), 0)
    assert pins.trainer == {0} and pins.workers == () and pins.evaluator == {1, 2, 3}


def test_more_workers_than_cores_share_them_in_turn() -> None:
    plan = cpus.plan_cores(4, 3)  # trainer 2, each worker max(1, 2 // 3) = 1
    pins = cpus.pin_plan([4, 5, 6, 7], 4, plan, 3)
    assert pins.trainer == {4, 5} and pins.workers == ({6}, {7}, {6})
    one = cpus.pin_plan([3], 1, plan, 2)  # a 1-CPU machine: everything shares it
    assert one.trainer == {3} and one.workers == ({3}, {3}) and one.evaluator == {3}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell the pin apart")
def test_a_pinned_child_runs_only_on_its_cpus(tmp_path: Path) -> None:
    cpu = max(os.sched_getaffinity(0))
    procs = Processes(tmp_path)
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    child = procs.start("pinned", [sys.executable, "-c", code], cpus={cpu})
    child.proc.wait(timeout=60)
    assert child.log_tail() == str([cpu]) and child.cpus == {cpu}
