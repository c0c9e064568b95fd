"""Math problems with numeric answers, checked exactly: built-in word problems, or a local JSONL file.

Without options, problems come from a deterministic generator of short word problems (ten templates:
sums, differences, products, equal shares, fractions of a pizza, discounts, speeds, change, averages,
temperatures), whose answers are integers, terminating decimals or fractions, sometimes negative. With
``path``, problems come from a JSON Lines file, one ``{"question": ..., "answer": ...}`` object a line
(blank lines skipped); the answer is a number or a text whose final number is the answer (so GSM8K's
``... #### 72`` works). A question is held out iff its stable hash says so (:mod:`.splits`), so a file is
split the same way on every machine; each stream walks its split in a fresh seeded shuffle per epoch.
A missing file, a bad line or an answer without a number is a ValueError naming the file and line.

The prompt is the question and the line ``Put the final answer in \\boxed{}.``; the reference is
``\\boxed{<answer>}``. Scoring (:mod:`.answers`): the answer is the last ``\\boxed{...}`` or else the
last number on the last non-empty line; it scores 1 if it equals the expected value as a fraction
(``3/4``, ``0.75`` and ``\\frac{3}{4}`` are equal), 0.1 if it is a number but wrong, 0 if there is none.
Components: ``format``, ``correct``, ``boxed`` (the answer was boxed).

The problem's ``answer`` is the expected value as exact text (``19``, ``29.75``, ``3/7``).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import random
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

from echo_runtime.tasks import answers, base, scoring, splits

NAME = "math"
INSTRUCTION = "Put the final answer in \\boxed{}."
_PEOPLE = ("Ana", "Ben", "Chloe", "Dan", "Ella", "Finn", "Gina", "Hugo", "Iris", "Jack", "Kim", "Leo")
_ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "books", "shells", "cards")
_THINGS = ("jacket", "lamp", "bicycle", "backpack", "chair", "kettle")


def _more(r: random.Random) -> tuple[str, Fraction]:
    who, item, a, b = r.choice(_PEOPLE), r.choice(_ITEMS), r.randint(2, 60), r.randint(2, 40)
    return f"{who} has {a} {item} and buys {b} more. How many {item} does {who} have now?", Fraction(a + b)


def _left(r: random.Random) -> tuple[str, Fraction]:
    who, item, a = r.choice(_PEOPLE), r.choice(_ITEMS), r.randint(10, 90)
    b = r.randint(1, a - 1)
    question = f"{who} had {a} {item} and gave {b} of them away. How many {item} does {who} have left?"
    return question, Fraction(a - b)


def _groups(r: random.Random) -> tuple[str, Fraction]:
    item, a, b = r.choice(_ITEMS), r.randint(2, 12), r.randint(2, 12)
    return f"Each box holds {a} {item}. How many {item} are in {b} boxes?", Fraction(a * b)


def _share(r: random.Random) -> tuple[str, Fraction]:
    who, item, each, friends = r.choice(_PEOPLE), r.choice(_ITEMS), r.randint(2, 12), r.randint(2, 9)
    question = (
        f"{who} shares {each * friends} {item} equally among {friends} friends. "
        f"How many {item} does each friend get?"
    )
    return question, Fraction(each)


def _pizza(r: random.Random) -> tuple[str, Fraction]:
    who, pizzas, friends = r.choice(_PEOPLE), r.randint(1, 7), r.randint(2, 9)
    question = f"{who} shares {pizzas} pizzas equally among {friends} friends. How much pizza does each get?"
    return question, Fraction(pizzas, friends)


def _sale(r: random.Random) -> tuple[str, Fraction]:
    thing, price, off = r.choice(_THINGS), r.randint(4, 200), r.choice((10, 20, 25, 50))
    question = f"A {thing} costs {price} dollars and is on sale for {off}% off. What is the sale price?"
    return question, Fraction(price * (100 - off), 100)


def _speed(r: random.Random) -> tuple[str, Fraction]:
    speed, hours = r.randint(20, 90), r.randint(2, 5)
    question = f"A train travels {speed * hours} km in {hours} hours at a steady speed. How many km per hour?"
    return question, Fraction(speed)


def _change(r: random.Random) -> tuple[str, Fraction]:
    who, count, price = r.choice(_PEOPLE), r.randint(2, 6), r.randint(1, 9)
    bill = next(b for b in (20, 50, 100) if b > count * price)
    question = (
        f"{who} buys {count} notebooks at {price} dollars each and pays with a {bill}-dollar bill. "
        f"How many dollars of change does {who} get?"
    )
    return question, Fraction(bill - count * price)


def _average(r: random.Random) -> tuple[str, Fraction]:
    who, scores = r.choice(_PEOPLE), [r.randint(50, 100) for _ in range(3)]
    question = f"{who}'s test scores are {scores[0]}, {scores[1]} and {scores[2]}. What is the average score?"
    return question, Fraction(sum(scores), 3)


def _temperature(r: random.Random) -> tuple[str, Fraction]:
    start, drop = r.randint(-5, 15), r.randint(1, 20)
    question = (
        f"At noon the temperature was {start} degrees. By midnight it had fallen by {drop} degrees. "
        f"What was the temperature at midnight?"
    )
    return question, Fraction(start - drop)


TEMPLATES: tuple[Callable[[random.Random], tuple[str, Fraction]], ...] = (
    _more, _left, _groups, _share, _pizza, _sale, _speed, _change, _average, _temperature,
)  # fmt: skip


def load(path: str | os.PathLike[str]) -> list[tuple[str, Fraction, int]]:
    """The (question, answer, line number) entries of a JSONL file; a ValueError names file and line."""
    file = pathlib.Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{NAME}: problem file {str(file)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{NAME}: cannot read problem file {str(file)!r}: {error}") from None
    entries = []
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and friends, which splitlines breaks on.
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            question, answer = _entry(line, f"{file}:{number}")
            entries.append((question, answer, number))
    if not entries:
        raise ValueError(f"{NAME}: problem file {str(file)!r} has no problems")
    return entries


def _entry(line: str, where: str) -> tuple[str, Fraction]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON ({error.msg}, column {error.colno})") from None
    if not isinstance(record, dict) or "question" not in record or "answer" not in record:
        raise ValueError(f'{where}: expected an object with "question" and "answer", got {line.strip()[:80]}')
    question, answer = record["question"], _number(record["answer"])
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: question must be a non-empty string, got {question!r}")
    if answer is None:
        raise ValueError(f"{where}: answer {record['answer']!r} is not (and does not end in) a number")
    return question.strip(), answer


def _number(value: Any) -> Fraction | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        # repr, not the binary value: 0.1 in the file means 1/10.
        return Fraction(repr(value)) if math.isfinite(value) else None
    return answers.extract(value) if isinstance(value, str) else None


class MathWords:
    """Numeric-answer math problems; see the module docstring."""

    name = NAME

    def __init__(self, *, path: str | None = None) -> None:
        if path is not None and not isinstance(path, str | os.PathLike):
            raise ValueError(f"{NAME}: option 'path' must be the path of a JSONL file, got {path!r}")
        self.path = path
        self._entries = None if path is None else load(path)

    def prompts(self, split: base.Split, seed: int) -> Iterator[base.Problem]:
        if self._entries is None:
            return splits.stream(NAME, split, seed, _draw, lambda c: c[0], _problem)
        split = splits.check_split(split)
        rand = splits.rng(NAME, split, splits.check_seed(seed))
        source = str(self.path)
        mine = [
            _problem((q, a), split, {"source": source, "line": n})
            for q, a, n in self._entries
            if splits.split_of(q) == split
        ]
        if not mine:
            raise ValueError(
                f"{NAME}: problem file {source!r} has no {split} problems: its {len(self._entries)} "
                f"questions all hash to the other split; add questions"
            )
        return _epochs(mine, rand)

    def score(self, problem: base.Problem, completion: str) -> base.Reward:
        value = answers.extract(completion)
        boxed = 1.0 if answers.boxed(completion) is not None else 0.0
        if value is None:
            reason = "no final answer: neither a number in \\boxed{...} nor one on the last line"
            return scoring.graded(False, False, reason, boxed=boxed)
        correct = value == Fraction(str(problem.answer))
        reason = f"expected {problem.answer}, got {answers.canonical(value)}"
        return scoring.graded(True, correct, reason, boxed=boxed)

    def reference(self, problem: base.Problem) -> str:
        return f"\\boxed{{{problem.answer}}}"


def _draw(rand: random.Random) -> tuple[str, Fraction]:
    return rand.choice(TEMPLATES)(rand)


def _problem(
    candidate: tuple[str, Fraction], split: base.Split, extra: dict[str, Any] | None = None
) -> base.Problem:
    question, answer = candidate
    prompt = f"{question}\n{INSTRUCTION}\n"
    meta = {"split": split, **(extra or {})}
    return base.Problem(splits.problem_id(NAME, question), prompt, answers.canonical(answer), meta)


def _epochs(problems: list[base.Problem], rand: random.Random) -> Iterator[base.Problem]:
    while True:
        order = list(problems)
        rand.shuffle(order)
        yield from order
