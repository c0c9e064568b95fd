"""Colocated sampling with dynamic sampling (runner.colocated.sample_filtered), with a scripted backend."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from echo_runtime import tasks
from echo_runtime.coordinator import signal
from echo_runtime.rollout import Rollout
from echo_runtime.runner import colocated
from echo_runtime.spec.policy import Algorithm


class Scripted:
    """A backend whose completions are right for the prompts in ``solvable``, "x" for the others."""

    name, device, dtype = "scripted", "cpu", "float32"

    def __init__(self, task: tasks.base.Task, solvable: set[str]) -> None:
        self.task, self.solvable, self.calls = task, solvable, 0

    def sample(self, prompts: Sequence[str], n: int, params: object) -> list[list[Rollout]]:
        self.calls += 1
        out = []
        for prompt in prompts:
            right = str(eval(str(prompt).rstrip("="))) if prompt in self.solvable else "x"
            texts = [right if i == 0 else "x" for i in range(n)]
            out.append([Rollout((1,), (2,), (-1.0,), text=t) for t in texts])
        return out


def _setup(solvable_every: int) -> tuple[tasks.base.Task, list[tasks.base.Problem], Scripted]:
    task = tasks.get_task("arithmetic")
    problems = list(itertools.islice(task.prompts("train", 0), 40))
    solvable = {str(p.prompt) for i, p in enumerate(problems) if i % solvable_every == 0}
    return task, problems, Scripted(task, solvable)


def test_dynamic_sampling_samples_more_prompts_until_the_batch_has_signal() -> None:
    task, problems, backend = _setup(solvable_every=3)  # one prompt in three gives a group with signal
    algorithm = Algorithm.model_validate({"batchSize": 4, "groupSize": 2, "preset": "DAPO"})
    watch = signal.SignalWatch(dynamic_sampling=True, set_aside_after=0)
    batch = colocated.sample_filtered(
        backend, torch.nn.Linear(1, 1), iter(problems), task, algorithm, 0, watch
    )
    assert len(batch.groups) == 4 and all(
        signal.has_signal([r.reward for r in g.rollouts]) for g in batch.groups
    )
    # 4 prompts per round, one in three solvable: prompts 0, 3, 6, 9 are kept by the end of round 3.
    assert backend.calls == 3 and watch.filtered_groups == 8
    assert len({g.id for g in batch.groups}) == 4


def test_without_the_option_the_batch_is_what_was_sampled() -> None:
    task, problems, backend = _setup(solvable_every=3)
    algorithm = Algorithm.model_validate({"batchSize": 4, "groupSize": 2})
    watch = signal.SignalWatch()
    batch = colocated.sample_filtered(
        backend, torch.nn.Linear(1, 1), iter(problems), task, algorithm, 0, watch
    )
    assert len(batch.groups) == 4 and backend.calls == 1 and watch.filtered_groups == 0


def test_a_hopeless_task_stops_after_the_round_limit_and_trains_on_what_it_has() -> None:
    task, problems, backend = _setup(solvable_every=10_000)  # only prompt 0 solvable
    algorithm = Algorithm.model_validate({"batchSize": 2, "groupSize": 2, "preset": "DAPO"})
    watch = signal.SignalWatch(dynamic_sampling=True, set_aside_after=0)
    stream = iter(problems[1:])  # not even that one
    batch = colocated.sample_filtered(backend, torch.nn.Linear(1, 1), stream, task, algorithm, 0, watch)
    assert backend.calls == colocated.MAX_SAMPLING_ROUNDS and len(batch.groups) == 2
    assert watch.filtered_groups == 2 * colocated.MAX_SAMPLING_ROUNDS


def test_a_colocated_run_refuses_reward_models_it_could_not_call(tmp_path: Path) -> None:
    from echo_runtime.runner import local, session

    job = tmp_path / "job.yaml"
    job.write_text(
        "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: c}\n"
        "spec:\n  syncPolicy: {mode: Colocated}\n  storage: {path: " + str(tmp_path / "store") + "}\n"
        "  rewardModels: [{name: rm, type: Classifier, model: /nowhere}]\n"
    )
    with pytest.raises(local.RunError, match=r"spec.rewardModels: a Colocated run .* Sequential or Async"):
        session.run(job, local.RunOptions(run_dir=tmp_path / "run", progress=False), echo=lambda _: None)
