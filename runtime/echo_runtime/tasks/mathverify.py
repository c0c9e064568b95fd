"""The ``dataset`` task's ``MathVerify`` checker: Hugging Face's math-verify, an optional extra.

math-verify (``pip install 'echorl[math-verify]'``) parses the final answer out of a completion — LaTeX
(``\\boxed{\\frac{1}{2}}``, ``$x^2+1$``, intervals, sets, matrices) or a plain expression (``1/2``) — into
sympy, and compares it with the reference symbolically and numerically, so ``\\frac{1}{2}``, ``0.5`` and
``\\frac{2}{4}`` all match ``0.5``. It is imported only when a task uses the checker
(:func:`load`).

* **Reference.** A number as it is; a text answer inside ``$...$`` unless it already holds LaTeX
  delimiters or ``\\boxed``; a GSM8K-style solution by what follows its last ``####``. Parsed once per
  answer (cached).
* **Scoring**, the project's convention (:mod:`.scoring`): 1 if math-verify finds an answer equal to
  the reference, 0.1 if it finds an answer that is not, 0 if it finds none.
* **Safety.** Both calls run with math-verify's own ``signal.alarm`` timeouts off and inside
  :func:`.limits.deadline` instead, which nests with the coordinator's timer and cannot be swallowed by
  math-verify's ``except Exception`` (see :mod:`.limits`). A completion past the deadline scores 0.
  math-verify logs its parse failures at debug level, and warns once that its timeouts are off; that
  warning is dropped, since the deadline replaces them.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import Any

from echo_runtime.tasks import limits

EXTRA = "math-verify"


class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@functools.cache
def load() -> ModuleType:
    """The ``math_verify`` module, or a ValueError naming the extra to install."""
    module = limits.require("math_verify", EXTRA, "the dataset task's MathVerify checker")
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutWarning())
    return module


def gold_text(answer: Any) -> str:
    """The text of a reference answer, as math-verify is given it (see the module docstring)."""
    text = str(answer).strip()
    if "####" in text:
        text = text.rpartition("####")[2].strip()
    if any(mark in text for mark in ("$", "\\boxed", "\\(", "\\[")):
        return text
    return f"${text}$"


@functools.lru_cache(maxsize=4096)
def _gold(text: str) -> list[Any]:
    parsed: list[Any] = load().parse(text, parsing_timeout=None)
    return parsed


def check(completion: str, answer: Any) -> tuple[bool, bool, str]:
    """``(found, correct, reason)`` of ``completion`` against the reference ``answer``; never raises."""
    math_verify = load()
    text = gold_text(answer)
    try:
        with limits.deadline(limits.VERIFIER_SECONDS):
            gold = _gold(text)
            if not gold:
                return False, False, f"math-verify cannot read the reference answer {text[:40]!r}"
            found = math_verify.parse(completion, parsing_timeout=None)
            if not found:
                return False, False, "math-verify found no answer"
            correct = bool(math_verify.verify(gold, found, timeout_seconds=None))
    except limits.Overrun:
        return False, False, f"math-verify ran past {limits.VERIFIER_SECONDS:g}s"
    except Exception as exc:  # a library on untrusted text: any failure is this completion's 0
        return False, False, f"math-verify raised {type(exc).__name__}"
    # The last element is the matched text; str() of the sympy value can itself be slow for a huge one.
    given = found[-1] if isinstance(found[-1], str) else "?"
    return True, correct, f"expected {text[:40]!r}, got {given[:40]!r}"


def reference(answer: Any) -> str:
    """A completion :func:`check` finds correct: the reference inside ``\\boxed{}``."""
    text = gold_text(answer)
    if text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text if "\\boxed" in text else f"\\boxed{{{text}}}"
