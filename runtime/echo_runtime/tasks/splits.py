"""Deterministic problem streams whose train and held-out halves never meet.

Every task names each problem by a canonical *key* (a text that fixes the problem: its prompt, or the
question of a file-backed problem). A problem is held out iff ``stable_hash(key) % HELDOUT_MODULUS == 0``.
That is a property of the problem alone, so for every seed and every option setting the ``train`` and
``heldout`` streams are disjoint, and a problem never changes sides between runs, machines or Python
versions (blake2b, not the builtin ``hash()``, which is salted per process).

:func:`stream` turns a task's random *draw* into such a stream: it draws candidates from a
:class:`random.Random` seeded by (task, split, seed), keeps those whose key falls in the split, and lets the
task finish (solve, check) only the kept ones, so expensive checks are never spent on the other split.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from typing import TypeVar

from echo_runtime.tasks import base

HELDOUT_MODULUS = 10
"""One problem in this many (by key hash) is held out."""

MAX_MISSES = 100_000
"""Consecutive rejected draws after which a stream gives up: the options leave (almost) no problems."""

_Candidate = TypeVar("_Candidate")


def stable_hash(key: str) -> int:
    """A 64-bit hash of ``key`` that is the same in every process and on every machine."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")


def split_of(key: str) -> base.Split:
    """The split a problem with this key belongs to."""
    return "heldout" if stable_hash(key) % HELDOUT_MODULUS == 0 else "train"


def problem_id(task: str, key: str) -> str:
    """A short stable id: the task name and the key's hash."""
    return f"{task}-{stable_hash(key):016x}"


def check_split(split: object) -> base.Split:
    """``split`` itself, or a ValueError saying what is allowed."""
    if split == "train":
        return "train"
    if split == "heldout":
        return "heldout"
    raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")


def check_seed(seed: object) -> int:
    """``seed`` itself, or a ValueError: seeds are plain integers so that streams are reproducible."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    return seed


def rng(task: str, split: base.Split, seed: int) -> random.Random:
    """The random source of one stream."""
    # A str seed goes through sha512 inside random.seed, so it is independent of PYTHONHASHSEED.
    return random.Random(f"echo-tasks/{task}/{split}/{seed}")


def stream(
    task: str,
    split: base.Split,
    seed: int,
    draw: Callable[[random.Random], _Candidate | None],
    key: Callable[[_Candidate], str],
    finish: Callable[[_Candidate, base.Split], base.Problem | None],
) -> Iterator[base.Problem]:
    """An endless stream of the problems of ``split``.

    ``draw`` proposes a candidate (or None to reject at once); ``key`` names it; ``finish`` builds the
    problem, or returns None to reject it (unsolvable, ambiguous). Arguments are checked now, not at the
    first ``next()``, so a bad split fails where it is passed.
    """
    split = check_split(split)
    rand = rng(task, split, check_seed(seed))

    def problems() -> Iterator[base.Problem]:
        misses = 0
        while True:
            candidate = draw(rand)
            if candidate is not None and split_of(key(candidate)) == split:
                problem = finish(candidate, split)
                if problem is not None:
                    misses = 0
                    yield problem
                    continue
            misses += 1
            if misses >= MAX_MISSES:
                raise RuntimeError(
                    f"{task}: no {split} problem in {MAX_MISSES} draws; the options leave too few problems"
                )

    return problems()
