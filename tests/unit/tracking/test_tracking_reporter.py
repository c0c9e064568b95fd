"""The reporter keeps tracker failures away from training: reported once, retried, turned off; the
other trackers and the caller go on. Fake trackers here; the real ones in tests/integration/tracking."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from echo_runtime.tracking import backends, reporter
from echo_runtime.tracking.records import Point

RUN = backends.RunInfo(project="p", name="n", run_id="n-1", dir=Path("/nonexistent"), config={})


class Fake:
    def __init__(
        self, name: str, *, open_fails: int = 0, write_fails: int = 0, missing: bool = False
    ) -> None:
        self.name = name
        self.open_fails, self.write_fails, self.missing = open_fails, write_fails, missing
        self.opens = 0
        self.points: list[Point] = []
        self.closed = False

    def open(self, run: backends.RunInfo) -> None:
        self.opens += 1
        if self.missing:
            raise backends.NotInstalled(f"the {self.name} tracker needs {self.name!r}")
        if self.open_fails:
            self.open_fails -= 1
            raise ConnectionError("server refused")

    def log(self, point: Point) -> None:
        if self.write_fails:
            self.write_fails -= 1
            raise OSError(28, "No space left on device")
        self.points.append(point)

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def trainer(version: int) -> dict[str, Any]:
    return {"kind": "trainer", "policyVersion": version, "time": float(version), "loss": float(version)}


def make(*fakes: Fake, clock: Clock | None = None, poll: Any = None) -> tuple[reporter.Reporter, list[str]]:
    warnings: list[str] = []
    factories = {f.name: (lambda f=f: f) for f in fakes}
    made = reporter.Reporter(
        [f.name for f in fakes], RUN, t0=0.0, warn=warnings.append, factories=factories,
        clock=clock or Clock(), poll=poll,
    )  # fmt: skip
    return made, warnings


def test_a_healthy_tracker_gets_every_record_in_order_and_is_closed() -> None:
    good = Fake("good")
    made, warnings = make(good)
    for v in range(1, 6):
        made.log(trainer(v))
    made.close()
    assert [p.version for p in good.points] == [1, 2, 3, 4, 5]
    assert [p.scalars["train/loss"] for p in good.points] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert good.opens == 1 and good.closed and warnings == []


def test_a_tracker_that_cannot_open_is_reported_once_retried_later_and_the_others_go_on() -> None:
    clock = Clock()
    flaky, good = Fake("flaky", open_fails=2), Fake("good")
    made, warnings = make(flaky, good, clock=clock)
    made.log(trainer(1))
    made.log(trainer(2))  # within RETRY_SECONDS: not tried again
    _drain(made)
    assert flaky.opens == 1 and len(good.points) == 2
    clock.now += reporter.RETRY_SECONDS
    made.log(trainer(3))  # second failure: not reported again
    _drain(made)
    clock.now += reporter.RETRY_SECONDS
    made.log(trainer(4))  # opens now
    made.close()
    assert flaky.opens == 3 and [p.version for p in flaky.points] == [4] and flaky.closed
    assert len(warnings) == 1 and "flaky" in warnings[0] and "server refused" in warnings[0]
    assert "retrying" in warnings[0]
    assert made.active() == ["flaky", "good"]


def test_a_tracker_that_keeps_failing_is_turned_off_and_says_so() -> None:
    broken, good = Fake("broken", write_fails=10**6), Fake("good")
    made, warnings = make(broken, good)
    for v in range(1, reporter.MAX_FAILURES + 3):
        made.log(trainer(v))
    made.close()
    assert len(good.points) == reporter.MAX_FAILURES + 2
    assert made.active() == ["good"] and not broken.closed
    assert len(warnings) == 2
    assert "No space left on device" in warnings[0] and "retrying" in warnings[0]
    assert f"failed {reporter.MAX_FAILURES} times" in warnings[1] and "off" in warnings[1]


def test_a_missing_library_turns_the_tracker_off_at_once_with_the_extra_to_install() -> None:
    missing, good = Fake("wandb", missing=True), Fake("good")
    made, warnings = make(missing, good)
    made.log(trainer(1))
    made.log(trainer(2))
    made.close()
    assert missing.opens == 1 and made.active() == ["good"] and len(good.points) == 2
    assert len(warnings) == 1 and "wandb" in warnings[0] and "off" in warnings[0]


def test_the_real_backends_name_the_extra_when_their_library_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_wandb(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    monkeypatch.delitem(__import__("sys").modules, "wandb", raising=False)
    with pytest.raises(backends.NotInstalled, match=r"pip install 'echorl\[wandb\]'"):
        backends.WandB().open(RUN)


def test_logging_never_blocks_on_a_slow_tracker_and_close_gives_up_after_its_timeout() -> None:
    release = threading.Event()

    class Slow(Fake):
        def log(self, point: Point) -> None:
            release.wait(30)
            super().log(point)

    slow = Slow("slow")
    made, warnings = make(slow)
    for v in range(1, 201):
        made.log(trainer(v))  # returns although the tracker is stuck on the first record: log() only queues
    assert slow.points == [] and made._queue.qsize() >= 199
    made.close(timeout_s=0.5)
    assert any("still writing" in w for w in warnings)
    release.set()


def test_unknown_names_are_refused_with_what_is_allowed() -> None:
    with pytest.raises(
        ValueError, match=r"unknown tracker.*comet.*allowed: tensorboard, mlflow, wandb, trackio"
    ):
        reporter.Reporter(["comet"], RUN, t0=0.0)


def test_poll_adds_the_coordinator_status_after_each_trainer_record_and_its_failures_are_harmless() -> None:
    calls = []

    def poll() -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionError("coordinator restarting")
        return {"kind": "status", "policyVersion": len(calls), "time": 0.0, "reward": 0.5}

    good = Fake("good")
    made, warnings = make(good, poll=poll)
    for v in (1, 2, 3):
        made.log(trainer(v))
    made.close()
    kinds = [sorted({k.split("/")[0] for k in p.scalars}) for p in good.points]
    assert kinds == [["train"], ["coordinator"], ["train"], ["train"], ["coordinator"]]
    assert warnings == []


def _drain(made: reporter.Reporter) -> None:
    assert made.flush(10.0)
