"""The ``reasoning_gym`` task: any procedural dataset of the reasoning-gym library, scored by its own verifier.

reasoning-gym (``pip install 'echorl[reasoning-gym]'``, an optional extra) has about a hundred
generators of verifiable problems — ``leg_counting``, ``basic_arithmetic``, ``sudoku``,
``knights_knaves``, ``arc_1d``, ... — each with its own settings and its own ``score_answer``. The library
is imported only when the task is built, so Echo without it imports, and asking for the task says what
to install.

Options (``spec.task.options``):

* ``dataset`` (required): the reasoning-gym dataset's name; ``composite`` mixes several.
* ``config``: that dataset's own settings — exactly the keyword arguments of
  ``reasoning_gym.create_dataset(dataset, **config)``, i.e. the fields of its ``*Config`` dataclass —
  including ``seed`` (default 0 here; reasoning-gym's own default is a random one) and ``size`` (default
  10,000). Items ``0 .. size-1`` of the dataset built with that seed are the task's problems. A
  ``composite`` takes ``datasets: [{name, weight, config}]``, as in reasoning-gym's YAML files.

Problems and splits. A problem is held out iff the stable hash of its question says so
(:func:`.splits.split_of`), as for every built-in task: a property of the problem alone, so the train
and held-out streams never share a problem for any seed or config, and a question never changes sides.
(Splitting by dataset seed would not do: most generators draw item ``i`` from ``Random(seed + i)``, so
the items of seed 1 are those of seed 0 shifted by one.) A stream walks the items in a fresh shuffle per
epoch, seeded by (split, seed), generating each when it is reached and keeping those of its split; so a
held-out problem costs about ten generated items. Six generators (``isomorphic_strings``,
``knight_swap``, ``list_functions``, ``polynomial_multiplication``, ``ransom_note``, ``word_ladder``, in
reasoning-gym 0.1.25) iterate over Python sets and give other items in a process with another
``PYTHONHASHSEED``; the splits stay disjoint, but the streams are only reproducible within a process.

Prompt: the item's question, then a line asking for the final answer between ``<answer>`` and
``</answer>`` — what reasoning-gym's ``extract_answer`` reads and its own system prompts ask for.

Reward: the dataset's ``score_answer(extract_answer(completion), entry)`` — ``None`` when there are no
answer tags, as in reasoning-gym's own evaluation — clipped to [0, 1]. reasoning-gym's partial credit
is kept as it is (e.g. word_sorting's credit for a list one word short); Echo's 0.1
format credit is not added. Components: ``format`` (answer tags found), ``correct`` (scored 1). The
problem's ``answer`` is the item's reference answer (None for datasets that accept any valid solution,
such as ``rush_hour``: they have no reference completion) and ``meta["entry"]`` the item itself, which
``score_answer`` reads. Echo keeps problems in memory and pickles them to its scoring processes, so the
item's types survive; a JSON round trip turns its tuples into lists, which ``arc_agi``'s and ``rearc``'s
scorers do not accept.

Safety, for model text. Some scorers hand the answer to sympy's ``parse_expr`` or to ``Decimal``; a
completion can make them run for hours. So: only the first 100,000 characters are read; an answer
longer than 10,000 characters (or twice the reference's length) is refused unscored, as is one, other
than the reference, holding a decimal exponent of six or more digits (``1e999999``: turning it into an
integer is native code that no timeout interrupts); ``score_answer`` runs inside
:func:`.limits.deadline`; any exception it raises scores 0. Where a signal cannot reach (native code,
other threads) the coordinator's scoring processes are the bound (:mod:`echo_runtime.coordinator.scoring`).
Some scorers ``eval`` the answer, directly or through ``parse_expr``, so a completion would run as Python
in the process that scores it: those datasets (:data:`CODE_EVALUATING`) are refused, in a composite
too (``docs/trust.md``).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
import math
import random
import re
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

from echo_runtime.tasks import base, limits, splits

NAME = "reasoning_gym"
EXTRA = "reasoning-gym"
DEFAULT_SEED = 0
DEFAULT_SIZE = 10_000
MAX_SIZE = 1_000_000
"""Most items a task may hold: a stream shuffles the list of their indices every epoch."""
INSTRUCTION = "Put your final answer, and nothing else, between <answer> and </answer> tags."
EXAMPLES = ("leg_counting", "basic_arithmetic", "word_sorting", "knights_knaves", "sudoku", "arc_1d")
"""Dataset names an error message offers."""

CODE_EVALUATING = frozenset(
    {
        "binary_matrix", "n_queens", "spiral_matrix", "string_insertion",  # eval() of the answer
        "countdown", "puzzle24", "polynomial_multiplication", "simple_integration",  # sympy parse_expr
        "intermediate_integration",
    }
)  # fmt: skip
"""Datasets whose scorer (reasoning-gym 0.1.25) runs the answer as Python: a completion
``open('/tmp/x', 'w').close()`` created the file. A worker's text would run as code in the coordinator's
scoring process, so these are refused (docs/trust.md). Echo's own ``arithmetic`` task has countdown."""

_MAX_TEXT = 100_000
_MAX_ANSWER = 10_000
_CLOSE = "</answer>"
_HUGE_EXPONENT = re.compile(r"(?<![0-9A-Za-z_])[0-9]*\.?[0-9]+[eE][+-]?0*[1-9][0-9]{5,}")
_log = logging.getLogger(__name__)


class ReasoningGym:
    """One reasoning-gym dataset as an Echo task; see the module docstring."""

    name = NAME

    def __init__(self, *, dataset: str | None = None, config: Mapping[str, Any] | None = None) -> None:
        library = _library()
        self._extract = library.utils.extract_answer
        known = sorted(library.factory.DATASETS)
        self.dataset = _dataset_name(dataset, known)
        settings = _config(self.dataset, config, library, known)
        self.seed: int = settings["seed"]
        self.size: int = settings["size"]
        try:
            self._source = library.create_dataset(self.dataset, **settings)
            first = self._source[0]
        except Exception as exc:  # reasoning-gym checks its settings with assert and its own errors
            raise ValueError(
                f"{NAME}: option 'config' for dataset {self.dataset!r}: reasoning-gym refused it: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(first, Mapping) or not isinstance(first.get("question"), str):
            raise ValueError(f"{NAME}: dataset {self.dataset!r} gives items without a text 'question'")

    def prompts(self, split: base.Split, seed: int) -> Iterator[base.Problem]:
        split = splits.check_split(split)
        rand = splits.rng(f"{NAME}/{self.dataset}", split, splits.check_seed(seed))
        return self._walk(split, rand)

    def _walk(self, split: base.Split, rand: random.Random) -> Iterator[base.Problem]:
        while True:
            order = list(range(self.size))
            rand.shuffle(order)
            kept = 0
            for index in order:
                problem = self._problem(index)
                if problem is not None and problem.meta["split"] == split:
                    kept += 1
                    yield problem
            if not kept:
                raise ValueError(
                    f"{NAME}: none of the {self.size} items of {self.dataset!r} is a {split} problem; "
                    f"raise config.size"
                )

    def _problem(self, index: int) -> base.Problem | None:
        try:
            item = self._source[index]
            question = item["question"]
        except Exception as exc:  # a generator bug for one index: skip the item, say so
            _log.warning("%s: %s item %d failed: %s: %s", NAME, self.dataset, index, type(exc).__name__, exc)
            return None
        if not isinstance(question, str):
            return None
        answer = item.get("answer")
        meta = {"split": splits.split_of(question), "dataset": self.dataset, "index": index, "entry": item}
        prompt = f"{question.rstrip()}\n\n{INSTRUCTION}"
        return base.Problem(splits.problem_id(NAME, question), prompt, answer, meta)

    def score(self, problem: base.Problem, completion: str) -> base.Reward:
        entry = problem.meta.get("entry")
        if not isinstance(entry, Mapping):
            return base.Reward(0.0, {"format": 0.0, "correct": 0.0}, "not a reasoning_gym problem (no entry)")
        answer = extract(completion, self._extract)
        found = 1.0 if answer is not None else 0.0
        refusal = _refusal(answer, problem.answer)
        if refusal:
            return base.Reward(0.0, {"format": found, "correct": 0.0}, refusal)
        try:
            with limits.deadline(limits.VERIFIER_SECONDS):
                raw = self._source.score_answer(answer, entry)
        except limits.Overrun:
            reason = f"reasoning-gym's verifier ran past {limits.VERIFIER_SECONDS:g}s"
            return base.Reward(0.0, {"format": found, "correct": 0.0}, reason)
        except Exception as exc:  # the library's code on untrusted text: any failure is a 0
            reason = f"reasoning-gym's verifier raised {type(exc).__name__}: {str(exc)[:80]}"
            return base.Reward(0.0, {"format": found, "correct": 0.0}, reason)
        value = _unit(raw)
        components = {"format": found, "correct": 1.0 if value == 1.0 else 0.0}
        if value == 1.0:
            return base.Reward(1.0, components)
        if answer is None:
            reason = "no <answer>...</answer> in the completion"
        else:
            expected = "" if problem.answer is None else f", expected {str(problem.answer)[:40]!r}"
            reason = f"reasoning-gym scored {answer[:40]!r} {value:g}{expected}"
        return base.Reward(value, components, reason)

    def reference(self, problem: base.Problem) -> str:
        if problem.answer is None:
            raise ValueError(
                f"{NAME}: dataset {self.dataset!r} has no reference answer for its problems (its verifier "
                f"accepts any valid solution), so there is no reference completion"
            )
        return f"<answer>{problem.answer}</answer>"


def _library() -> SimpleNamespace:
    """reasoning-gym's modules this task uses, or a ValueError naming the extra to install."""
    package = limits.require("reasoning_gym", EXTRA, f"the {NAME} task")
    parts = {
        name: importlib.import_module(f"reasoning_gym.{name}") for name in ("factory", "utils", "composite")
    }
    return SimpleNamespace(create_dataset=package.create_dataset, **parts)


def extract(completion: str, extract_answer: Any) -> str | None:
    """reasoning-gym's ``extract_answer`` (the last ``<answer>…</answer>``) on the completion's first
    100,000 characters, cut after the last closing tag: with no closing tag after them, its non-greedy
    pattern would rescan the rest of the text from every opening tag."""
    text = completion[:_MAX_TEXT]
    end = text.rfind(_CLOSE)
    if end < 0:
        return None
    found = extract_answer(text[: end + len(_CLOSE)])
    return found if isinstance(found, str) else None


def _refusal(answer: str | None, reference: Any) -> str:
    """Why an answer is not worth scoring (see the module docstring), or ``""``."""
    if answer is None or answer == reference:
        return ""
    limit = max(_MAX_ANSWER, 2 * len(str(reference)))
    if len(answer) > limit:
        return f"the answer is {len(answer)} characters long, more than {limit}"
    if _HUGE_EXPONENT.search(answer):
        return "the answer holds a number with an exponent of six or more digits"
    return ""


def _unit(value: Any) -> float:
    """A scorer's value as a float in [0, 1]; anything else (None, NaN, text) is 0."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return min(1.0, max(0.0, number)) if math.isfinite(number) else 0.0


def _dataset_name(dataset: object, known: list[str]) -> str:
    if dataset is None:
        raise ValueError(
            f"{NAME}: option 'dataset' is required: the name of a reasoning-gym dataset, e.g. "
            f"{', '.join(EXAMPLES)} ({len(known)} in all)"
        )
    if isinstance(dataset, str) and dataset in CODE_EVALUATING:
        raise ValueError(_unsafe(dataset, "option 'dataset'"))
    if not isinstance(dataset, str) or dataset not in known:
        close = difflib.get_close_matches(str(dataset), known, n=3)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ValueError(
            f"{NAME}: option 'dataset': unknown reasoning-gym dataset {dataset!r}; {hint}it has {len(known)} "
            f"datasets, e.g. {', '.join(EXAMPLES)} (all: reasoning_gym.factory.DATASETS)"
        )
    return dataset


def _unsafe(dataset: str, where: str) -> str:
    return (
        f"{NAME}: {where}: dataset {dataset!r} is refused: its scorer runs the answer as Python (eval or "
        "sympy's parse_expr), so a worker's completion would run as code in the coordinator; refused "
        f"datasets: {', '.join(sorted(CODE_EVALUATING))} (for countdown, Echo's own arithmetic task)"
    )


def _fields(config_class: Any) -> list[str]:
    return (
        [f.name for f in dataclasses.fields(config_class)] if dataclasses.is_dataclass(config_class) else []
    )


def _config(dataset: str, config: object, library: Any, known: list[str]) -> dict[str, Any]:
    """The keyword arguments for ``create_dataset``: ``config`` checked against the dataset's fields, with
    Echo's seed and size defaults (a composite's datasets as reasoning-gym's ``DatasetSpec``)."""
    where = f"{NAME}: option 'config' for dataset {dataset!r}"
    if config is None:
        config = {}
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise ValueError(f"{where}: must be a mapping of that dataset's settings, got {config!r:.80}")
    allowed = _fields(library.factory.DATASETS[dataset][1])
    unknown = sorted(k for k in config if k not in allowed)
    if unknown:
        raise ValueError(
            f"{where}: unknown setting(s) {', '.join(unknown)}; its settings: {', '.join(allowed)}"
        )
    settings = dict(config)
    seed = settings.setdefault("seed", DEFAULT_SEED)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"{where}: seed must be a non-negative integer, got {seed!r}")
    size = settings.setdefault("size", DEFAULT_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SIZE:
        raise ValueError(f"{where}: size must be an integer from 1 to {MAX_SIZE}, got {size!r}")
    if dataset == "composite":
        settings["datasets"] = _composite(settings.get("datasets"), where, library, known)
    return settings


def _composite(specs: object, where: str, library: Any, known: list[str]) -> list[Any]:
    if not isinstance(specs, list) or not specs:
        raise ValueError(f"{where}: datasets must be a non-empty list of {{name, weight, config}}")
    out = []
    for index, spec in enumerate(specs):
        at = f"{where}: datasets[{index}]"
        if not isinstance(spec, Mapping) or set(spec) - {"name", "weight", "config"} or "name" not in spec:
            raise ValueError(
                f"{at} must be a mapping with name, weight (default 1) and config, got {spec!r:.80}"
            )
        name = spec["name"]
        if isinstance(name, str) and name in CODE_EVALUATING:
            raise ValueError(_unsafe(name, f"{at}: name"))
        if not isinstance(name, str) or name not in known or name == "composite":
            raise ValueError(f"{at}: unknown reasoning-gym dataset {name!r}; e.g. {', '.join(EXAMPLES)}")
        weight = spec.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise ValueError(f"{at}: weight must be a positive number, got {weight!r}")
        sub = spec.get("config") or {}
        if not isinstance(sub, Mapping):
            raise ValueError(f"{at}: config must be a mapping, got {sub!r:.80}")
        allowed = _fields(library.factory.DATASETS[name][1])
        unknown = sorted(str(k) for k in sub if k not in allowed)
        if unknown:
            raise ValueError(
                f"{at}: unknown setting(s) {', '.join(unknown)}; its settings: {', '.join(allowed)}"
            )
        out.append(library.composite.DatasetSpec(name=name, weight=float(weight), config=dict(sub)))
    return out
