"""Groups without signal: DAPO's dynamic sampling and the "learns nothing" warning (coordinator.signal)."""

from __future__ import annotations

import itertools

from coordinator_helpers import answer, config, make_state, register, rollout

from echo_runtime import tasks
from echo_runtime.coordinator import report, signal, state, wire
from echo_runtime.tasks import base as tasks_base


def _group(s: state.CoordinatorState, task: wire.TaskOut, right: int) -> wire.SubmitRequest:
    """A group for ``task`` with ``right`` correct completions (the verifier scores them 1, the rest 0),
    sampled with the task's ``minVersion``."""
    good = answer(task.prompt)
    return wire.SubmitRequest(
        rollouts=[rollout(task.min_version, good if i < right else "x") for i in range(s.config.group_size)]
    )


def _conserved(s: state.CoordinatorState) -> bool:
    ledger = s.ledger
    return (
        ledger.created == ledger.pending + ledger.leased + ledger.buffered + ledger.consumed + ledger.dropped
    )


# --------------------------------------------------------------------------------------- the watch
def test_watch_counts_and_filters_only_with_dynamic_sampling() -> None:
    off = signal.SignalWatch()
    assert off.completed("p", [0.0, 0.0]) and off.filtered_groups == 0  # kept: the option is off
    on = signal.SignalWatch(dynamic_sampling=True)
    assert not on.completed("p", [1.0, 1.0]) and on.completed("q", [1.0, 0.0])
    assert on.filtered_groups == 1 and on.signal_fraction == 0.5
    assert on.keep_rate == 0.9 * (0.9 * 1.0 + 0.0) + 0.1  # moving average: 1 → 0.9 → 0.91
    assert not signal.has_signal([0.1, 0.1]) and signal.has_signal([0.1, 0.1000001])


def test_a_prompt_whose_groups_keep_being_filtered_is_set_aside_once() -> None:
    watch = signal.SignalWatch(dynamic_sampling=True, set_aside_after=2)
    watch.completed("p", [0.0, 0.0])
    assert not watch.set_aside("p")  # one filtered group is not yet a pattern
    watch.completed("p", [0.0, 0.0])
    assert watch.set_aside("p") and watch.set_aside_prompts == 1
    assert not watch.set_aside("p")  # once: the next epoch offers it again
    watch.completed("q", [1.0, 1.0])
    watch.completed("q", [1.0, 0.0])  # signal resets the streak
    watch.completed("q", [1.0, 1.0])
    assert not watch.set_aside("q")
    assert not signal.SignalWatch(dynamic_sampling=True, set_aside_after=0).set_aside("p")


def test_a_job_that_learns_nothing_says_so() -> None:
    watch = signal.SignalWatch()
    for _ in range(signal.NO_SIGNAL_BATCHES - 1):
        watch.handed([[0.0, 0.0], [1.0, 1.0]])
    assert watch.warnings() == []
    watch.handed([[0.0, 0.0]])
    (warning,) = watch.warnings()
    assert warning.startswith("no learning signal:") and f"last {signal.NO_SIGNAL_BATCHES} batches" in warning
    watch.handed([[0.0, 1.0], [0.0, 0.0]])  # one group with signal clears it
    assert watch.warnings() == [] and watch.no_signal_batches == 0


def test_nearly_all_filtered_is_reported_over_a_full_window() -> None:
    watch = signal.SignalWatch(dynamic_sampling=True)
    for i in range(signal.WINDOW - 1):
        watch.completed(f"p{i}", [0.0, 0.0])
    assert watch.warnings() == []  # the window is not full yet
    watch.completed("last", [0.0, 0.0])
    (warning,) = watch.warnings()
    assert warning.startswith("nearly every group is filtered:")
    assert watch.planning_keep == signal.MIN_KEEP


# --------------------------------------------------------------------------------------- the coordinator
def test_dynamic_sampling_keeps_groups_without_signal_out_of_batches() -> None:
    s = make_state(config(batch_size=1, capacity=4, dynamic_sampling=True))
    w = register(s)
    first, second = s.lease(w, 2, 0.0).tasks
    reply = s.submit(w, first.task_id, _group(s, first, right=0), 1.0)  # every reward 0: no signal
    assert reply.outcome == "dropped" and reply.reason is not None and "filtered" in reply.reason
    assert s.submit(w, second.task_id, _group(s, second, right=1), 1.0).outcome == "buffered"
    batch = s.pull_batch(0, 2.0)
    assert [g.task_id for g in batch.groups] == [second.task_id]
    doc = report.status_document(s, 2.0, 0.0)
    assert (doc.filtered_groups, doc.requeued_prompts, doc.dropped_stale) == (1, 0, 0)  # not re-queued
    assert doc.signal_fraction == 0.5 and _conserved(s)


def test_without_dynamic_sampling_such_groups_are_trained_on_and_the_status_warns() -> None:
    s = make_state(config(batch_size=1, capacity=2, max_staleness=8))
    w = register(s)
    for version in range(signal.NO_SIGNAL_BATCHES):
        task = s.lease(w, 1, float(version)).tasks[0]
        assert s.submit(w, task.task_id, _group(s, task, right=0), float(version)).outcome == "buffered"
        assert s.pull_batch(version, float(version)).ready
        s.announce(version + 1)
    doc = report.status_document(s, 10.0, 0.0)
    assert doc.no_signal_batches == signal.NO_SIGNAL_BATCHES and doc.filtered_groups == 0
    assert [w.split(":")[0] for w in doc.warnings] == ["no learning signal"]


def test_pacing_counts_a_task_as_the_kept_fraction_of_a_group() -> None:
    def leased_after_filtering(dynamic: bool) -> int:
        s = make_state(config(batch_size=2, capacity=4, max_staleness=1, dynamic_sampling=dynamic))
        w = register(s, capacity=64)
        # 40 groups, every other one without signal: half of them are filtered when the option is on.
        version = 0
        for i in range(40):
            task = s.lease(w, 1, float(i)).tasks[0]
            s.submit(w, task.task_id, _group(s, task, right=i % 2), float(i))
            if s.ledger.buffered >= 2:
                assert s.pull_batch(version, float(i)).ready
                version += 1
                s.announce(version)
        assert s.ledger.leased == s.ledger.buffered == 0
        return len(s.lease(w, 64, 50.0).tasks)

    plain, filtered = leased_after_filtering(False), leased_after_filtering(True)
    # Δmax 1, batch 2: 4 groups may be in flight. Keeping about half, the coordinator leases about twice
    # as many tasks (the keep rate is a moving average: near 0.5 after 40 alternating groups).
    assert plain == 4
    assert 7 <= filtered <= 9


def test_a_set_aside_prompt_is_skipped_when_the_stream_offers_it_again() -> None:
    task_ = tasks.get_task("arithmetic")
    problems = list(itertools.islice(task_.prompts("train", 0), 2))
    # The stream offers p0 three times, then p1: after two filtered groups p0 is skipped once.
    stream = iter([problems[0], problems[0], problems[0], problems[1]])
    s = state.CoordinatorState(
        config(batch_size=1, capacity=1, max_staleness=8, dynamic_sampling=True, set_aside_after=2),
        task_,
        now=0.0,
        prompts=stream,
    )
    w = register(s)
    seen: list[tasks_base.Problem | str] = []
    for i in range(2):
        task = s.lease(w, 1, float(i)).tasks[0]
        seen.append(task.problem_id)
        s.submit(w, task.task_id, _group(s, task, right=0), float(i))
    task = s.lease(w, 1, 5.0).tasks[0]
    assert seen == [problems[0].id, problems[0].id] and task.problem_id == problems[1].id
    assert report.status_document(s, 5.0, 0.0).set_aside_prompts == 1
