"""retry.call and Backoff: what is retried, how long it waits, and what comes out at the end."""

from __future__ import annotations

import random

import pytest

from echo_runtime.snapshots import retry


class Flaky(Exception):
    pass


def test_delays_grow_capped_and_jittered() -> None:
    backoff = retry.Backoff(attempts=6, base_s=0.1, max_s=0.5)
    caps = [0.1, 0.2, 0.4, 0.5, 0.5]
    for _ in range(50):
        delays = list(backoff.delays(random.Random()))
        assert len(delays) == 5 and all(0 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    assert list(retry.NO_RETRY.delays()) == []
    with pytest.raises(ValueError):
        retry.Backoff(attempts=0)


def test_retries_transient_errors_until_success() -> None:
    calls, sleeps = [], []

    def fn() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Flaky("try again")
        return "ok"

    result = retry.call(
        fn,
        transient=lambda e: isinstance(e, Flaky),
        backoff=retry.Backoff(attempts=5),
        what="thing",
        sleep=sleeps.append,
    )
    assert result == "ok" and len(calls) == 3 and len(sleeps) == 2


def test_gives_up_after_the_last_attempt_with_the_original_error() -> None:
    calls = []

    def fn() -> None:
        calls.append(1)
        raise Flaky(f"failure {len(calls)}")

    with pytest.raises(Flaky, match="failure 4"):
        retry.call(
            fn, transient=lambda e: True, backoff=retry.Backoff(attempts=4), what="x", sleep=lambda s: None
        )
    assert len(calls) == 4


def test_permanent_errors_are_not_retried() -> None:
    calls = []

    def fn() -> None:
        calls.append(1)
        raise KeyError("no")

    with pytest.raises(KeyError):
        retry.call(
            fn,
            transient=lambda e: isinstance(e, Flaky),
            backoff=retry.Backoff(),
            what="x",
            sleep=lambda s: None,
        )
    assert len(calls) == 1
