"""Checks for task options, with errors that name the task, the option and what is allowed.

Options arrive from YAML manifests and the command line, so they are checked at runtime, strictly: a
``digits: "2"`` is an error, not silently an int, and ``True`` is not an integer.
"""

from __future__ import annotations

from collections.abc import Sequence


def integer(task: str, name: str, value: object, low: int, high: int) -> int:
    """``value`` if it is an int in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{task}: option {name!r} must be an integer from {low} to {high}, got {value!r}")
    return value


def ordered(task: str, low_name: str, low: int, high_name: str, high: int) -> None:
    """Reject a range whose lower end is above its upper end."""
    if low > high:
        raise ValueError(f"{task}: option {low_name!r} ({low}) must not exceed {high_name!r} ({high})")


def characters(task: str, name: str, value: object, allowed: str) -> str:
    """A non-empty subset of ``allowed``, given as a string ("+-") or a list of characters."""
    chars: Sequence[object] = value if isinstance(value, str | list | tuple) else ()
    picked = [c for c in chars if isinstance(c, str) and len(c) == 1 and c in allowed]
    if not picked or len(picked) != len(chars):
        raise ValueError(
            f"{task}: option {name!r} must be a non-empty selection of the characters {allowed!r}, "
            f"got {value!r}"
        )
    # Canonical order, duplicates dropped, so that equal selections give equal streams.
    return "".join(c for c in allowed if c in picked)
