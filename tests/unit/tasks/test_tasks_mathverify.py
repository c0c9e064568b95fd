"""The dataset task's MathVerify checker: math-verify's equivalences, the project's reward convention,
hostile text, threads, the coordinator's alarm, the manifest, and the missing extra."""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_runtime import tasks
from echo_runtime.coordinator import scoring as coordinator_scoring
from echo_runtime.spec.policy import Task as TaskSpec
from echo_runtime.tasks import base, limits, mathverify, scoring
from echo_runtime.tasks import dataset as dataset_task

pytest.importorskip("math_verify", reason="the optional `math-verify` extra")

ROWS = [
    {"prompt": "Half of one?", "answer": "0.5"},
    {"prompt": "Three quarters?", "answer": "\\frac{3}{4}"},
    {"prompt": "Expand (x+1)^2 - 2x.", "answer": "x^2 + 1"},
    {"prompt": "Which numbers x satisfy 1 < x <= 2?", "answer": "(1, 2]"},
    {"prompt": "Tom has 3 bags of 6 apples. How many apples?", "answer": "3 bags of 6 is 3*6=18.\n#### 18"},
    {"prompt": "How many grams in a kilogram?", "answer": 1000},
    {"prompt": "Diagonal of the unit square?", "answer": "\\sqrt{2}"},
]


def check(completion: str, answer: Any) -> tuple[bool, bool, str]:
    return dataset_task.check("MathVerify", completion, answer)


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("So the result is \\boxed{\\frac{1}{2}}.", "0.5"),
        ("So the result is \\boxed{\\frac{1}{2}}.", 0.5),
        ("The answer is $\\frac{2}{4}$.", "0.5"),
        ("It is 1/2", "\\frac{1}{2}"),
        ("\\boxed{x^2+1}", "x^2 + 1"),
        ("\\boxed{1 + x^{2}}", "x^2 + 1"),
        ("$x \\in (1, 2]$ so \\boxed{(1,2]}", "(1, 2]"),
        ("Tom has 18 apples.", "3*6=18.\n#### 18"),
        ("\\boxed{\\frac{\\sqrt{2}}{1}}", "\\sqrt{2}"),
    ],
)
def test_equivalent_answers_are_correct(completion: str, answer: Any) -> None:
    found, correct, _ = check(completion, answer)
    assert found and correct


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("\\boxed{0.6}", "0.5"),
        ("I first thought 1/2, but \\boxed{\\frac{1}{3}}", "0.5"),
        ("\\boxed{x^2 - 1}", "x^2 + 1"),
        ("\\boxed{[1, 2]}", "(1, 2]"),
    ],
)
def test_wrong_answers_are_found_but_not_correct(completion: str, answer: Any) -> None:
    found, correct, reason = check(completion, answer)
    assert found and not correct
    assert "expected" in reason


def test_through_the_dataset_task_with_the_project_convention(tmp_path: Path) -> None:
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    task = tasks.get_task("dataset", {"path": str(path), "checker": "MathVerify", "heldout_fraction": 0.3})
    problems = list(itertools.islice(task.prompts("train", 0), 20)) + list(
        itertools.islice(task.prompts("heldout", 0), 5)
    )
    for problem in problems:
        right = task.score(problem, task.reference(problem))
        assert right.value == 1.0, (problem.answer, task.reference(problem), right)
        wrong = task.score(problem, "\\boxed{123456789}")
        assert wrong.value == scoring.FORMAT_CREDIT and wrong.components == {"format": 1.0, "correct": 0.0}
        nothing = task.score(problem, "I do not know.")
        assert nothing.value == 0.0 and nothing.components["format"] == 0.0


@pytest.mark.parametrize(
    "completion",
    [
        "\\boxed{9^{9^{9^{9}}}}",  # sympy would evaluate this power for hours
        "\\boxed{10^{10^{10}}}",
        "\\boxed{99999999999!}",
        "\\boxed{" * 3000,
        "$" + "\\sqrt{" * 400 + "2" + "}" * 400 + "$",
        "\x00\ud800\\boxed{\udfff}",
        "x" * 200_000,
        "",
    ],
)
def test_hostile_text_scores_zero_without_raising(monkeypatch: pytest.MonkeyPatch, completion: str) -> None:
    # Bounded by math-verify's deadline (test_tasks_limits.py shows that it fires and cannot be swallowed).
    monkeypatch.setattr(limits, "VERIFIER_SECONDS", 0.5)
    _, correct, reason = check(completion, "0.5")
    assert not correct and reason


@settings(max_examples=150, deadline=None)
@given(completion=st.text())
def test_any_text_gives_a_reward_in_range(completion: str) -> None:
    found, correct, _ = check(completion, "\\frac{1}{2}")
    assert isinstance(found, bool) and isinstance(correct, bool)


def test_it_runs_off_the_main_thread() -> None:
    # math-verify's own timeouts use signal.alarm and raise ValueError outside the main thread.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: check(c, "0.5"), ["\\boxed{\\frac{1}{2}}", "\\boxed{2}"]))
    assert [r[:2] for r in results] == [(True, True), (True, False)]


class _CheckThenSpin:
    """Runs the checker, then spends 5 s of Python time: the coordinator's alarm must still stop it."""

    name = "check_then_spin"

    def prompts(self, split: base.Split, seed: int) -> Iterator[base.Problem]:
        raise NotImplementedError

    def reference(self, problem: base.Problem) -> str:
        return ""

    def score(self, problem: base.Problem, completion: str) -> base.Reward:
        check(completion, problem.answer)
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            pass
        return base.Reward(1.0)


def test_it_leaves_the_coordinators_alarm_armed() -> None:
    # math-verify's own timeout would call signal.alarm(0) and cancel the coordinator's timer.
    # Had math-verify disarmed the timer, the 5 s spin would end and score 1 with no timeout.
    problem = base.Problem("p", "Half of one?", "0.5")
    scores = coordinator_scoring.score_group(
        _CheckThenSpin(), problem, ["\\boxed{\\frac{1}{2}}"], timeout_s=1.0
    )
    assert scores.timeouts == 1, scores


def test_the_manifest_accepts_it_and_names_the_allowed_checkers(tmp_path: Path) -> None:
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    spec = TaskSpec.model_validate(
        {"name": "dataset", "dataset": {"path": str(path), "checker": "MathVerify"}}
    )
    task = tasks.from_spec(spec)
    assert isinstance(task, dataset_task.DatasetTask) and task.settings.checker == "MathVerify"
    with pytest.raises(ValueError, match="'Math', 'Numeric', 'Exact', 'MathVerify' or 'None'"):
        TaskSpec.model_validate({"name": "dataset", "dataset": {"path": str(path), "checker": "Mathverify"}})


def test_without_the_extra_the_checker_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    mathverify.load.cache_clear()
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify now fails
    try:
        with pytest.raises(
            ValueError,
            match=r"MathVerify checker needs the optional 'math-verify' extra: pip install 'echorl\[math-verify\]'",
        ):
            tasks.get_task("dataset", {"path": str(path), "checker": "MathVerify"})
        # The other checkers do not need it.
        assert tasks.get_task("dataset", {"path": str(path), "checker": "Exact", "heldout_fraction": 0.5})
    finally:
        mathverify.load.cache_clear()
