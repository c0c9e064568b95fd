"""Arithmetic: hand-checked answers and scores, option checks, and properties of the generated stream."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_runtime.tasks import arithmetic, base, scoring

TASK = arithmetic.Arithmetic()


def problem(prompt: str, answer: int) -> base.Problem:
    return base.Problem("hand", prompt, answer)


@pytest.mark.parametrize(
    ("operands", "ops", "value"),
    [
        ([12, 7], "+", 19),
        ([12, 7], "-", 5),
        ([2, 3, 4], "+*", 14),
        ([2, 3, 4], "*-", 2),
        ([9, 8, 7], "--", -6),
    ],
)
def test_evaluate_uses_the_usual_precedence(operands: list[int], ops: str, value: int) -> None:
    assert arithmetic.evaluate(operands, ops) == value


@pytest.mark.parametrize(
    ("completion", "value", "well_formed"),
    [
        ("19", 1.0, True),
        ("  19  ", 1.0, True),
        ("\n19\n", 1.0, True),
        ("19\nbecause 12+7 is 19", 1.0, True),
        ("019", 1.0, True),
        ("18", scoring.FORMAT_CREDIT, True),
        ("-19", scoring.FORMAT_CREDIT, True),
        ("19\n20", scoring.FORMAT_CREDIT, True),  # the final number is the answer
        ("20\n19", 1.0, True),
        ("12 + 7 = 19.", 1.0, True),  # what a chat model writes
        ("12 + 7 = 18.", scoring.FORMAT_CREDIT, True),
        ("The sum is \\boxed{19}, not 20", 1.0, True),  # a boxed answer wins
        ("19.0", 1.0, True),
        ("19.5", scoring.FORMAT_CREDIT, True),
        ("+19", 1.0, True),
        ("19 apples", 1.0, True),
        ("nineteen", 0.0, False),
        ("", 0.0, False),
        ("\u0661\u0669", 0.0, False),  # Arabic-Indic digits are not read as a number
        ("9" * 5000, 0.0, False),  # a number too long to be an answer: no answer, and no int() blow-up
    ],
)
def test_hand_written_scores(completion: str, value: float, well_formed: bool) -> None:
    reward = TASK.score(problem("12+7=", 19), completion)
    assert reward.value == value
    assert reward.components["format"] == (1.0 if well_formed else 0.0)
    assert (reward.reason == "") == (value == 1.0)


def test_a_negative_answer_is_read() -> None:
    assert TASK.score(problem("3-5=", -2), "-2").value == 1.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"digits": 0}, "option 'digits' must be an integer from 1 to 4, got 0"),
        ({"digits": 5}, "option 'digits' must be an integer from 1 to 4"),
        ({"digits": "2"}, "option 'digits' must be an integer"),
        ({"digits": True}, "option 'digits' must be an integer"),
        ({"operands": 4}, "option 'operands' must be an integer from 2 to 3"),
        ({"ops": "+/"}, "option 'ops' must be a non-empty selection of the characters '\\+-\\*'"),
        ({"ops": ""}, "option 'ops'"),
        ({"ops": 3}, "option 'ops'"),
    ],
)
def test_bad_options_say_what_is_allowed(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        arithmetic.Arithmetic(**options)  # type: ignore[arg-type]


def test_ops_may_be_a_list_and_are_canonical() -> None:
    assert arithmetic.Arithmetic(ops=["*", "+", "+"]).ops == "+*"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options", [{}, {"digits": 1, "ops": "-"}, {"digits": 3, "ops": "*", "operands": 3}, {"ops": "+-*"}]
)
def test_generated_problems_follow_the_options(options: dict[str, object]) -> None:
    task = arithmetic.Arithmetic(**options)  # type: ignore[arg-type]
    pattern = re.compile(rf"[0-9]{{1,{task.digits}}}(?:[{re.escape(task.ops)}][0-9]{{1,{task.digits}}})+=")
    seen_ops: set[str] = set()
    for p in itertools.islice(task.prompts("train", 0), 300):
        assert pattern.fullmatch(p.prompt), p.prompt
        numbers = [int(n) for n in re.findall(r"[0-9]+", p.prompt)]
        assert len(numbers) == task.operands
        ops = "".join(re.findall(r"[-+*]", p.prompt))
        seen_ops.update(ops)
        # Independent of arithmetic.evaluate: Python's own precedence.
        assert p.answer == eval(p.prompt[:-1]) >= 0  # digits and operators only, checked above
    assert seen_ops == set(task.ops)


@pytest.mark.parametrize(("ops", "operands"), [(o, n) for o in ("+", "-", "*", "+-*") for n in (2, 3)])
def test_even_the_smallest_option_spaces_have_both_splits(ops: str, operands: int) -> None:
    task = arithmetic.Arithmetic(digits=1, ops=ops, operands=operands)
    for split in ("train", "heldout"):
        assert next(task.prompts(split, 0)).meta["split"] == split


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10**6), index=st.integers(0, 50), delta=st.sampled_from([-1, 1, 10]))
def test_an_off_by_one_answer_scores_below_one(seed: int, index: int, delta: int) -> None:
    p = next(itertools.islice(TASK.prompts("train", seed), index, None))
    assert TASK.score(p, TASK.reference(p)).value == 1.0
    assert TASK.score(p, str(p.answer + delta)).value == scoring.FORMAT_CREDIT
