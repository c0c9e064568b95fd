"""Knights-and-Knaves puzzles with exactly one solution.

Knights always tell the truth, knaves always lie; each of 2–8 inhabitants says one thing about who is
what (``Bob is a knave.``, ``If I am a knight, then Carol is a knave.``, ``Alice and I are the same
kind.``). A puzzle is kept only if exactly one knight/knave assignment is consistent with every
statement: the generator checks all 2**n assignments at once, each statement's truth table a 2**n-bit
integer, and redraws otherwise.

Answer format, stated in the prompt: ``Name: knight`` or ``Name: knave`` for each person, e.g.
``Alice: knave, Bob: knight``. The parser takes, for every person, the *last* mention of the name
followed by knight/knave (``Alice is a knave``, ``alice = Knave``, ``**Eve** is a **knight**``,
``Eve must be a knight`` and any order also parse; ``Eve is not a knight`` does not), so a reasoning
trace before the final answer is fine. Scoring: 1 iff every person is right; 0.1 if every
person got a role but some are wrong; 0 if anyone is missing. Components: ``format``, ``correct``,
``fraction_correct`` (of all people; missing ones count as wrong).

Options: ``min_people`` and ``max_people`` (2–8, defaults 2 and 5); the size is drawn uniformly.
The problem's ``answer`` is ``{name: "knight" | "knave"}``; ``meta["statements"]`` holds the statements
in structured form, so a checker need not parse English.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from echo_runtime.tasks import base, options, scoring, splits

NAME = "knights_knaves"
NAMES = (
    "Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy",
    "Kevin", "Laura", "Mike", "Nina", "Oscar", "Paul", "Quinn", "Rita", "Sam", "Tina",
)  # fmt: skip
KINDS = ("is", "and", "or", "if", "iff", "same", "different")
"""Statement shapes: one claim; two claims joined by and/or/if-then/iff; two people same/different kind."""


@dataclasses.dataclass(frozen=True)
class Statement:
    """What ``speaker`` says, about persons ``a`` and ``b`` (indices; ``b`` unused for ``is``).

    ``a_knight``/``b_knight`` are the claimed roles; ``same``/``different`` ignore them.
    """

    speaker: int
    kind: str
    a: int
    a_knight: bool
    b: int = -1
    b_knight: bool = True


def _clause(statement: Statement, person: int, knight: bool, names: Sequence[str]) -> str:
    role = "a knight" if knight else "a knave"
    return f"I am {role}" if person == statement.speaker else f"{names[person]} is {role}"


def render(statement: Statement, names: Sequence[str]) -> str:
    """The statement in English, as its speaker says it."""
    s = statement
    if s.kind in ("same", "different"):
        a, b = (s.b, s.a) if s.a == s.speaker else (s.a, s.b)
        pair = f"{names[a]} and I" if b == s.speaker else f"{names[a]} and {names[b]}"
        return f"{pair} are {'the same kind' if s.kind == 'same' else 'different kinds'}."
    first = _clause(s, s.a, s.a_knight, names)
    if s.kind == "is":
        return f"{first}."
    second = _clause(s, s.b, s.b_knight, names)
    if s.kind == "if":
        return f"If {first}, then {second}."
    joiner = {"and": "and", "or": "or", "iff": "if and only if"}[s.kind]
    return f"{first} {joiner} {second}."


def solutions(statements: Sequence[Statement], people: int) -> list[tuple[bool, ...]]:
    """Every assignment (``True`` = knight, by person index) consistent with all statements."""
    # Bit m of a truth table is the value under assignment m, where person i is a knight iff bit i of m.
    size = 1 << people
    full = (1 << size) - 1
    knight = _knight_tables(people)

    def claim(person: int, is_knight: bool) -> int:
        return knight[person] if is_knight else full ^ knight[person]

    consistent = full
    for s in statements:
        if s.kind in ("same", "different"):
            differ = knight[s.a] ^ knight[s.b]
            truth = differ if s.kind == "different" else full ^ differ
        else:
            left = claim(s.a, s.a_knight)
            right = 0 if s.kind == "is" else claim(s.b, s.b_knight)
            truth = _connect(s.kind, left, right, full)
        # A knight's statement is true and a knave's false: speaker-is-knight iff statement.
        consistent &= full ^ (knight[s.speaker] ^ truth)
    return [tuple(bool(m >> i & 1) for i in range(people)) for m in range(size) if consistent >> m & 1]


@functools.cache
def _knight_tables(people: int) -> tuple[int, ...]:
    """Per person, the truth table of "this person is a knight"."""
    size = 1 << people
    return tuple(sum(1 << m for m in range(size) if m >> i & 1) for i in range(people))


def _connect(kind: str, left: int, right: int, full: int) -> int:
    if kind == "is":
        return left
    if kind == "and":
        return left & right
    if kind == "or":
        return left | right
    if kind == "if":
        return (full ^ left) | right
    return full ^ (left ^ right)  # iff


class KnightsKnaves:
    """Knights-and-Knaves puzzles; see the module docstring."""

    name = NAME

    def __init__(self, *, min_people: int = 2, max_people: int = 5) -> None:
        self.min_people = options.integer(NAME, "min_people", min_people, 2, 8)
        self.max_people = options.integer(NAME, "max_people", max_people, 2, 8)
        options.ordered(NAME, "min_people", self.min_people, "max_people", self.max_people)

    def _draw(self, rand: random.Random) -> tuple[tuple[str, ...], tuple[Statement, ...], str]:
        people = rand.randint(self.min_people, self.max_people)
        names = tuple(rand.sample(NAMES, people))
        statements = tuple(_random_statement(rand, speaker, people) for speaker in range(people))
        return names, statements, _prompt(names, statements)

    def _finish(
        self, candidate: tuple[tuple[str, ...], tuple[Statement, ...], str], split: base.Split
    ) -> base.Problem | None:
        names, statements, prompt = candidate
        found = solutions(statements, len(names))
        if len(found) != 1:
            return None
        answer = {n: "knight" if k else "knave" for n, k in zip(names, found[0], strict=True)}
        meta = {"split": split, "people": list(names), "statements": [_as_json(s, names) for s in statements]}
        return base.Problem(splits.problem_id(NAME, prompt), prompt, answer, meta)

    def prompts(self, split: base.Split, seed: int) -> Iterator[base.Problem]:
        return splits.stream(NAME, split, seed, self._draw, lambda c: c[2], self._finish)

    def score(self, problem: base.Problem, completion: str) -> base.Reward:
        answer: Mapping[str, str] = problem.answer
        claimed = parse(completion, list(answer))
        missing = [n for n in answer if n not in claimed]
        wrong = [n for n in answer if n in claimed and claimed[n] != answer[n]]
        fraction = (len(answer) - len(missing) - len(wrong)) / len(answer)
        reason = f"no role for {', '.join(missing)}" if missing else f"wrong: {', '.join(wrong)}"
        return scoring.graded(not missing, not wrong, reason, fraction_correct=fraction)

    def reference(self, problem: base.Problem) -> str:
        return ", ".join(f"{n}: {role}" for n, role in problem.answer.items())


def parse(completion: str, names: Sequence[str]) -> dict[str, str]:
    """The role the completion gives each of ``names`` (last mention wins); absent names are left out."""
    roles: dict[str, str] = {}
    for name in names:
        pattern = (
            rf"\b{re.escape(name)}\b[*_]*\s*(?:[:=\-\u2013\u2014]|is|was|must\s+be|would\s+be)?\s*"
            rf"(?:(?:an?|the)\s+)?[*_]*(knight|knave)s?\b"
        )
        matches = re.findall(pattern, completion, flags=re.IGNORECASE)
        if matches:
            roles[name] = matches[-1].lower()
    return roles


def _random_statement(rand: random.Random, speaker: int, people: int) -> Statement:
    others = [p for p in range(people) if p != speaker]
    kind = rand.choice(KINDS if people > 2 else ("is", "and", "or", "if", "iff"))
    if kind == "is":
        # A bare claim about oneself carries no information ("I am a knight") or is a paradox.
        return Statement(speaker, kind, rand.choice(others), rand.random() < 0.5)
    if kind in ("same", "different"):
        a, b = rand.sample(range(people), 2)
        if speaker not in (a, b) and rand.random() < 0.5:
            a = speaker
        return Statement(speaker, kind, a, True, b, True)
    a, b = rand.sample(range(people), 2)
    return Statement(speaker, kind, a, rand.random() < 0.5, b, rand.random() < 0.5)


def _prompt(names: Sequence[str], statements: Sequence[Statement]) -> str:
    listed = ", ".join(names[:-1]) + " and " + names[-1]
    lines = [
        "Knights always tell the truth and knaves always lie.",
        f"{listed} each say one thing.",
        *(f'{names[s.speaker]} says: "{render(s, names)}"' for s in statements),
        "Who is a knight and who is a knave?",
        'Answer with "Name: knight" or "Name: knave" for each person, separated by commas.',
    ]
    return "\n".join(lines) + "\n"


def _as_json(s: Statement, names: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"speaker": names[s.speaker], "kind": s.kind, "a": names[s.a]}
    if s.kind not in ("same", "different"):
        out["a_knight"] = s.a_knight
    if s.kind != "is":
        out["b"] = names[s.b]
    if s.kind not in ("is", "same", "different"):
        out["b_knight"] = s.b_knight
    return out
