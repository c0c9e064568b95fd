"""The run summary is computed from metrics records alone, and torn lines never break it."""

from __future__ import annotations

from pathlib import Path

from echo_runtime.runner import metrics, plots


def _records() -> list[dict[str, object]]:
    return [
        {"kind": "status", "time": 1.0, "policyVersion": 0, "reward": 0.1, "rolloutsPerSecond": 10.0},
        {"kind": "eval", "time": 2.0, "publishedAt": 0.5, "policyVersion": 0, "heldoutAccuracy": 0.1},
        {"kind": "trainer", "time": 3.0, "policyVersion": 1, "stepSeconds": 2.0},
        {"kind": "trainer", "time": 6.0, "policyVersion": 2, "stepSeconds": 2.0},
        {"kind": "eval", "time": 9.0, "publishedAt": 7.0, "policyVersion": 10, "heldoutAccuracy": 0.6},
        {"kind": "eval", "time": 8.0, "publishedAt": 5.0, "policyVersion": 5, "heldoutAccuracy": 0.4},
        {
            "kind": "status",
            "time": 10.0,
            "policyVersion": 10,
            "reward": 0.5,
            "rolloutsPerSecond": 30.0,
            "maxObservedStaleness": 2,
            "maxStaleness": 2,
            "stalenessHistogram": {"0": 3, "2": 1},
            "droppedStale": 4,
        },
    ]


def test_summary_values() -> None:
    summary = metrics.summarise(_records(), target_accuracy=0.35)
    assert summary["wallClockSeconds"] == 10.0
    assert summary["policyVersion"] == 10
    assert summary["trainerBusyFraction"] == 0.4
    assert summary["rolloutsPerSecond"] == 20.0
    assert summary["initialHeldoutAccuracy"] == 0.1
    assert summary["finalHeldoutAccuracy"] == 0.6
    # reached at version 5 (published at 5 s), not at the later-logged version 10
    assert (summary["timeToTargetSeconds"], summary["stepsToTarget"]) == (5.0, 5)
    assert summary["stalenessHistogram"] == {"0": 3, "2": 1}
    assert summary["droppedStale"] == 4


def test_a_resumed_run_with_a_restarted_coordinator_is_summarised_once_per_version() -> None:
    """A resume re-logs what the previous attempt logged; a coordinator restart resets its counters."""
    first = [
        {
            "kind": "status",
            "time": 1.0,
            "epoch": "a",
            "policyVersion": 1,
            "consumedGroups": 2,
            "generatedGroups": 3,
            "droppedStale": 1,
            "stalenessHistogram": {"0": 1, "1": 1},
            "maxObservedStaleness": 1,
            "maxStaleness": 2,
        },
        {"kind": "trainer", "time": 2.0, "policyVersion": 1, "stepSeconds": 1.0},
        {"kind": "eval", "time": 2.5, "publishedAt": 2.0, "policyVersion": 1, "heldoutAccuracy": 0.2},
        {
            "kind": "status",
            "time": 3.0,
            "epoch": "a",
            "policyVersion": 2,
            "consumedGroups": 4,
            "generatedGroups": 5,
            "droppedStale": 1,
            "stalenessHistogram": {"0": 2, "1": 2},
            "maxObservedStaleness": 1,
            "maxStaleness": 2,
        },
        {"kind": "trainer", "time": 3.5, "policyVersion": 2, "stepSeconds": 1.0},
    ]
    resumed = [  # the trainer redid version 2 after a kill, the coordinator restarted (epoch b)
        {"kind": "trainer", "time": 5.0, "policyVersion": 2, "stepSeconds": 1.5},
        {"kind": "eval", "time": 5.5, "publishedAt": 2.0, "policyVersion": 1, "heldoutAccuracy": 0.2},
        {
            "kind": "status",
            "time": 6.0,
            "epoch": "b",
            "policyVersion": 3,
            "consumedGroups": 2,
            "generatedGroups": 2,
            "droppedStale": 0,
            "stalenessHistogram": {"2": 2},
            "maxObservedStaleness": 2,
            "maxStaleness": 2,
        },
        {"kind": "trainer", "time": 7.0, "policyVersion": 3, "stepSeconds": 1.0},
        {
            "kind": "status",
            "time": 8.0,
            "epoch": "b",
            "policyVersion": 3,
            "consumedGroups": 2,
            "generatedGroups": 3,
            "droppedStale": 0,
            "stalenessHistogram": {"2": 2},
            "maxObservedStaleness": 2,
            "maxStaleness": 2,
        },
    ]
    summary = metrics.summarise(first + resumed)
    assert summary["trainerRecords"] == 3
    assert summary["trainerBusyFraction"] == (1.0 + 1.5 + 1.0) / 8.0  # version 2 counted once, the last
    assert summary["consumedGroups"] == 4 + 2 and summary["generatedGroups"] == 5 + 3
    assert summary["droppedStale"] == 1 and summary["droppedFraction"] == 1 / 8
    assert summary["stalenessHistogram"] == {"0": 2, "1": 2, "2": 2}
    assert summary["maxObservedStaleness"] == 2 and summary["coordinatorIncarnations"] == 2
    assert [e["policyVersion"] for e in summary["evaluations"]] == [1]


def test_target_never_reached() -> None:
    summary = metrics.summarise(_records(), target_accuracy=0.9)
    assert summary["timeToTargetSeconds"] is None and summary["stepsToTarget"] is None


def test_log_round_trip_skips_a_torn_line(tmp_path: Path) -> None:
    log = metrics.MetricsLog(tmp_path / "metrics.jsonl")
    for record in _records():
        log.write(record)
    log.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "status", "ti')  # a run killed mid-write
    assert metrics.read_records(tmp_path / "metrics.jsonl") == _records()


def test_plots_are_written(tmp_path: Path) -> None:
    paths = plots.plot_run(_records(), tmp_path, "demo")
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
