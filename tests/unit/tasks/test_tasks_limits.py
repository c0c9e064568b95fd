"""The verifier deadline: it fires, it nests with the coordinator's per-rollout alarm either way round,
it leaves no timer or handler behind, and off the main thread it stands aside."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from echo_runtime.coordinator import scoring
from echo_runtime.tasks import base, limits


def spin(seconds: float) -> None:
    """Busy Python code for ``seconds`` (a hostile completion's verifier, bounded so a broken test ends)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


class _Outer(Exception):
    pass


@pytest.fixture
def outer_timer() -> Iterator[None]:
    """An outer alarm 30 s away, as the coordinator (or pytest-timeout) arms one; restored afterwards."""
    saved_handler = signal.getsignal(signal.SIGALRM)
    saved_timer = signal.getitimer(signal.ITIMER_REAL)

    def ring(signum: int, frame: object) -> None:
        raise _Outer()

    signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, saved_handler)
        if saved_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *saved_timer)


def test_it_fires_and_gives_the_outer_timer_back(outer_timer: None) -> None:
    handler = signal.getsignal(signal.SIGALRM)
    with pytest.raises(limits.Overrun), limits.deadline(0.2):
        spin(5.0)  # a spin that ran out would return normally: the Overrun is the deadline's
    assert signal.getsignal(signal.SIGALRM) is handler
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    assert 28.0 < left <= 30.0 - 0.2
    with limits.deadline(0.2):
        pass  # a quick section is untouched
    assert signal.getsignal(signal.SIGALRM) is handler
    assert 28.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= left


def test_a_library_catching_exception_cannot_swallow_it() -> None:
    def library() -> str:
        try:
            spin(5.0)
        except Exception:
            return "swallowed"
        return "finished"

    with pytest.raises(limits.Overrun), limits.deadline(0.2):
        library()


def test_an_overrun_that_is_lost_rings_again() -> None:
    # An Overrun raised in a gc callback is only printed; a bare except swallows it. The section must
    # still end.
    def stubborn_library() -> None:
        try:
            spin(5.0)
        except BaseException:
            spin(5.0)

    with pytest.raises(limits.Overrun), limits.deadline(0.2):
        stubborn_library()  # it returns normally unless a second ring ends its second spin


class _Guarded:
    """A task whose verifier spins inside its own deadline, as the library-backed verifiers do."""

    name = "guarded"

    def __init__(self, inner: float, spin_for: float, after: float = 0.0) -> None:
        self.inner, self.spin_for, self.after = inner, spin_for, after

    def prompts(self, split: base.Split, seed: int) -> Iterator[base.Problem]:
        raise NotImplementedError

    def reference(self, problem: base.Problem) -> str:
        return ""

    def score(self, problem: base.Problem, completion: str) -> base.Reward:
        try:
            with limits.deadline(self.inner):
                spin(self.spin_for)
        except limits.Overrun:
            return base.Reward(0.0, {}, "inner deadline")
        spin(self.after)  # time spent after the section: the outer alarm must still be armed
        return base.Reward(1.0)


PROBLEM = base.Problem("p", "prompt", None)


def test_the_inner_deadline_fires_first_and_the_outer_one_survives_it() -> None:
    scores = scoring.score_group(_Guarded(inner=0.2, spin_for=5.0), PROBLEM, ["x"], timeout_s=3.0)
    assert scores.rewards[0].reason == "inner deadline" and scores.timeouts == 0


def test_the_outer_deadline_fires_first_and_is_reported_as_its_own() -> None:
    scores = scoring.score_group(_Guarded(inner=5.0, spin_for=5.0), PROBLEM, ["x"], timeout_s=0.3)
    assert scores.timeouts == 1, scores  # the inner deadline would have given "inner deadline", no timeout


def test_the_outer_timer_still_runs_after_a_section_that_ended_in_time() -> None:
    # Without re-arming, the time spent after the section (5 s) would run unbounded.
    task = _Guarded(inner=5.0, spin_for=0.05, after=5.0)
    scores = scoring.score_group(task, PROBLEM, ["x"], timeout_s=0.5)
    assert scores.timeouts == 1, scores  # unbounded, the spin after the section would end and score 1


def test_off_the_main_thread_it_stands_aside() -> None:
    outcome: list[str] = []

    def run() -> None:
        with limits.deadline(0.05):
            spin(0.2)
        outcome.append("finished")

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert outcome == ["finished"]


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    assert limits.require("json", "x", "y").dumps([]) == "[]"
    with pytest.raises(
        ValueError, match=r"the thing needs the optional 'extra-x' extra: pip install 'echorl\[extra-x\]'"
    ):
        limits.require("echo_no_such_module_anywhere", "extra-x", "the thing")
