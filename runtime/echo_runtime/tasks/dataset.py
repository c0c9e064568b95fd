"""The ``dataset`` task: a user's own prompts, answers and reward functions, as TRL and verl users bring them.

Settings are :class:`echo_runtime.spec.dataset.Dataset` (``spec.task.dataset`` of a job). Rows come from
JSONL, JSON, CSV or Parquet files or a ``datasets`` directory (:mod:`.tables`).

* **Prompt.** ``promptField`` (default ``prompt``) holds text or a list of chat messages (TRL's
  *conversational* format, verl's ``prompt`` column); ``messagesField`` instead holds a conversation whose
  messages before a final assistant message are the prompt. Dotted paths reach nested fields. An
  ``instruction`` is appended to text prompts (and to the last user message of chat prompts) on a line
  of its own. The prompt then goes through the model's chat template like any task's
  (:mod:`echo_runtime.models.prompts`).
* **Answer.** ``answerField`` (default ``answer``; verl keeps it at ``reward_model.ground_truth``), or
  the final assistant message of ``messagesField``.
* **Held-out split.** A row is held out iff the stable hash of its key (``idField``, else its prompt)
  falls in the lowest ``heldoutFraction`` of the hash space — the same rows on every machine, and the
  same prompt always on one side. Or every row of ``heldoutPath`` / ``heldoutSplit`` is held out and every
  row of ``path`` trains. Streams walk their split in a fresh seeded shuffle per epoch.
* **Reward** — the weighted mean of the checker's score (weight ``checkerWeight``) and of each reward
  function's (its ``weight``), every value clipped to [0, 1]; a function may return None for a
  completion it does not judge (TRL's convention), which leaves it out of that mean.
  Checkers: ``Math`` — the last number in the last ``\\boxed{}``, else the last number of the completion,
  equal to the answer's as exact fractions (``3/4`` = ``0.75`` = ``\\frac{3}{4}``); a non-numeric answer
  must equal the boxed text after normalisation (spaces, ``\\left``/``\\right``, ``\\dfrac``); ``Numeric``
  — the last number only; ``Exact`` — the boxed text, else the whole completion, equal to the answer
  after trimming whitespace; ``MathVerify`` — Hugging Face's math-verify compares the answer it parses
  out of the completion with the reference symbolically (an optional extra, :mod:`.mathverify`). Each
  scores 1 when right, 0.1 when it found an answer that is wrong, else 0 (the project's convention,
  :mod:`.scoring`); components ``format`` and ``correct`` are the checker's.
* **Reward functions** have TRL's signature ``f(prompts, completions, **columns) -> list[float | None]``:
  ``prompts`` the row's prompt (text, or the messages), ``completions`` the completion (text, or
  ``[{"role": "assistant", "content": ...}]`` for a chat prompt), and every other column of the row as
  a keyword argument, each a list with one element per completion (one here: the verifier scores one
  completion at a time). A function without ``**kwargs`` gets only the columns it names. Its value
  appears as the component ``fn:<function>``.
* **Never raises while scoring**: a reward function that raises or returns something else than one
  number (or None) scores 0 for that completion, with the reason; the mistakes a file can hold are found
  at construction and named by file, row and field.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import math
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import pydantic

from echo_runtime.spec import dataset as dataset_spec
from echo_runtime.tasks import answers, base, mathverify, scoring, splits, tables

NAME = "dataset"
HASH_BUCKETS = 10_000
"""Resolution of ``heldoutFraction``: a row is held out iff ``stable_hash(key) % HASH_BUCKETS`` is below
``round(heldoutFraction * HASH_BUCKETS)``."""

_log = logging.getLogger(__name__)
_MAX_TEXT = 100_000
"""Longest completion the checkers read (the coordinator's limit is lower): bounds a verifier's work."""


def field(columns: Mapping[str, Any], path: str) -> Any:
    """The value at ``path`` in a row: a column name, or a dotted path into nested objects. KeyError if absent."""
    if path in columns:
        return columns[path]
    value: Any = columns
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value


def _number(value: Any) -> Fraction | None:
    """A reference answer's value: a JSON number, a text that is one number (``"3/4"``), or a GSM8K-style
    solution ending in ``#### <number>``; None for anything else (``"x^2 + 1"``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(repr(value)) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    if "####" in value:
        value = value.rpartition("####")[2]
    inside = answers.boxed(value)
    return answers.parse_number(inside if inside is not None else value)


_LATEX_NOISE = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\displaystyle|\s+|^\$+|\$+$")


def normalise(text: str) -> str:
    """Text of an answer for an exact comparison: LaTeX spacing and sizing dropped, ``\\dfrac`` = ``\\frac``."""
    out = _LATEX_NOISE.sub("", text.strip())
    out = out.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return out.rstrip(".")


def check(checker: str, completion: str, answer: Any) -> tuple[bool, bool, str]:
    """``(found, correct, reason)`` of a completion under a built-in checker; never raises."""
    text = completion[:_MAX_TEXT]
    if checker == "MathVerify":
        return mathverify.check(text, answer)
    if checker == "Exact":
        inside = answers.boxed(text)
        given = (inside if inside is not None else text).strip()
        expected = str(answer).strip()
        if not given:
            return False, False, "empty answer"
        return True, given == expected, f"expected {expected[:40]!r}, got {given[:40]!r}"
    expected_number = _number(answer)
    if checker == "Math" and expected_number is None:
        inside = answers.boxed(text)
        if inside is None:
            return False, False, "no \\boxed{...} answer"
        ok = normalise(inside) == normalise(str(answer))
        return True, ok, f"expected {str(answer)[:40]!r}, got {inside[:40]!r}"
    if expected_number is None:
        return False, False, f"the reference answer {str(answer)[:40]!r} is not a number"
    value = answers.extract(text) if checker == "Math" else answers.last_number(text)
    if value is None:
        return False, False, "no number in the completion"
    return (
        True,
        value == expected_number,
        f"expected {answers.canonical(expected_number)}, got {answers.canonical(value)}",
    )


def reference_of(checker: str, answer: Any) -> str:
    """A completion the checker scores 1."""
    if checker == "MathVerify":
        return mathverify.reference(answer)
    number = _number(answer)
    if checker == "Math":
        return f"\\boxed{{{answers.canonical(number) if number is not None else str(answer).strip()}}}"
    if checker == "Numeric":
        return answers.canonical(number) if number is not None else str(answer)
    return str(answer).strip()


class RewardCall:
    """One user reward function, imported once and called with TRL's signature."""

    def __init__(self, name: str, weight: float, where: str) -> None:
        module_name, _, function_name = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"{where}: cannot import module {module_name!r} of {name!r}: {exc}") from exc
        function = getattr(module, function_name, None)
        if not callable(function):
            raise ValueError(f"{where}: module {module_name!r} has no function {function_name!r}")
        self.name, self.weight, self.function = name, weight, function
        parameters: list[inspect.Parameter]
        try:
            parameters = list(inspect.signature(function).parameters.values())
        except (TypeError, ValueError):
            parameters = []
        self.takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters) or not parameters
        self.named = {p.name for p in parameters}

    def __call__(self, prompt: Any, completion: Any, columns: Mapping[str, Any]) -> tuple[float | None, str]:
        """``(value, reason)``: the value in [0, 1] (None if the function abstains); never raises."""
        kwargs = {k: [v] for k, v in columns.items() if self.takes_all or k in self.named}
        try:
            result = self.function(prompts=[prompt], completions=[completion], **kwargs)
            values = list(result)
        except Exception as exc:  # a user's function: any failure is this completion's 0
            _log.warning("reward function %s raised %s: %s", self.name, type(exc).__name__, exc)
            return 0.0, f"{self.name} raised {type(exc).__name__}: {str(exc)[:80]}"
        if len(values) != 1:
            return 0.0, f"{self.name} returned {len(values)} values for 1 completion"
        value = values[0]
        if value is None:
            return None, ""
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
            return 0.0, f"{self.name} returned {value!r:.40}, not a finite number"
        clipped = min(1.0, max(0.0, float(value)))
        return clipped, "" if clipped == float(
            value
        ) else f"{self.name} returned {value:g}, clipped to [0, 1]"


def _check_prompt(value: Any, where: str, field_name: str) -> Any:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{where}: field {field_name!r} is an empty prompt")
        return value
    if isinstance(value, Sequence) and value:
        for index, message in enumerate(value):
            ok = (
                isinstance(message, Mapping)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
            )
            if not ok:
                raise ValueError(
                    f"{where}: field {field_name!r} message {index} must be an object with text 'role' and "
                    f"'content', got {message!r:.80}"
                )
        return tuple({"role": m["role"], "content": m["content"]} for m in value)
    raise ValueError(
        f"{where}: field {field_name!r} must be text or a non-empty list of chat messages, got {value!r:.80}"
    )


class DatasetTask:
    """Problems from a user's data file; see the module docstring."""

    name = NAME

    def __init__(self, **options: Any) -> None:
        try:
            self.settings = dataset_spec.Dataset.model_validate(options)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"{NAME}: spec.task.dataset: {problems}") from None
        s = self.settings
        if s.checker == "MathVerify":
            mathverify.load()  # a missing extra is an error now, not at the first completion
        self.functions = [
            RewardCall(f.function, f.weight, f"spec.task.dataset.rewardFunctions[{i}]")
            for i, f in enumerate(s.reward_functions)
        ]
        main = tables.read(s.path, s.format, s.split)
        if s.heldout_path is not None or s.heldout_split is not None:
            held_source = s.heldout_path if s.heldout_path is not None else s.path
            held = tables.read(held_source, s.format, s.heldout_split)
            self._problems = {
                "train": [self._problem(row, "train") for row in main],
                "heldout": [self._problem(row, "heldout") for row in held],
            }
        else:
            self._problems = {"train": [], "heldout": []}
            threshold = round(s.heldout_fraction * HASH_BUCKETS)
            for row in main:
                problem = self._problem(row, None)
                split: base.Split = (
                    "heldout"
                    if splits.stable_hash(problem.meta["key"]) % HASH_BUCKETS < threshold
                    else "train"
                )
                self._problems[split].append(_with_split(problem, split))
        for split_name, found in self._problems.items():
            if not found:
                raise ValueError(
                    f"{NAME}: {s.path} gives no {split_name} problems ({len(main)} rows); "
                    + (
                        "add rows or raise heldoutFraction"
                        if s.heldout_path is None and s.heldout_split is None
                        else "check the files"
                    )
                )

    def _problem(self, row: tables.Row, split: base.Split | None) -> base.Problem:
        s = self.settings
        columns = dict(row.columns)
        answer: Any = None
        if s.messages_field is not None:
            conversation = _check_prompt(
                _get(columns, s.messages_field, row.where), row.where, s.messages_field
            )
            if isinstance(conversation, str):
                raise ValueError(f"{row.where}: field {s.messages_field!r} must be a list of chat messages")
            if conversation[-1]["role"] == "assistant":
                answer = conversation[-1]["content"]
                conversation = conversation[:-1]
            if not conversation:
                raise ValueError(f"{row.where}: field {s.messages_field!r} has no message before the answer")
            prompt: Any = conversation
            prompt_field = s.messages_field
        else:
            prompt = _check_prompt(_get(columns, s.prompt_field, row.where), row.where, s.prompt_field)
            prompt_field = s.prompt_field
        if s.answer_field is not None:
            try:
                answer = field(columns, s.answer_field)
            except KeyError:
                if answer is None and s.checker != "None":
                    raise ValueError(
                        f"{row.where}: no field {s.answer_field!r} (the answer); its fields are {sorted(columns)}"
                    ) from None
        if s.checker != "None":
            if answer is None or (isinstance(answer, str) and not answer.strip()):
                raise ValueError(f"{row.where}: field {s.answer_field!r}: the answer is empty")
            if s.checker == "Numeric" and _number(answer) is None:
                raise ValueError(
                    f"{row.where}: field {s.answer_field!r}: {answer!r:.60} is not (and does not end in) a "
                    f"number, which the Numeric checker needs"
                )
        if s.id_field is not None:
            key = str(_get(columns, s.id_field, row.where))
        else:
            key = (
                prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)
            )
        # The key (above) is the row's own text, before the instruction: rewording it moves no row.
        if s.instruction:
            prompt = _with_instruction(prompt, s.instruction)
        rest = {k: v for k, v in columns.items() if k != prompt_field.split(".")[0]}
        meta = {"split": split, "where": row.where, "key": key, "columns": rest}
        return base.Problem(splits.problem_id(NAME, key), prompt, answer, meta)

    def prompts(self, split: base.Split, seed: int) -> Iterator[base.Problem]:
        split = splits.check_split(split)
        rand = splits.rng(NAME, split, splits.check_seed(seed))
        return _epochs(self._problems[split], rand)

    def score(self, problem: base.Problem, completion: str) -> base.Reward:
        s = self.settings
        components: dict[str, float] = {}
        reasons: list[str] = []
        total = weights = 0.0
        if s.checker != "None":
            found, correct, reason = check(s.checker, completion, problem.answer)
            value = 1.0 if correct else (scoring.FORMAT_CREDIT if found else 0.0)
            components.update(format=1.0 if found else 0.0, correct=1.0 if correct else 0.0)
            if not correct:
                reasons.append(reason)
            total, weights = s.checker_weight * value, s.checker_weight
        if self.functions:
            shown: Any = completion
            if not isinstance(problem.prompt, str):
                shown = [{"role": "assistant", "content": completion}]
            columns = problem.meta.get("columns", {})
            for call in self.functions:
                value_or_none, reason = call(problem.prompt, shown, columns)
                if reason:
                    reasons.append(reason)
                if value_or_none is None:
                    continue
                components[f"fn:{call.name}"] = value_or_none
                total += call.weight * value_or_none
                weights += call.weight
        reward = total / weights if weights > 0 else 0.0
        return base.Reward(min(1.0, max(0.0, reward)), components, "; ".join(reasons) if reward < 1.0 else "")

    def reference(self, problem: base.Problem) -> str:
        if self.settings.checker == "None":
            raise ValueError(
                f"{NAME}: with checker None there is no reference completion (only reward functions)"
            )
        return reference_of(self.settings.checker, problem.answer)

    def sizes(self) -> dict[str, int]:
        """Problems per split."""
        return {k: len(v) for k, v in self._problems.items()}


def _get(columns: Mapping[str, Any], path: str, where: str) -> Any:
    try:
        return field(columns, path)
    except KeyError:
        raise ValueError(f"{where}: no field {path!r}; its fields are {sorted(columns)}") from None


def _with_instruction(prompt: Any, instruction: str) -> Any:
    if isinstance(prompt, str):
        return f"{prompt.rstrip()}\n{instruction}"
    chat = [dict(m) for m in prompt]
    last_user = max((i for i, m in enumerate(chat) if m["role"] == "user"), default=None)
    if last_user is not None:
        chat[last_user]["content"] = f"{chat[last_user]['content'].rstrip()}\n{instruction}"
    return tuple(chat)


def _with_split(problem: base.Problem, split: base.Split) -> base.Problem:
    return base.Problem(problem.id, problem.prompt, problem.answer, {**problem.meta, "split": split})


def _epochs(problems: list[base.Problem], rand: random.Random) -> Iterator[base.Problem]:
    while True:
        order = list(problems)
        rand.shuffle(order)
        yield from order
