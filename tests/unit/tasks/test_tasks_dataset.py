"""The dataset task: every file format, fields, held-out splits, checkers, TRL reward functions, errors."""

from __future__ import annotations

import itertools
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from echo_runtime import tasks
from echo_runtime.spec.policy import Task as TaskSpec
from echo_runtime.tasks import base, scoring
from echo_runtime.tasks import dataset as dataset_task

ROWS = [
    {"prompt": f"What is {a} + {b}?", "answer": a + b, "level": a % 3}
    for a in range(1, 9)
    for b in range(1, 9)
]


def take(task: base.Task, split: base.Split, n: int, seed: int = 0) -> list[base.Problem]:
    return list(itertools.islice(task.prompts(split, seed), n))


def everything(task: Any, split: base.Split) -> list[base.Problem]:
    return take(task, split, task.sizes()[split])


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "data.jsonl", ROWS)


def make(**settings: Any) -> Any:
    return tasks.get_task("dataset", settings)


def test_every_format_gives_the_same_problems(tmp_path: Path, jsonl: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data.json").write_text(json.dumps(ROWS), encoding="utf-8")
    with (tmp_path / "data.csv").open("w", encoding="utf-8") as f:
        f.write(
            "prompt,answer,level\n" + "".join(f'"{r["prompt"]}",{r["answer"]},{r["level"]}\n' for r in ROWS)
        )
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "data.parquet")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    expected = {(p.prompt, int(p.answer)) for p in everything(make(path=str(jsonl)), "heldout")}
    assert 0 < len(expected) < len(ROWS)
    for name in ("data.json", "data.csv", "data.parquet", "ds"):
        task = make(path=str(tmp_path / name))
        assert task.sizes() == make(path=str(jsonl)).sizes(), name
        got = {(p.prompt, int(p.answer)) for p in everything(task, "heldout")}
        assert got == expected, name  # CSV answers are text ("5"): the checker reads them as numbers
        first = take(task, "train", 1)[0]
        assert task.score(first, f"It is {first.answer}.").value == 1.0, name


def test_a_datasets_dict_gives_its_splits(tmp_path: Path) -> None:
    import datasets

    train = [{"question": {"text": f"q{i}"}, "reward_model": {"ground_truth": str(i)}} for i in range(10)]
    test = [{"question": {"text": f"t{i}"}, "reward_model": {"ground_truth": str(i)}} for i in range(3)]
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(train), "test": datasets.Dataset.from_list(test)}
    ).save_to_disk(str(tmp_path / "dd"))
    task = make(
        path=str(tmp_path / "dd"),
        heldout_split="test",
        prompt_field="question.text",
        answer_field="reward_model.ground_truth",
    )
    assert task.sizes() == {"train": 10, "heldout": 3}
    assert {p.prompt for p in everything(task, "heldout")} == {"t0", "t1", "t2"}
    with pytest.raises(ValueError, match="no split 'validation'; its splits are train, test"):
        make(path=str(tmp_path / "dd"), split="validation")


def test_the_held_out_hash_split_is_stable_and_disjoint(tmp_path: Path, jsonl: Path) -> None:
    shuffled = write_jsonl(tmp_path / "shuffled.jsonl", list(reversed(ROWS)))
    a, b = make(path=str(jsonl)), make(path=str(shuffled))
    held_a = {p.prompt for p in everything(a, "heldout")}
    assert held_a == {p.prompt for p in everything(b, "heldout")}  # a property of the row, not the order
    assert held_a.isdisjoint({p.prompt for p in everything(a, "train")})
    larger = make(path=str(jsonl), heldout_fraction=0.5)
    assert larger.sizes()["heldout"] > a.sizes()["heldout"]
    # the streams are seeded shuffles that cycle through their split
    assert [p.id for p in take(a, "train", 5, seed=1)] == [p.id for p in take(a, "train", 5, seed=1)]
    assert [p.id for p in take(a, "train", 5, seed=1)] != [p.id for p in take(a, "train", 5, seed=2)]


def test_a_second_file_is_the_held_out_set(tmp_path: Path, jsonl: Path) -> None:
    held = write_jsonl(tmp_path / "held.jsonl", [{"prompt": "What is 100 + 1?", "answer": 101}])
    task = make(path=str(jsonl), heldout_path=str(held))
    assert task.sizes() == {"train": len(ROWS), "heldout": 1}
    assert take(task, "heldout", 2)[1].prompt == "What is 100 + 1?"  # an epoch of one, repeated


def test_chat_prompts_messages_and_instructions(tmp_path: Path) -> None:
    conversations = [
        {
            "messages": [
                {"role": "system", "content": "Be exact."},
                {"role": "user", "content": "Name 2 + 2."},
                {"role": "assistant", "content": "4"},
            ]
        }
    ] * 2 + [
        {"messages": [{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": str(i)}]}
        for i in range(30)
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", conversations)
    task = make(path=str(path), messages_field="messages", answer_field=None, instruction="Digits only.")
    problem = next(p for p in everything(task, "train") + everything(task, "heldout") if p.answer == "4")
    assert problem.prompt == (
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "Name 2 + 2.\nDigits only."},
    )
    assert task.score(problem, "2 + 2 = 4").value == 1.0
    # TRL's conversational "prompt" column works as it is
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "answer": i} for i in range(20)]
    task2 = make(path=str(write_jsonl(tmp_path / "conv.jsonl", rows)), heldout_fraction=0.5)
    assert isinstance(take(task2, "train", 1)[0].prompt, tuple)


@pytest.mark.parametrize(
    ("checker", "answer", "completion", "value"),
    [
        ("Math", 12, "so \\boxed{12}.", 1.0),
        ("Math", "3/4", "The answer is \\boxed{\\frac{3}{4}}", 1.0),
        ("Math", "0.75", "I get 3/4", 1.0),
        ("Math", "#### 72", "72", 1.0),  # GSM8K's answer layout
        ("Math", "x^2 + 1", "Thus \\boxed{x^{2}+1}", scoring.FORMAT_CREDIT),
        ("Math", "x^2 + 1", "Thus \\boxed{ x^2+1 }", 1.0),
        ("Math", "x^2 + 1", "x^2 + 1", 0.0),  # a non-numeric answer must be boxed
        ("Math", 12, "\\boxed{12} wait, no: \\boxed{13}", scoring.FORMAT_CREDIT),
        ("Numeric", 12, "7 + 5 = 12.", 1.0),
        ("Numeric", 12, "no idea", 0.0),
        ("Exact", "Paris", "  Paris \n", 1.0),
        ("Exact", "Paris", "paris", scoring.FORMAT_CREDIT),
        ("Exact", "Paris", "It is \\boxed{Paris}", 1.0),
    ],
)
def test_checkers(tmp_path: Path, checker: str, answer: Any, completion: str, value: float) -> None:
    rows = [{"prompt": f"p{i}", "answer": answer} for i in range(20)]
    task = make(path=str(write_jsonl(tmp_path / "d.jsonl", rows)), checker=checker, heldout_fraction=0.5)
    problem = take(task, "train", 1)[0]
    assert task.score(problem, completion).value == pytest.approx(value)
    assert task.score(problem, task.reference(problem)).value == 1.0


REWARDS = """
calls = []

def length_reward(prompts, completions, **kwargs):
    calls.append((prompts, completions, kwargs))
    return [1.0 if len(c) < 10 else 0.0 for c in completions]

def level_reward(prompts, completions, level):
    return [level[0] / 2 for _ in completions]

def abstain(prompts, completions, **kwargs):
    return [None for _ in completions]

def broken(prompts, completions, **kwargs):
    raise RuntimeError("boom")

def big(prompts, completions, **kwargs):
    return [5.0]

def wrong_count(prompts, completions, **kwargs):
    return [1.0, 1.0]
"""


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "echo_test_rewards.py").write_text(textwrap.dedent(REWARDS), encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    import echo_test_rewards

    yield echo_test_rewards
    sys.modules.pop("echo_test_rewards", None)


def test_reward_functions_have_trls_signature_and_weights(jsonl: Path, reward_module: Any) -> None:
    task = make(
        path=str(jsonl),
        checker="Numeric",
        checker_weight=2.0,
        reward_functions=[
            {"function": "echo_test_rewards:length_reward", "weight": 1.0},
            {"function": "echo_test_rewards:level_reward", "weight": 1.0},
            {"function": "echo_test_rewards:abstain", "weight": 5.0},
        ],
    )
    problem = next(p for p in everything(task, "train") if p.meta["columns"]["level"] == 2)
    reward = task.score(problem, str(problem.answer))  # right, short, level 2 -> 1.0 from each
    assert reward.value == pytest.approx(1.0)
    long_wrong = task.score(problem, "I think it is 1000, really.")  # 0.1 x2, 0, 1.0: abstain is left out
    assert long_wrong.value == pytest.approx((2 * 0.1 + 0.0 + 1.0) / 4)
    assert long_wrong.components["fn:echo_test_rewards:level_reward"] == 1.0
    prompts_seen, completions_seen, kwargs = reward_module.calls[-1]
    assert prompts_seen == [problem.prompt] and completions_seen == ["I think it is 1000, really."]
    assert kwargs == {"answer": [problem.answer], "level": [2]}  # every column but the prompt, as lists


def test_bad_reward_functions_score_zero_and_never_raise(jsonl: Path, reward_module: Any) -> None:
    for name, reason in [("broken", "raised RuntimeError"), ("wrong_count", "2 values"), ("big", "clipped")]:
        task = make(
            path=str(jsonl), checker="None", reward_functions=[{"function": f"echo_test_rewards:{name}"}]
        )
        reward = task.score(take(task, "train", 1)[0], "anything")
        assert reward.value == (1.0 if name == "big" else 0.0), name
        assert reason in reward.reason or name == "big", (name, reward.reason)
    with pytest.raises(ValueError, match="no function 'nope'"):
        make(path=str(jsonl), reward_functions=[{"function": "echo_test_rewards:nope"}])
    with pytest.raises(ValueError, match=r"rewardFunctions\[0\]: cannot import module 'no_such_mod'"):
        make(path=str(jsonl), reward_functions=[{"function": "no_such_mod:f"}])


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        (
            '{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": 2\n',
            "d.jsonl",
            r"d\.jsonl:2: not valid JSON",
        ),
        ('{"prompt": "a", "answer": 1}\n[1, 2]\n', "d.jsonl", r"d\.jsonl:2: expected a JSON object"),
        (
            '{"prompt": "a", "answer": 1}\n{"question": "b", "answer": 2}\n',
            "d.jsonl",
            r"d\.jsonl:2: no field 'prompt'; its fields are \['answer', 'question'\]",
        ),
        ('{"prompt": "a"}\n', "d.jsonl", r"d\.jsonl:1: no field 'answer'"),
        ('{"prompt": "", "answer": 1}\n', "d.jsonl", r"d\.jsonl:1: field 'prompt' is an empty prompt"),
        ('{"prompt": [{"role": "user"}], "answer": 1}\n', "d.jsonl", r"d\.jsonl:1: field 'prompt' message 0"),
        (
            '{"prompt": "a", "answer": "many"}\n',
            "d.jsonl",
            r"d\.jsonl:1: field 'answer': 'many' is not .* a number",
        ),
        ('{"rows": []}', "d.json", r"d\.json: expected a JSON array"),
        ("prompt,answer\nq,1,extra\n", "d.csv", r"d\.csv:line 2: more values"),
        ("x", "d.txt", r"d\.txt: cannot tell the format"),
    ],
)
def test_file_problems_name_file_row_and_field(tmp_path: Path, content: str, name: str, message: str) -> None:
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        make(path=str(tmp_path / name), checker="Numeric")


def test_settings_are_checked_by_the_spec(jsonl: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        make(path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="heldoutPath and heldoutSplit"):
        make(path=str(jsonl), heldout_path=str(jsonl), heldout_split="test")
    with pytest.raises(ValueError, match="checker: None needs at least one"):
        make(path=str(jsonl), checker="None")
    with pytest.raises(ValueError, match="colum"):
        make(path=str(jsonl), colums="x")  # a typo is refused, not ignored
    with pytest.raises(ValueError, match="gives no heldout problems"):
        make(path=str(write_jsonl(tmp_path / "one.jsonl", ROWS[:1])), heldout_fraction=0.01)


def test_the_job_spec_routes_dataset_settings(jsonl: Path) -> None:
    spec = TaskSpec.model_validate(
        {"name": "dataset", "dataset": {"path": str(jsonl), "heldoutFraction": 0.25}}
    )
    task = tasks.from_spec(spec)
    assert isinstance(task, dataset_task.DatasetTask)
    assert task.settings.heldout_fraction == 0.25
    with pytest.raises(ValueError, match=r"needs spec\.task\.dataset"):
        TaskSpec.model_validate({"name": "dataset"})
    with pytest.raises(ValueError, match="only the dataset task takes it"):
        TaskSpec.model_validate({"name": "arithmetic", "dataset": {"path": "x.jsonl"}})


def test_tasks_from_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A distribution that declares an ``echorl.tasks`` entry point, installed as pip installs one."""
    site = tmp_path / "site"
    (site / "echo_plugin_pkg").mkdir(parents=True)
    (site / "echo_plugin_pkg" / "__init__.py").write_text(
        "from echo_runtime.tasks.arithmetic import Arithmetic\n\ndef make(**options):\n    return Arithmetic(**options)\n"
    )
    info = site / "echo_plugin_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[echorl.tasks]\nsums = echo_plugin_pkg:make\n")
    monkeypatch.syspath_prepend(str(site))
    task = tasks.get_task("sums", {"digits": 1})
    assert task.name == "arithmetic" and all(len(p.prompt) <= 4 for p in take(task, "train", 20))
    with pytest.raises(ValueError, match=r"installed plugins \(echorl.tasks\): .*sums"):
        tasks.get_task("summs")
    sys.modules.pop("echo_plugin_pkg", None)
