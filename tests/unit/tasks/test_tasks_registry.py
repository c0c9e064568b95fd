"""The registry: built-in names, user tasks as module:function, option errors, and the tokenizer corpus."""

from __future__ import annotations

import pathlib
import textwrap

import pytest

from echo_runtime import tasks
from echo_runtime.tasks import arithmetic, knights_knaves, mathwords, sokoban


def test_builtins_by_name() -> None:
    assert tasks.BUILTIN_TASKS == (
        "arithmetic",
        "knights_knaves",
        "sokoban",
        "math",
        "dataset",
        "reasoning_gym",
    )
    assert isinstance(tasks.get_task("arithmetic"), arithmetic.Arithmetic)
    assert isinstance(tasks.get_task("knights_knaves"), knights_knaves.KnightsKnaves)
    assert isinstance(tasks.get_task("sokoban"), sokoban.Sokoban)
    assert isinstance(tasks.get_task("math"), mathwords.MathWords)
    for name in tasks.BUILTIN_TASKS:
        # dataset needs a file (test_tasks_dataset.py), reasoning_gym a dataset (test_tasks_reasoning_gym.py)
        if name not in ("dataset", "reasoning_gym"):
            assert tasks.get_task(name).name == name
    with pytest.raises(ValueError, match=r"spec\.task\.dataset: path: Field required"):
        tasks.get_task("dataset")


def test_options_reach_the_task() -> None:
    task = tasks.get_task("arithmetic", {"digits": 3, "ops": "*", "operands": 3})
    assert isinstance(task, arithmetic.Arithmetic)
    assert (task.digits, task.ops, task.operands) == (3, "*", 3)


def test_an_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(
        ValueError, match="unknown task 'countdown': built-in tasks are arithmetic, knights_knaves"
    ):
        tasks.get_task("countdown")


def test_an_unknown_option_lists_the_allowed_ones() -> None:
    with pytest.raises(
        ValueError, match="task 'arithmetic': unknown option 'digit'; allowed options: digits, ops"
    ):
        tasks.get_task("arithmetic", {"digit": 3})
    with pytest.raises(ValueError, match="unknown option 'people'; allowed options: min_people, max_people"):
        tasks.get_task("knights_knaves", {"people": 3})


def test_check_refuses_a_manifests_task_mistakes_without_running_it() -> None:
    """What ``spec.task`` is checked for wherever a manifest is read (echorl validate, echorl run, the
    operator): a built-in's unknown option or bad value, and a name close to a built-in."""
    from echo_runtime.tasks import registry

    with pytest.raises(ValueError, match=r"unknown task 'knights_knaaves': did you mean 'knights_knaves'\?"):
        registry.check("knights_knaaves")
    with pytest.raises(
        ValueError, match="unknown option 'min_peeple'; allowed options: min_people, max_people"
    ):
        registry.check("knights_knaves", {"min_peeple": 3})
    with pytest.raises(ValueError, match="option 'digits' must be an integer from 1 to 4, got 9"):
        registry.check("arithmetic", {"digits": 9})
    registry.check("arithmetic", {"digits": 2})
    registry.check("pkg.tasks:make", {"anything": 1})  # user code: checked where it runs
    # A name like no built-in may be a plugin installed only in the images: a cluster cannot tell...
    registry.check("countdown")
    # ...but `echorl run` runs the task here, where it must be installed.
    with pytest.raises(ValueError, match="unknown task 'countdown': built-in tasks are arithmetic"):
        registry.check("countdown", plugins_here=True)


def test_a_bad_value_says_the_range() -> None:
    with pytest.raises(ValueError, match="sokoban: option 'boxes' must be an integer from 1 to 3, got 9"):
        tasks.get_task("sokoban", {"boxes": 9})


USER_MODULE = """
from echo_runtime.tasks import arithmetic

def make(*, digits=1):
    task = arithmetic.Arithmetic(digits=digits)
    task.name = "user_sums"
    return task

def flexible(**options):
    return arithmetic.Arithmetic(**options)

def not_a_task():
    return 42

NOT_CALLABLE = 3
"""


@pytest.fixture
def user_module(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "echo_user_tasks_for_tests.py").write_text(textwrap.dedent(USER_MODULE), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "echo_user_tasks_for_tests"


def test_a_user_task_by_module_and_function(user_module: str) -> None:
    task = tasks.get_task(f"{user_module}:make", {"digits": 2})
    assert task.name == "user_sums"
    problem = next(task.prompts("train", 0))
    assert task.score(problem, task.reference(problem)).value == 1.0
    assert isinstance(tasks.get_task(f"{user_module}:flexible", {"ops": "*"}), arithmetic.Arithmetic)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("{m}:make", {"size": 1}, "unknown option 'size'; allowed options: digits"),
        ("{m}:not_a_task", {}, "not_a_task\\(\\) returned a int, not a Task"),
        ("{m}:missing", {}, "module '{m}' has no function 'missing'"),
        ("{m}:NOT_CALLABLE", {}, "has no function 'NOT_CALLABLE'"),
        ("echo_no_such_module_anywhere:make", {}, "cannot import module 'echo_no_such_module_anywhere'"),
        ("{m}:", {}, "a task of your own is named 'module:function'"),
        (":make", {}, "a task of your own is named 'module:function'"),
    ],
)
def test_user_task_mistakes_are_explained(
    user_module: str, name: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.format(m=user_module)):
        tasks.get_task(name.format(m=user_module), options)


def test_the_corpus_covers_every_task_and_is_deterministic() -> None:
    texts = tasks.corpus(seed=0, per_task=40)
    assert texts == tasks.corpus(seed=0, per_task=40)
    assert texts != tasks.corpus(seed=1, per_task=40)
    assert len(texts) == 4 * 40
    joined = "".join(texts)
    for marker in ("*", "Knights always tell the truth", "Sokoban:", "\\boxed{"):
        assert marker in joined
    # Each text is a prompt with its reference completion, which the task scores 1.
    sums = [t for t in texts if "=" in t and "\n" not in t]
    task = arithmetic.Arithmetic(digits=4, ops="+-*", operands=3)
    for text in sums:
        prompt, completion = text.split("=")
        assert task.score(tasks.Problem("c", prompt + "=", eval(prompt)), completion).value == 1.0
