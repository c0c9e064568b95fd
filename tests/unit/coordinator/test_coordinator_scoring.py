"""Re-scoring off the event loop (coordinator.scoring): per-rollout timeouts, a hung verifier replaced.

The process pool is real (pebble, forkserver): the verifier runs in another process, which the parent
kills when it hangs where no signal reaches it.
"""

from __future__ import annotations

import asyncio

import pytest

import misbehaving_tasks  # tests/ is on sys.path (tests/conftest.py), for the scoring processes too
from echo_runtime import tasks
from echo_runtime.coordinator import scoring
from echo_runtime.spec.policy import Task as TaskSpec

PROBLEM = next(tasks.get_task("arithmetic").prompts("train", 0))
RIGHT = tasks.get_task("arithmetic").reference(PROBLEM)


def test_an_honest_group_scores_as_the_verifier_says() -> None:
    task = tasks.get_task("arithmetic")
    got = scoring.score_group(task, PROBLEM, [RIGHT, "nonsense"], timeout_s=5.0)
    assert [r.value for r in got.rewards] == [task.score(PROBLEM, RIGHT).value, 0.0]
    assert got.rewards[0].value == 1.0 and (got.timeouts, got.errors) == (0, 0)


def test_a_runaway_rollout_times_out_alone_and_the_others_are_scored() -> None:
    got = scoring.score_group(misbehaving_tasks.misbehaving(), PROBLEM, [RIGHT, "spin", "raise", RIGHT], 0.2)
    assert [r.value for r in got.rewards] == [1.0, 0.0, 0.0, 1.0]
    assert "timed out after 0.2s" in got.rewards[1].reason
    assert "RuntimeError: the verifier broke" in got.rewards[2].reason
    assert (got.timeouts, got.errors) == (1, 1)


@pytest.mark.timeout(120)
def test_the_process_pool_scores_and_replaces_a_process_stuck_in_native_code() -> None:
    spec = TaskSpec(name="misbehaving_tasks:misbehaving")
    scorer = scoring.ProcessScorer(spec, processes=1, timeout_s=0.5)
    try:

        async def scenario() -> tuple[scoring.Scores, scoring.Scores, scoring.Scores]:
            honest = await scorer.score(PROBLEM, [RIGHT, "spin", RIGHT])
            stuck = await scorer.score(PROBLEM, [RIGHT, "native"])
            after = await scorer.score(PROBLEM, [RIGHT])  # a fresh process took the stuck one's place
            return honest, stuck, after

        honest, stuck, after = asyncio.run(scenario())
    finally:
        scorer.close()
    assert [r.value for r in honest.rewards] == [1.0, 0.0, 1.0] and honest.timeouts == 1
    assert [r.value for r in stuck.rewards] == [0.0, 0.0] and stuck.timeouts == 2
    assert [r.value for r in after.rewards] == [1.0]
