"""The reasoning_gym task: reasoning-gym's items as prompts, its own verifier as the reward, the split,
option errors, the missing extra, and completions written to hurt the verifier."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from echo_runtime import spec, tasks
from echo_runtime.coordinator import scoring
from echo_runtime.spec.policy import Task as TaskSpec
from echo_runtime.tasks import base, limits, splits
from echo_runtime.tasks import reasoning_gym as rg_task

reasoning_gym = pytest.importorskip("reasoning_gym", reason="the optional `reasoning-gym` extra")

REPO = pathlib.Path(__file__).resolve().parents[3]


def make(dataset: str = "leg_counting", **config: Any) -> rg_task.ReasoningGym:
    task = tasks.get_task("reasoning_gym", {"dataset": dataset, "config": config})
    assert isinstance(task, rg_task.ReasoningGym)
    return task


def take(task: base.Task, split: base.Split, n: int, seed: int = 0) -> list[base.Problem]:
    return list(itertools.islice(task.prompts(split, seed), n))


def tagged(answer: str) -> str:
    """A completion that gives ``answer`` the way the prompt asks, after some reasoning."""
    return f"Let me count them one by one.\n<answer>{answer}</answer>"


@pytest.mark.parametrize("dataset", ["leg_counting", "basic_arithmetic", "knights_knaves", "word_sorting"])
def test_problems_are_the_datasets_items_and_their_own_answers_score_one(dataset: str) -> None:
    task = make(dataset)
    library_items = reasoning_gym.create_dataset(dataset, seed=0, size=10_000)
    for problem in take(task, "train", 5) + take(task, "heldout", 5):
        item = library_items[problem.meta["index"]]
        assert problem.meta["entry"]["question"] == item["question"]
        assert problem.prompt == f"{item['question'].rstrip()}\n\n{rg_task.INSTRUCTION}"
        assert "<answer>" in str(problem.prompt) and "</answer>" in str(problem.prompt)
        reward = task.score(problem, tagged(item["answer"]))
        assert reward.value == 1.0, reward
        assert reward.components == {"format": 1.0, "correct": 1.0}
        assert task.score(problem, task.reference(problem)).value == 1.0


def test_a_wrong_answer_or_a_missing_tag_scores_less() -> None:
    task = make()
    for problem in take(task, "train", 10):
        legs = int(problem.meta["entry"]["answer"])
        wrong = task.score(problem, tagged(str(legs + 1)))
        assert wrong.value < 1.0 and wrong.components["correct"] == 0.0
        assert wrong.components["format"] == 1.0
        assert "expected" in wrong.reason
        untagged = task.score(problem, f"The answer is {legs}.")
        assert untagged.value < 1.0 and untagged.components["format"] == 0.0
        assert "no <answer>" in untagged.reason
        # The last tagged answer counts, as reasoning-gym's extract_answer reads it.
        assert task.score(problem, tagged(str(legs + 1)) + tagged(str(legs))).value == 1.0
        assert task.score(problem, tagged(str(legs)) + tagged(str(legs + 1))).value < 1.0


def test_partial_credit_is_reasoning_gyms_own() -> None:
    task = make("word_sorting")
    problem = take(task, "train", 1)[0]
    # One word short: reasoning-gym's word_sorting gives partial credit for that.
    answer = problem.meta["entry"]["answer"]
    shorter = answer.rsplit(", ", 1)[0]
    value = task.score(problem, tagged(shorter)).value
    expected = reasoning_gym.create_dataset("word_sorting", seed=0, size=10_000).score_answer(
        shorter, problem.meta["entry"]
    )
    assert value == expected and 0.0 < value < 1.0


@pytest.mark.parametrize("dataset", ["countdown", "n_queens", "simple_integration"])
def test_datasets_whose_scorer_runs_the_answer_as_code_are_refused(dataset: str) -> None:
    with pytest.raises(
        ValueError, match=rf"dataset '{dataset}' is refused: its scorer runs the answer as Python"
    ):
        make(dataset)
    composite = {"datasets": [{"name": "leg_counting"}, {"name": dataset}]}
    with pytest.raises(ValueError, match=r"datasets\[1\]: name: dataset .* is refused"):
        tasks.get_task("reasoning_gym", {"dataset": "composite", "config": composite})


def test_every_refused_dataset_really_runs_the_answer(tmp_path: pathlib.Path) -> None:
    """Why the list is what it is: in each, an answer that opens a file creates it."""
    for name in sorted(rg_task.CODE_EVALUATING):
        data = reasoning_gym.create_dataset(name, seed=0, size=3)
        marker = tmp_path / name
        with contextlib.suppress(Exception):
            data.score_answer(f"open({str(marker)!r}, 'w').close()", data[0])
        assert marker.exists(), f"{name}: its scorer did not run the answer (reasoning-gym changed?)"


def test_rewards_are_deterministic() -> None:
    task, again = make("basic_arithmetic"), make("basic_arithmetic")
    for problem in take(task, "heldout", 10):
        for completion in (task.reference(problem), tagged("17"), "no answer", tagged("")):
            assert task.score(problem, completion) == again.score(problem, completion)


def test_heldout_and_train_never_share_a_question() -> None:
    task = make()
    train = take(task, "train", 1500) + take(task, "train", 300, seed=1)
    heldout = take(task, "heldout", 150) + take(task, "heldout", 150, seed=1)
    questions = {p.meta["entry"]["question"] for p in train}
    assert questions.isdisjoint(p.meta["entry"]["question"] for p in heldout)
    assert {p.id for p in train}.isdisjoint(p.id for p in heldout)
    assert all(splits.split_of(p.meta["entry"]["question"]) == "heldout" for p in heldout)
    assert all(p.meta["split"] == "heldout" for p in heldout)
    assert len({p.id for p in heldout}) > 100  # real variety, not one problem repeated


def test_another_dataset_seed_cannot_leak_heldout_problems_into_training() -> None:
    # reasoning-gym draws item i from Random(seed + i): the items of seed 1 are those of seed 0 shifted
    # by one. Splitting by seed would hand the evaluator's problems to the trainer; the question decides.
    shifted = reasoning_gym.create_dataset("leg_counting", seed=1, size=50)
    base_items = reasoning_gym.create_dataset("leg_counting", seed=0, size=50)
    assert shifted[0]["question"] == base_items[1]["question"]
    train = {p.meta["entry"]["question"] for p in take(make(seed=0), "train", 2000)}
    heldout = {p.meta["entry"]["question"] for p in take(make(seed=1), "heldout", 200)}
    assert train.isdisjoint(heldout)


def test_same_seed_same_problems_other_seed_other_order() -> None:
    first = take(make(), "train", 30, seed=4)
    assert [p.id for p in first] == [p.id for p in take(make(), "train", 30, seed=4)]
    assert [p.id for p in first] != [p.id for p in take(make(), "train", 30, seed=5)]
    # The dataset's own seed picks other problems.
    assert {p.id for p in first}.isdisjoint(p.id for p in take(make(seed=7, size=200), "train", 30, seed=4))


def test_the_config_reaches_the_dataset() -> None:
    task = make(min_animals=1, max_animals=2, min_instances=1, max_instances=2, size=300)
    problems = take(task, "train", 200)
    assert all(1 <= len(p.meta["entry"]["metadata"]["animals"]) <= 2 for p in problems)
    assert all(1 <= n <= 2 for p in problems for n in p.meta["entry"]["metadata"]["animals"].values())
    assert {p.meta["index"] for p in problems} <= set(range(300))


def test_a_small_pool_is_walked_without_repeats_in_an_epoch() -> None:
    task = make(size=200)
    train = take(task, "train", 150)
    indices = [p.meta["index"] for p in train]
    assert len(set(indices)) == len(indices)


def test_a_composite_mixes_datasets() -> None:
    task = tasks.get_task(
        "reasoning_gym",
        {
            "dataset": "composite",
            "config": {"datasets": [{"name": "leg_counting", "weight": 1}, {"name": "gcd", "weight": 1}]},
        },
    )
    problems = take(task, "train", 60)
    sources = {p.meta["entry"]["metadata"]["source_dataset"] for p in problems}
    assert sources == {"leg_counting", "gcd"}
    for problem in problems:
        assert task.score(problem, tagged(problem.meta["entry"]["answer"])).value == 1.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"dataset": "leg_countin"},
            r"unknown reasoning-gym dataset 'leg_countin'; did you mean leg_counting",
        ),
        (
            {"dataset": "no_such_thing"},
            r"unknown reasoning-gym dataset 'no_such_thing'; it has \d+ datasets, e\.g\.",
        ),
        ({"dataset": 3}, "option 'dataset': unknown reasoning-gym dataset 3"),
        ({}, "option 'dataset' is required: .*leg_counting"),
        (
            {"dataset": "leg_counting", "config": {"min_animal": 2}},
            "unknown setting.* min_animal; its settings: min_animals, max_animals",
        ),
        (
            {"dataset": "leg_counting", "config": {"min_animals": 0}},
            "reasoning-gym refused it: .*min_animals",
        ),
        ({"dataset": "leg_counting", "config": [1, 2]}, "option 'config' .* must be a mapping"),
        ({"dataset": "leg_counting", "config": {"size": 0}}, "size must be an integer from 1 to"),
        ({"dataset": "leg_counting", "config": {"seed": -1}}, "seed must be a non-negative integer"),
        ({"dataset": "composite", "config": {}}, "datasets must be a non-empty list"),
        (
            {"dataset": "composite", "config": {"datasets": [{"name": "nope"}]}},
            r"datasets\[0\]: unknown reasoning-gym dataset 'nope'",
        ),
        (
            {"dataset": "leg_counting", "datasets": "x"},
            "unknown option 'datasets'; allowed options: dataset, config",
        ),
    ],
)
def test_mistakes_name_the_field_and_what_is_allowed(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tasks.get_task("reasoning_gym", options)


def test_a_dataset_without_reference_answers_has_no_reference_completion() -> None:
    task = make("rush_hour")
    problem = take(task, "train", 1)[0]
    assert problem.answer is None
    with pytest.raises(ValueError, match="no reference answer"):
        task.reference(problem)
    assert task.score(problem, tagged("A+1")).value < 1.0


def test_registry_spec_and_manifest() -> None:
    assert "reasoning_gym" in tasks.BUILTIN_TASKS
    task_spec = TaskSpec.model_validate(
        {"name": "reasoning_gym", "options": {"dataset": "gcd", "config": {"size": 500}}}
    )
    task = tasks.from_spec(task_spec)
    assert isinstance(task, rg_task.ReasoningGym)
    assert (task.dataset, task.size, task.seed) == ("gcd", 500, 0)
    # The shipped example, read as `echorl run` reads it.
    job = spec.load_job(REPO / "examples" / "reasoning-gym.yaml")
    task = tasks.from_spec(job.spec.task)
    assert isinstance(task, rg_task.ReasoningGym)
    assert task.dataset == "leg_counting"
    for problem in take(task, "heldout", 20):
        assert len(problem.meta["entry"]["metadata"]["animals"]) <= 2
        assert task.score(problem, task.reference(problem)).value == 1.0


def test_without_the_extra_the_task_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now fails
    with pytest.raises(
        ValueError, match=r"needs the optional 'reasoning-gym' extra: pip install 'echorl\[reasoning-gym\]'"
    ):
        tasks.get_task("reasoning_gym", {"dataset": "leg_counting"})
    assert tasks.get_task("arithmetic").name == "arithmetic"  # the rest of Echo is unaffected


def test_nothing_else_imports_the_task_libraries() -> None:
    code = (
        "import sys\n"
        "import echo_runtime, echo_runtime.tasks, echo_runtime.spec, echo_runtime.coordinator.scoring\n"
        "from echo_runtime import tasks\n"
        "for name in tasks.BUILTIN_TASKS[:4]:\n"
        "    tasks.get_task(name)\n"
        "print(sorted(m for m in ('reasoning_gym', 'math_verify') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("dataset", "answer", "why"),
    [
        (
            "basic_arithmetic",
            "1e999999999",
            "exponent of six or more digits",
        ),  # int(Decimal): no signal stops it
        ("prime_factorization", "not a number", "raised ValueError"),  # its scorer raises on text
        ("leg_counting", "7" * 50_000, "characters long"),
    ],
)
def test_hostile_answers_score_zero_quickly(
    monkeypatch: pytest.MonkeyPatch, dataset: str, answer: str, why: str
) -> None:
    monkeypatch.setattr(limits, "VERIFIER_SECONDS", 0.5)
    task = make(dataset)
    problem = take(task, "train", 1)[0]
    reward = task.score(problem, tagged(answer))  # refused before the library, or stopped by its deadline
    assert reward.value == 0.0 and why in reward.reason, reward
    assert task.score(problem, task.reference(problem)).value == 1.0  # and the verifier still works


def test_the_library_never_sees_text_after_the_last_closing_tag() -> None:
    """reasoning-gym's non-greedy pattern would rescan the rest of the text from every opening tag with
    no closing one after it (quadratic): it is given the text up to the last closing tag, and at most
    the first 100,000 characters."""
    seen: list[str] = []

    def library(text: str) -> str:
        seen.append(text)
        return "answer"

    opening = "<answer>" * 12_000
    assert rg_task.extract(opening, library) is None and seen == []  # no closing tag: never called
    assert rg_task.extract(opening + "</answer>" + opening, library) == "answer"
    assert seen[-1] == opening + "</answer>"
    assert rg_task.extract("x" * 150_000 + "</answer>", library) is None
    assert len(seen) == 1  # not called: the closing tag lies past the first 100,000 characters
    rg_task.extract("<answer>1</answer>" + "x" * 150_000, library)
    assert seen[-1] == "<answer>1</answer>"
    task = make()
    problem = take(task, "train", 1)[0]
    assert task.score(problem, opening + "</answer>" + opening).value < 1.0


def test_a_problem_of_another_task_scores_zero() -> None:
    task = make()
    stranger = next(tasks.get_task("arithmetic").prompts("train", 0))
    reward = task.score(stranger, tagged("3"))
    assert reward.value == 0.0 and "no entry" in reward.reason


@pytest.mark.timeout(120)
def test_the_coordinators_scoring_processes_score_it_as_this_process_does() -> None:
    """The real pool (pebble, forkserver): the task is rebuilt from the spec there, problems arrive
    pickled with their reasoning-gym items, and a native-code hang is what kills the process."""
    options = {"dataset": "basic_arithmetic", "config": {"size": 500}}
    task = tasks.get_task("reasoning_gym", options)
    problem = take(task, "train", 1)[0]
    completions = [task.reference(problem), tagged("1 + 2"), "no tags", tagged("1e999999999")]
    scorer = scoring.ProcessScorer(TaskSpec(name="reasoning_gym", options=options), timeout_s=2.0)
    try:
        got = asyncio.run(scorer.score(problem, completions))
    finally:
        scorer.close()
    here = [task.score(problem, c) for c in completions[:3]]
    assert [r.value for r in got.rewards[:3]] == [r.value for r in here]
    assert got.rewards[0].value == 1.0
    assert got.rewards[3].value == 0.0 and got.errors == 0
