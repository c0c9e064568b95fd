"""Math: answer extraction and exact comparison by hand, the word-problem generator, and JSONL files."""

from __future__ import annotations

import itertools
import json
import pathlib
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_runtime.tasks import answers, base, mathwords, scoring, splits

TASK = mathwords.MathWords()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("\\boxed{3/4}", Fraction(3, 4)),
        ("0.75", Fraction(3, 4)),
        ("\\boxed{\\frac{3}{4}}", Fraction(3, 4)),
        ("\\boxed{\\dfrac{10}{4}}", Fraction(5, 2)),
        ("\\boxed{-\\frac{3}{4}}", Fraction(-3, 4)),
        ("\\boxed{1,000}", Fraction(1000)),
        ("$-2$", Fraction(-2)),
        ("\u22123", Fraction(-3)),  # the Unicode minus sign
        (".5", Fraction(1, 2)),
        ("the answer is 12", Fraction(12)),
        ("First 3 apples, then 4 more.\n\nSo the answer is 7.", Fraction(7)),
        ("The answer is $1,234.50.", Fraction(246900, 200)),
        ("\\boxed{7} is what I first thought, but \\boxed{8}", Fraction(8)),
        ("\\boxed{x = \\frac{1}{2}} so 9", Fraction(1, 2)),  # a box wins over the last line
        ("\\boxed{3 unbalanced\n5", Fraction(5)),  # an unclosed box is no box
        ("5-2", Fraction(2)),  # a minus between numbers is subtraction, not a sign
        ("garbage", None),
        ("", None),
        ("\\boxed{}", None),
        ("\\boxed{seven}\n7", None),  # the box holds the answer, and it is not a number
        ("3/0", None),
        ("1" * 61, None),
        ("12\n\nno number here", Fraction(12)),  # the last number, wherever it is
        ("17 + 25 = 42.", Fraction(42)),
        ("The answer is 7.\n\nI hope this helps!", Fraction(7)),
        ("We get \\boxed{42} apples, so 3 boxes", Fraction(42)),
    ],
)
def test_extraction(text: str, value: Fraction | None) -> None:
    assert answers.extract(text) == value


@pytest.mark.parametrize(
    ("value", "text"),
    [(Fraction(19), "19"), (Fraction(119, 4), "29.75"), (Fraction(-1, 20), "-0.05"), (Fraction(1, 3), "1/3")],
)
def test_canonical_text(value: Fraction, text: str) -> None:
    assert answers.canonical(value) == text


@settings(max_examples=200, deadline=None)
@given(st.fractions(max_denominator=10**6).filter(lambda f: abs(f.numerator) < 10**20))
def test_canonical_text_reads_back_to_the_same_value(value: Fraction) -> None:
    assert answers.extract(answers.canonical(value)) == value
    assert answers.extract(f"\\boxed{{{answers.canonical(value)}}}") == value


HAND = base.Problem("hand", "(hand)", "3/4")


@pytest.mark.parametrize(
    ("completion", "value", "boxed"),
    [
        ("\\boxed{3/4}", 1.0, 1.0),
        ("\\boxed{0.75}", 1.0, 1.0),
        ("Each gets three quarters.\n0.75", 1.0, 0.0),
        ("\\boxed{\\frac{6}{8}}", 1.0, 1.0),
        ("\\boxed{4/3}", scoring.FORMAT_CREDIT, 1.0),
        ("about 0.7", scoring.FORMAT_CREDIT, 0.0),
        ("three quarters", 0.0, 0.0),
    ],
)
def test_hand_written_scores(completion: str, value: float, boxed: float) -> None:
    reward = TASK.score(HAND, completion)
    assert reward.value == value
    assert reward.components["boxed"] == boxed
    assert (reward.reason == "") == (value == 1.0)


def test_generated_problems_look_right() -> None:
    problems = list(itertools.islice(TASK.prompts("train", 0), 300))
    assert all(p.prompt.endswith(f"\n{mathwords.INSTRUCTION}\n") for p in problems)
    assert all(TASK.reference(p) == f"\\boxed{{{p.answer}}}" for p in problems)
    values = [Fraction(p.answer) for p in problems]
    assert any(v.denominator != 1 for v in values) and any(v < 0 for v in values)
    assert len({p.prompt for p in problems}) > 250
    # Every template is used: each has a phrase of its own.
    phrases = ["buys", "gave", "Each box", "does each friend get", "pizza", "on sale", "km in", "change"]
    phrases += ["average", "temperature"]
    assert len(phrases) == len(mathwords.TEMPLATES)
    missing = [ph for ph in phrases if not any(ph in p.prompt for p in problems)]
    assert not missing


def test_a_hand_checked_template() -> None:
    # Rebuild one generated problem by hand from its text: the sum template.
    p = next(p for p in TASK.prompts("train", 0) if " buys " in p.prompt and " more." in p.prompt)
    words = p.prompt.split()
    has, more = int(words[2]), int(words[6])
    assert Fraction(p.answer) == has + more


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), delta=st.sampled_from([Fraction(1), Fraction(-1), Fraction(1, 2)]))
def test_an_off_by_one_answer_scores_below_one(seed: int, delta: Fraction) -> None:
    p = next(TASK.prompts("train", seed))
    assert TASK.score(p, TASK.reference(p)).value == 1.0
    wrong = answers.canonical(Fraction(p.answer) + delta)
    assert TASK.score(p, f"\\boxed{{{wrong}}}").value == scoring.FORMAT_CREDIT


def write(path: pathlib.Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_a_jsonl_file_is_split_by_question_and_streamed(tmp_path: pathlib.Path) -> None:
    questions = [f"What is {n} plus one?" for n in range(200)]
    lines = [json.dumps({"question": q, "answer": n + 1}) for n, q in enumerate(questions)]
    lines[7] = json.dumps({"question": questions[7], "answer": "so... #### 8"})  # GSM8K style
    lines.insert(3, "")  # blank lines are skipped
    task = mathwords.MathWords(path=write(tmp_path / "p.jsonl", lines))
    for split in ("train", "heldout"):
        expected = {q for q in questions if splits.split_of(q) == split}
        stream = list(itertools.islice(task.prompts(split, 0), 2 * len(expected)))
        assert {p.prompt.split("\n")[0] for p in stream} == expected  # each epoch covers the split
        assert [p.id for p in stream] == [p.id for p in itertools.islice(task.prompts(split, 0), len(stream))]
        for p in stream:
            assert task.score(p, task.reference(p)).value == 1.0
            n = int(p.prompt.split()[2])
            assert Fraction(p.answer) == n + 1
            assert p.meta["line"] == n + 1 + (n >= 3)
    assert 0 < sum(splits.split_of(q) == "heldout" for q in questions) < 50


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"question": "a?", "answer": 1}', "{nope"], r"p\.jsonl:2: not valid JSON"),
        (['{"question": "a?"}'], r"p\.jsonl:1: expected an object with \"question\" and \"answer\""),
        (["[1, 2]"], r"p\.jsonl:1: expected an object"),
        (['{"question": "", "answer": 1}'], r"p\.jsonl:1: question must be a non-empty string"),
        (['{"question": "a?", "answer": "many"}'], r"p\.jsonl:1: answer 'many' is not"),
        (['{"question": "a?", "answer": true}'], r"p\.jsonl:1: answer True is not"),
        (["", "  "], r"p\.jsonl' has no problems"),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path: pathlib.Path, lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mathwords.MathWords(path=write(tmp_path / "p.jsonl", lines))


def test_a_missing_file_is_named(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match=r"problem file '.*nothing\.jsonl' does not exist"):
        mathwords.MathWords(path=str(tmp_path / "nothing.jsonl"))


def test_a_file_with_no_heldout_questions_says_so(tmp_path: pathlib.Path) -> None:
    question = next(q for q in (f"q{n}?" for n in range(100)) if splits.split_of(q) == "train")
    task = mathwords.MathWords(
        path=write(tmp_path / "p.jsonl", [json.dumps({"question": question, "answer": 1})])
    )
    assert next(task.prompts("train", 0)).answer == "1"
    with pytest.raises(ValueError, match="has no heldout problems"):
        task.prompts("heldout", 0)
