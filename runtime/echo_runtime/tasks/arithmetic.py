"""Integer arithmetic sized for a CPU demo: a tiny transformer can learn it with RL in minutes.

Prompt and answer are short and regular. The prompt is the expression and an equals sign, ``12+7=``; the
completion is the value, ``19`` (the model's end-of-sequence token ends it). Precedence is the usual one
(``2+3*4=`` is 14). Results are never negative: draws with a negative value are rejected, so the answer
alphabet is just digits.

Scoring (see :mod:`echo_runtime.tasks.scoring`): the answer is the completion's final number
(:func:`echo_runtime.tasks.answers.extract`: the last number in a ``\\boxed{}``, else the last number
of the text), so the tiny model's bare ``19`` and a chat model's ``12 + 7 = 19.`` both read as 19. It
scores 1 if it equals the value, 0.1 if it is a number but wrong, 0 if there is no number.

Options: ``digits`` (1–4, default 2) bounds every operand below ``10**digits``; ``ops`` is a non-empty
subset of ``"+-*"`` (default ``"+-"``), each operator drawn uniformly; ``operands`` (2–3, default 2).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from echo_runtime.tasks import answers, base, options, scoring, splits

NAME = "arithmetic"


def evaluate(operands: list[int], ops: str) -> int:
    """The value of ``operands[0] ops[0] operands[1] ...`` with ``*`` binding tighter than ``+``/``-``."""
    terms = [operands[0]]
    signs = [1]
    for op, operand in zip(ops, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= operand
        else:
            terms.append(operand)
            signs.append(1 if op == "+" else -1)
    return sum(sign * term for sign, term in zip(signs, terms, strict=True))


class Arithmetic:
    """``a+b=`` style problems; see the module docstring."""

    name = NAME

    def __init__(self, *, digits: int = 2, ops: str = "+-", operands: int = 2) -> None:
        self.digits = options.integer(NAME, "digits", digits, 1, 4)
        self.ops = options.characters(NAME, "ops", ops, "+-*")
        self.operands = options.integer(NAME, "operands", operands, 2, 3)

    def _draw(self, rand: random.Random) -> tuple[str, int] | None:
        numbers = [rand.randrange(10**self.digits) for _ in range(self.operands)]
        ops = "".join(rand.choice(self.ops) for _ in range(self.operands - 1))
        value = evaluate(numbers, ops)
        if value < 0:
            return None
        text = str(numbers[0]) + "".join(op + str(n) for op, n in zip(ops, numbers[1:], strict=True))
        return text + "=", value

    def _finish(self, candidate: tuple[str, int], split: base.Split) -> base.Problem:
        prompt, value = candidate
        return base.Problem(splits.problem_id(NAME, prompt), prompt, value, {"split": split})

    def prompts(self, split: base.Split, seed: int) -> Iterator[base.Problem]:
        return splits.stream(NAME, split, seed, self._draw, lambda c: c[0], self._finish)

    def score(self, problem: base.Problem, completion: str) -> base.Reward:
        value = answers.extract(completion)
        if value is None:
            return scoring.graded(False, False, f"no number in the completion: {completion.strip()[:40]!r}")
        correct = value == int(problem.answer)
        return scoring.graded(True, correct, f"expected {problem.answer}, got {answers.canonical(value)}")

    def reference(self, problem: base.Problem) -> str:
        return str(problem.answer)
