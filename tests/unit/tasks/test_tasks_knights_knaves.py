"""Knights and Knaves: hand-solved puzzles, the parser, and uniqueness of every generated puzzle."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_runtime.tasks import base, knights_knaves, scoring
from echo_runtime.tasks.knights_knaves import Statement

TASK = knights_knaves.KnightsKnaves()
KNIGHT, KNAVE = True, False


def test_we_are_both_knaves() -> None:
    # Smullyan's classic. A knight could not say it (it would be false), so A is a knave and the
    # statement is false: not both are knaves, so B is a knight.
    statements = [Statement(0, "and", 0, KNAVE, 1, KNAVE)]
    assert knights_knaves.render(statements[0], ["A", "B"]) == "I am a knave and B is a knave."
    assert knights_knaves.solutions(statements, 2) == [(KNAVE, KNIGHT)]


def test_a_hand_solved_puzzle_of_three() -> None:
    # A: "B is a knave."  B: "A and C are the same kind."  C: "B is a knight."
    # If A is a knave, B is a knight, so A and C are alike: C is a knave, yet C's claim would be true.
    # So A is a knight; then B is a knave, A and C differ, C is a knave, and C's claim is false. Unique.
    names = ["Alice", "Bob", "Carol"]
    statements = [
        Statement(0, "is", 1, KNAVE),
        Statement(1, "same", 0, True, 2, True),
        Statement(2, "is", 1, KNIGHT),
    ]
    rendered = [knights_knaves.render(s, names) for s in statements]
    assert rendered == ["Bob is a knave.", "Alice and Carol are the same kind.", "Bob is a knight."]
    assert knights_knaves.solutions(statements, 3) == [(KNIGHT, KNAVE, KNAVE)]


def test_puzzles_without_a_unique_solution_are_recognised() -> None:
    # A and B vouch for each other: both knights or both knaves.
    both = [Statement(0, "is", 1, KNIGHT), Statement(1, "is", 0, KNIGHT)]
    assert sorted(knights_knaves.solutions(both, 2)) == [(KNAVE, KNAVE), (KNIGHT, KNIGHT)]
    # "I am a knave" has no consistent speaker.
    assert knights_knaves.solutions([Statement(0, "is", 0, KNAVE), Statement(1, "is", 0, KNAVE)], 2) == []


@pytest.mark.parametrize(
    ("statement", "text"),
    [
        (Statement(0, "if", 0, KNIGHT, 2, KNAVE), "If I am a knight, then Carol is a knave."),
        (Statement(1, "or", 0, KNAVE, 2, KNIGHT), "Alice is a knave or Carol is a knight."),
        (Statement(1, "iff", 1, KNIGHT, 0, KNIGHT), "I am a knight if and only if Alice is a knight."),
        (Statement(2, "different", 2, True, 0, True), "Alice and I are different kinds."),
        (Statement(2, "same", 0, True, 2, True), "Alice and I are the same kind."),
    ],
)
def test_rendering(statement: Statement, text: str) -> None:
    assert knights_knaves.render(statement, ["Alice", "Bob", "Carol"]) == text


HAND = base.Problem("hand", "(hand)", {"Alice": "knight", "Bob": "knave", "Carol": "knave"})


@pytest.mark.parametrize(
    ("completion", "value", "fraction"),
    [
        ("Alice: knight, Bob: knave, Carol: knave", 1.0, 1.0),
        ("carol: KNAVE\nAlice is a knight;  bob = knave", 1.0, 1.0),
        ("Bob is a knight... no wait.\nAlice: knight, Bob: knave, Carol: knave", 1.0, 1.0),
        ("Alice - a knight, Bob - a knave, Carol - a knave", 1.0, 1.0),
        ("Alice: knight, Bob: knight, Carol: knave", scoring.FORMAT_CREDIT, 2 / 3),
        ("Alice: knave, Bob: knight, Carol: knight", scoring.FORMAT_CREDIT, 0.0),
        ("Alice: knight, Bob: knave", 0.0, 2 / 3),
        ("Alicea: knight, Bob: knave, Carol: knave", 0.0, 2 / 3),
        ("knight knave knave", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
def test_hand_written_scores(completion: str, value: float, fraction: float) -> None:
    reward = TASK.score(HAND, completion)
    assert reward.value == value
    assert reward.components["fraction_correct"] == pytest.approx(fraction)
    assert (reward.reason == "") == (value == 1.0)


def brute_force(statements: Sequence[Mapping[str, Any]], people: Sequence[str]) -> list[dict[str, bool]]:
    """An independent solver over the structured statements: plain loops, one assignment at a time."""
    found = []
    for roles in itertools.product([True, False], repeat=len(people)):
        knight = dict(zip(people, roles, strict=True))
        if all(knight[s["speaker"]] == truth(s, knight) for s in statements):
            found.append(knight)
    return found


def truth(s: Mapping[str, Any], knight: Mapping[str, bool]) -> bool:
    if s["kind"] in ("same", "different"):
        return bool((knight[s["a"]] == knight[s["b"]]) == (s["kind"] == "same"))
    left: bool = knight[s["a"]] == s["a_knight"]
    if s["kind"] == "is":
        return left
    right: bool = knight[s["b"]] == s["b_knight"]
    connectives = {"and": left and right, "or": left or right, "if": not left or right, "iff": left == right}
    return connectives[s["kind"]]


@pytest.mark.parametrize(("low", "high"), [(2, 2), (2, 5), (8, 8)])
def test_every_generated_puzzle_has_exactly_the_stated_solution(low: int, high: int) -> None:
    task = knights_knaves.KnightsKnaves(min_people=low, max_people=high)
    sizes = set()
    for split in ("train", "heldout"):
        for p in itertools.islice(task.prompts(split, 0), 60 if high < 8 else 15):
            people = p.meta["people"]
            sizes.add(len(people))
            assert low <= len(people) <= high
            (only,) = brute_force(p.meta["statements"], people)
            assert {n: "knight" if k else "knave" for n, k in only.items()} == p.answer
            for s in p.meta["statements"]:
                assert f'{s["speaker"]} says: "' in p.prompt
    assert sizes == set(range(low, high + 1))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), flip=st.integers(0, 7))
def test_flipping_one_person_scores_below_one(seed: int, flip: int) -> None:
    p = next(TASK.prompts("train", seed))
    assert TASK.score(p, TASK.reference(p)).value == 1.0
    name = list(p.answer)[flip % len(p.answer)]
    wrong = dict(p.answer, **{name: "knave" if p.answer[name] == "knight" else "knight"})
    reward = TASK.score(p, ", ".join(f"{n}: {r}" for n, r in reversed(wrong.items())))
    assert reward.value == scoring.FORMAT_CREDIT
    assert reward.components["fraction_correct"] == pytest.approx(1 - 1 / len(p.answer))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_people": 1}, "option 'min_people' must be an integer from 2 to 8"),
        ({"max_people": 9}, "option 'max_people' must be an integer from 2 to 8"),
        (
            {"min_people": 5, "max_people": 3},
            "option 'min_people' \\(5\\) must not exceed 'max_people' \\(3\\)",
        ),
    ],
)
def test_bad_options_say_what_is_allowed(options: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        knights_knaves.KnightsKnaves(**options)
