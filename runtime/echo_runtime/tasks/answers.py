"""Reading a numeric final answer out of free text, and comparing numbers exactly.

:func:`extract` finds the answer: the last number inside the last ``\\boxed{...}`` if there is one,
otherwise the last number of the whole text — what a real model writes around its answer ("17 + 25 =
42.", "So the answer is 7.\n\nI hope this helps!") is skipped over. A number is an integer (``-2``), a decimal
(``0.75``, ``.5``), one with thousands separators (``1,000``), a fraction ``3/4`` or a LaTeX fraction
(``\\frac{3}{4}``, ``\\dfrac``, ``\\tfrac``, with an optional leading minus). Exponents are not read
(``1e999999999`` must not make the verifier build a billion-digit integer); a last number of more than
:data:`MAX_DIGITS` digits, or with a zero denominator, gives no answer. Values are
:class:`fractions.Fraction`, so ``3/4``, ``0.75`` and ``\\frac{3}{4}`` are equal. Nothing here raises on
any input text.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_DIGITS = 60

_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(
    r"""
    (?P<minus>(?<![0-9A-Za-z)\]}])[-\u2212]\s*)?
    (?:
        \\[dt]?frac\s*\{\s*(?P<top>[0-9]+)\s*\}\s*\{\s*(?P<bottom>[0-9]+)\s*\}
      | (?P<value>[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]+(?:\.[0-9]+)?|\.[0-9]+)
        (?:\s*/\s*(?P<over>[0-9]+)(?![0-9.]))?
    )
    """,
    re.VERBOSE,
)


def boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` with balanced braces, or None."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth = 1
        for index in range(match.end(), len(text)):
            if text[index] == "{":
                depth += 1
            elif text[index] == "}":
                depth -= 1
                if depth == 0:
                    return text[match.end() : index]
    return None


def last_number(text: str) -> Fraction | None:
    """The value of the last number in ``text``; None if there is none or it is not a valid number."""
    matches = list(_NUMBER.finditer(text))
    return _value(matches[-1]) if matches else None


def parse_number(text: str) -> Fraction | None:
    """The value of ``text`` if the whole of it (spaces, ``$`` signs and a final full stop aside) is one
    number, else None: ``"3/4"`` and ``"$-2$"`` are numbers, ``"x^2 + 1"`` is not."""
    core = text.strip().strip("$").strip().rstrip(".").strip()
    match = _NUMBER.fullmatch(core)
    return _value(match) if match else None


def extract(text: str) -> Fraction | None:
    """The final answer a completion gives (see the module docstring), or None."""
    inside = boxed(text)
    if inside is not None:
        return last_number(inside)
    return last_number(text)


def canonical(value: Fraction) -> str:
    """A short exact text for a value: ``19``, ``29.75`` (terminating decimals), else ``3/7``."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator, places = value.denominator, 0
    for factor in (2, 5):
        while denominator % factor == 0:
            denominator //= factor
    if denominator != 1:
        return f"{value.numerator}/{value.denominator}"
    while (value * 10**places).denominator != 1:
        places += 1
    digits = str(abs(value.numerator * 10**places // value.denominator)).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def _value(match: re.Match[str]) -> Fraction | None:
    digits = [g for g in match.group("top", "bottom", "value", "over") if g is not None]
    if sum(len(g) for g in digits) > MAX_DIGITS:
        return None
    if match.group("top") is not None:
        top, bottom = int(match.group("top")), int(match.group("bottom"))
        value = Fraction(top, bottom) if bottom else None
    else:
        value = Fraction(match.group("value").replace(",", ""))
        over = match.group("over")
        if over is not None:
            value = value / int(over) if int(over) else None
    if value is None:
        return None
    return -value if match.group("minus") else value
