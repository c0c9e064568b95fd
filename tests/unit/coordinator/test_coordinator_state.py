"""The coordinator's state machine (coordinator.state): both protocols, validation, leases, status."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from pathlib import Path

import pydantic
import pytest
from coordinator_helpers import VOCAB, config, group, make_state, register, rollout

from echo_runtime import spec
from echo_runtime.coordinator import errors, metrics, quarantine, report, service, state, wire
from echo_runtime.coordinator.config import CoordinatorConfig

CONTRACTS = Path(__file__).resolve().parents[3] / "docs" / "contracts.md"


def lease_one(s: state.CoordinatorState, worker: str, now: float = 0.0) -> wire.TaskOut:
    reply = s.lease(worker, 1, now)
    assert reply.tasks, reply
    return reply.tasks[0]


def snapshot(s: state.CoordinatorState) -> tuple[int, ...]:
    ledger = s.ledger
    return (
        ledger.created,
        ledger.pending,
        ledger.leased,
        ledger.buffered,
        ledger.consumed,
        ledger.dropped,
        s.counters.dropped_stale,
        s.counters.accepted_rollouts,
        s.t_train,
    )


# ------------------------------------------------------------------------------------------- async
def test_async_backpressure_pauses_leasing_until_the_trainer_pulls() -> None:
    s = make_state(config(max_staleness=2, capacity=4, batch_size=2))  # Δmax 2: pacing leaves room
    w = register(s)
    tasks = s.lease(w, 10, 0.0).tasks
    assert len(tasks) == 4  # worker capacity 4, buffer capacity 4
    paused = s.lease(w, 1, 0.0)
    assert paused.tasks == [] and paused.retry_after_seconds
    for task in tasks:
        assert s.submit(w, task.task_id, group(s, task, 0), 1.0).outcome == "buffered"
    assert s.lease(w, 1, 1.0).tasks == []  # buffer full: still paused
    batch = s.pull_batch(0, 2.0)
    assert batch.ready and len(batch.groups) == 2
    assert [g.task_id for g in batch.groups] == [t.task_id for t in tasks[:2]]
    assert len(s.lease(w, 10, 2.0).tasks) == 2  # room for two again
    assert report.status_document(s, 2.0, 0.0).buffer.groups == 2


def test_rewards_are_recomputed_by_the_verifier() -> None:
    s = make_state()
    w = register(s)
    task = lease_one(s, w)
    reply = s.submit(w, task.task_id, group(s, task, 0), 0.0)
    assert reply.rewards == [1.0, 0.0]  # "x" is not an integer: the worker could not claim otherwise


def test_announce_drops_groups_that_became_too_stale() -> None:
    s = make_state(config(max_staleness=1))
    w = register(s)
    task = lease_one(s, w)
    s.submit(w, task.task_id, group(s, task, 0), 0.0)
    assert s.announce(1).dropped_stale == 0  # staleness 1 ≤ Δmax
    assert s.announce(2).dropped_stale == 1
    assert s.counters.dropped_stale == 1 and s.ledger.buffered == 0


def test_a_group_too_stale_on_arrival_is_dropped_counted_and_its_prompt_requeued() -> None:
    s = make_state(config(max_staleness=1))
    w = register(s)
    task = lease_one(s, w)
    s.announce(1)
    s.heartbeat(w, wire.HeartbeatRequest(loaded_version=1), 0.0)
    s.announce(3)
    reply = s.submit(w, task.task_id, group(s, task, 1), 0.0)
    assert reply.outcome == "dropped" and reply.staleness == 2 and "exceeds maxStaleness 1" in reply.reason
    assert s.counters.dropped_stale == 1 and s.ledger.dropped == 1
    assert s.counters.requeued_prompts == 1 and s.ledger.pending == 1
    s.heartbeat(w, wire.HeartbeatRequest(loaded_version=3), 1.0)
    again = lease_one(s, w, 1.0)
    assert again.problem_id == task.problem_id and again.task_id != task.task_id


def test_pacing_leases_only_what_can_be_consumed_in_bound() -> None:
    s = make_state(config(max_staleness=1, capacity=8, batch_size=2))
    w = register(s, capacity=8)
    first = s.lease(w, 8, 0.0).tasks
    # t = 0, the trainer has not taken its batch: steps 0 and 1 can consume version-0 groups.
    assert [t.min_version for t in first] == [0, 0, 0, 0]
    for task in first:
        s.submit(w, task.task_id, group(s, task, 0), 0.0)
    assert s.pull_batch(0, 0.0).ready  # step 0 trains; the two left go to step 1
    assert s.lease(w, 8, 0.0).tasks == []  # a group leased now would be consumed at step 2: too stale
    s.announce(1)
    reply = s.lease(w, 8, 0.0)
    # Behind the 2 buffered groups: steps 1 and 2 can consume version-1 groups (2 + 2 positions).
    assert [t.min_version for t in reply.tasks] == [1, 1] and reply.load_version == 1
    assert s.counters.dropped_stale == 0


def test_pacing_off_leases_what_the_buffer_holds_and_the_surplus_is_dropped() -> None:
    s = make_state(config(max_staleness=1, capacity=8, batch_size=2, pacing=False))
    w = register(s, capacity=8)
    for task in s.lease(w, 8, 0.0).tasks:
        s.submit(w, task.task_id, group(s, task, 0), 0.0)
    assert s.pull_batch(0, 0.0).ready
    s.announce(1)
    assert s.pull_batch(1, 0.0).ready
    s.announce(2)  # the groups of version 0 still buffered are too stale for step 2
    assert s.counters.dropped_stale == 4 and s.counters.requeued_prompts == 4


def test_workers_are_told_to_load_when_they_would_break_the_bound() -> None:
    s = make_state(config(max_staleness=1))
    w = register(s)
    assert s.heartbeat(w, wire.HeartbeatRequest(loaded_version=None), 0.0).load_version == 0
    assert s.heartbeat(w, wire.HeartbeatRequest(loaded_version=0), 0.0).load_version is None
    s.announce(1)
    assert s.heartbeat(w, wire.HeartbeatRequest(loaded_version=0), 0.0).load_version is None  # 1 - 0 ≤ Δmax
    s.announce(2)
    reply = s.heartbeat(w, wire.HeartbeatRequest(loaded_version=0), 1.0)
    assert (reply.load_version, reply.min_version, reply.policy_version) == (2, 1, 2)
    assert s.lease(w, 1, 1.0).load_version == 2
    assert not report.status_document(s, 5.0, 0.0).workers[0].stuck
    s.heartbeat(w, wire.HeartbeatRequest(loaded_version=0), 12.0)
    assert report.status_document(s, 12.0, 0.0).workers[0].stuck  # told at t=1, lease timeout 10 s
    s.heartbeat(w, wire.HeartbeatRequest(loaded_version=2), 13.0)
    assert not report.status_document(s, 13.0, 0.0).workers[0].stuck


def test_importance_weighted_groups_are_flagged_and_counted() -> None:
    s = make_state(config(max_staleness=2, action="ImportanceWeight", batch_size=2))
    w = register(s)
    s.announce(1)
    for version in (0, 1):
        task = lease_one(s, w)
        s.submit(w, task.task_id, group(s, task, version), 0.0)
    batch = s.pull_batch(1, 0.0)
    assert [(g.staleness, g.importance_weighted) for g in batch.groups] == [(1, True), (0, False)]
    assert s.counters.weighted_stale == 1
    status = report.status_document(s, 0.0, 0.0)
    assert status.staleness_histogram == {"0": 1, "1": 1} and status.max_observed_staleness == 1


def test_the_trainer_asking_ahead_moves_t_train_but_not_the_loadable_version() -> None:
    s = make_state(config(max_staleness=1))
    w = register(s)
    s.pull_batch(3, 0.0)  # the trainer publishes every few steps
    assert (s.t_train, s.published) == (3, 0)
    reply = s.heartbeat(w, wire.HeartbeatRequest(loaded_version=0), 0.0)
    assert reply.load_version is None and reply.min_version == 2  # nothing newer to load
    assert not report.status_document(s, 100.0, 0.0).workers[0].stuck


# ------------------------------------------------------------------------------------------- sequential
def test_sequential_round() -> None:
    s = make_state(config("Sequential", max_staleness=1, refresh=0, batch_size=2))
    w = register(s)
    assert s.lease(w, 4, 0.0).tasks == []  # nothing until the trainer asks
    s.announce(1)
    assert not s.pull_batch(1, 0.0).ready
    tasks = s.lease(w, 4, 0.0).tasks
    assert len(tasks) == 2 and {t.min_version for t in tasks} == {1}
    s.submit(w, tasks[0].task_id, group(s, tasks[0], 1), 0.0)
    assert s.submit(w, tasks[1].task_id, group(s, tasks[1], 0), 0.0).outcome == "dropped"  # not permitted
    assert not s.pull_batch(1, 0.0).ready
    again = s.lease(w, 4, 0.0).tasks
    assert len(again) == 1  # a fresh task replaces the dropped one
    s.submit(w, again[0].task_id, group(s, again[0], 1), 0.0)
    batch = s.pull_batch(1, 0.0)
    assert batch.ready and {g.policy_version for g in batch.groups} == {1}
    assert s.lease(w, 4, 0.0).tasks == []  # the round closed


def test_sequential_refresh_threshold_permits_a_recent_version() -> None:
    s = make_state(config("Sequential", max_staleness=2, refresh=1, batch_size=1))
    w = register(s)
    s.announce(5)
    s.pull_batch(5, 0.0)
    task = lease_one(s, w)
    assert task.min_version == 4
    assert s.heartbeat(w, wire.HeartbeatRequest(loaded_version=4), 0.0).load_version is None
    assert s.heartbeat(w, wire.HeartbeatRequest(loaded_version=3), 0.0).load_version == 5
    s.submit(w, task.task_id, group(s, task, 4), 0.0)
    batch = s.pull_batch(5, 0.0)
    assert batch.ready and batch.groups[0].staleness == 1


# ------------------------------------------------------------------------------------------- validation
def bad_group(s: state.CoordinatorState, task: wire.TaskOut, **change: object) -> wire.SubmitRequest:
    req = group(s, task, 0)
    first = req.rollouts[0].model_copy(update=change)
    return wire.SubmitRequest(rollouts=[first, *req.rollouts[1:]])


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"token_ids": list(range(9)), "logprobs": [-1.0] * 9}, "rollouts[0].tokenIds", "maxNewTokens"),
        ({"logprobs": [-1.0]}, "rollouts[0].logprobs", "one log-prob per token"),
        ({"token_ids": [1, 100, 2]}, "rollouts[0].tokenIds[1]", "outside the vocabulary"),
        ({"policy_version": 1}, "rollouts[0].policyVersion", "never published"),
        ({"logprobs": [-1.0, math.nan, -1.0]}, "rollouts[0].logprobs", "finite"),
    ],
)
def test_invalid_groups_are_rejected_naming_the_field(
    change: dict[str, object], field: str, words: str
) -> None:
    s = make_state()
    w = register(s)
    task = lease_one(s, w)
    before = snapshot(s)
    with pytest.raises(errors.Rejected) as caught:
        s.submit(w, task.task_id, bad_group(s, task, **change), 0.0)
    assert (caught.value.status, caught.value.field) == (422, field)
    assert words in caught.value.message
    assert snapshot(s) == before
    assert s.submit(w, task.task_id, group(s, task, 0), 0.0).outcome == "buffered"  # the lease still holds


def test_group_size_and_leases_are_enforced() -> None:
    s = make_state()
    w1, w2 = register(s), register(s)
    task = lease_one(s, w1)
    full = group(s, task, 0)
    with pytest.raises(errors.Rejected, match="exactly 2 rollouts") as caught:
        s.submit(w1, task.task_id, wire.SubmitRequest(rollouts=full.rollouts[:1]), 0.0)
    assert caught.value.field == "rollouts"
    with pytest.raises(errors.Rejected) as caught:
        s.submit(w2, task.task_id, full, 0.0)
    assert (caught.value.status, caught.value.code) == (409, "lease_not_held")
    with pytest.raises(errors.Rejected):
        s.submit(w1, "no-such-task", full, 0.0)
    with pytest.raises(errors.Rejected) as caught:
        s.submit("w-unknown", task.task_id, full, 0.0)
    assert (caught.value.status, caught.value.code) == (404, "unknown_worker")


def test_wire_models_refuse_positive_or_non_finite_logprobs() -> None:
    base = rollout(0).model_dump(by_alias=True)
    for bad in ([0.5, -1.0, -1.0], ["NaN", -1.0, -1.0], [-1.0, "-Infinity", -1.0]):
        with pytest.raises(pydantic.ValidationError) as caught:
            wire.RolloutIn.model_validate_json(json.dumps({**base, "logprobs": bad}))
        assert caught.value.errors()[0]["loc"][0] == "logprobs"
    with pytest.raises(pydantic.ValidationError):
        wire.RolloutIn.model_validate({**base, "reward": 1.0})  # the worker's reward is not accepted


def test_heartbeat_with_an_unpublished_version_is_rejected() -> None:
    s = make_state()
    w = register(s)
    with pytest.raises(errors.Rejected) as caught:
        s.heartbeat(w, wire.HeartbeatRequest(loaded_version=3), 0.0)
    assert caught.value.field == "loadedVersion"


def test_a_worker_cannot_hold_more_than_its_pools_capacity() -> None:
    s = make_state(config(capacity=8, pool_capacity={"cpu": 2}))
    w = register(s, capacity=100)
    assert s.roster.workers[w].capacity == 2
    assert len(s.lease(w, 10, 0.0).tasks) == 2


def test_unknown_pool_is_rejected() -> None:
    s = make_state()
    with pytest.raises(errors.Rejected) as caught:
        register(s, pool="gpu")
    assert caught.value.field == "pool" and "cpu" in caught.value.message


# ------------------------------------------------------------------------------------------- leases
def test_repeated_submission_is_a_duplicate_and_a_late_one_is_rejected() -> None:
    s = make_state()
    w1 = register(s, now=0.0)
    task = lease_one(s, w1)
    assert s.submit(w1, task.task_id, group(s, task, 0), 1.0).outcome == "buffered"
    assert s.submit(w1, task.task_id, group(s, task, 0), 1.0).outcome == "duplicate"
    assert s.ledger.buffered == 1
    late = lease_one(s, w1, now=1.0)
    w2 = register(s, now=5.0)
    s.heartbeat(w2, wire.HeartbeatRequest(loaded_version=0), 12.0)
    dead, released = s.expire(12.0)  # w1 silent since t=1, lease timeout 10 s
    assert dead == [w1] and released == 1
    assert lease_one(s, w2, now=12.0).task_id == late.task_id  # re-issued to another worker
    with pytest.raises(errors.Rejected) as caught:
        s.submit(w1, late.task_id, group(s, late, 0), 13.0)
    assert caught.value.code == "unknown_worker"
    assert s.submit(w2, late.task_id, group(s, late, 0), 13.0).outcome == "buffered"


def test_a_hung_lease_is_reissued_after_the_task_timeout() -> None:
    s = make_state()
    w1, w2 = register(s), register(s)
    task = lease_one(s, w1)
    for now in (5.0, 30.0, 55.0):
        s.heartbeat(w1, wire.HeartbeatRequest(loaded_version=0), now)
        s.heartbeat(w2, wire.HeartbeatRequest(loaded_version=0), now)
        s.expire(now)
    assert s.ledger.lease_of(task.task_id) is not None
    s.heartbeat(w1, wire.HeartbeatRequest(loaded_version=0), 61.0)
    s.heartbeat(w2, wire.HeartbeatRequest(loaded_version=0), 61.0)
    assert s.expire(61.0) == ([], 1)
    assert lease_one(s, w2, 61.0).task_id == task.task_id


def test_leave_releases_leases_at_once() -> None:
    s = make_state()
    w = register(s)
    s.lease(w, 3, 0.0)
    assert s.leave(w).released_tasks == 3
    assert s.ledger.pending == 3 and not s.roster.workers


# ------------------------------------------------------------------------------------------- trainer
def test_batches_are_retried_safely_and_versions_never_go_back() -> None:
    s = make_state(config(batch_size=1))
    w = register(s)
    task = lease_one(s, w)
    s.submit(w, task.task_id, group(s, task, 0), 0.0)
    first = s.pull_batch(0, 0.0)
    assert first.ready
    assert s.pull_batch(0, 0.0) is first  # the reply was lost: same batch again
    assert s.counters.consumed_groups == 1
    s.announce(2)
    with pytest.raises(errors.Rejected) as caught:
        s.pull_batch(1, 0.0)
    assert (caught.value.status, caught.value.field) == (409, "version")
    with pytest.raises(errors.Rejected):
        s.announce(1)
    assert s.announce(2).policy_version == 2  # repeating an announcement is harmless


def test_a_trainer_that_dies_after_prefetching_resumes_with_its_batch_and_no_prompt_is_lost() -> None:
    s = make_state(config(batch_size=1, max_staleness=1))
    w = register(s)
    for _ in range(2):
        task = lease_one(s, w)
        s.submit(w, task.task_id, group(s, task, 0), 0.0)
    first = s.pull_batch(0, 0.0)  # the step 0 -> 1 ...
    ahead = s.pull_batch(1, 0.0)  # ... prefetches the batch of 1, then the trainer is killed
    assert first.ready and ahead.ready and s.t_train == 1 and s.counters.consumed_groups == 2
    pending = s.ledger.pending
    # Its successor resumes from the newest published version, 0: the same batch as a retry gives.
    assert s.pull_batch(0, 1.0) is first
    assert s.t_train == 0 and s.counters.consumed_groups == 1
    assert (
        s.ledger.pending == pending + 1 and s.counters.requeued_prompts == 1
    )  # the prefetched prompt is back
    assert s.pull_batch(0, 1.0) is first
    s.announce(1)
    assert not s.pull_batch(1, 2.0).ready  # that group must be generated again
    task = lease_one(s, w, 2.0)
    s.submit(w, task.task_id, group(s, task, 1), 2.0)
    assert s.pull_batch(1, 2.0).ready
    s.announce(2)
    with pytest.raises(errors.Rejected):  # past a published version there is no going back
        s.pull_batch(0, 3.0)
    s.ledger.check()


# ------------------------------------------------------------------------------------------- status
def contract_example() -> dict[str, object]:
    text = CONTRACTS.read_text()
    match = re.search(r"GET /v1/status.*?```json\n(.*?)```", text, re.S)
    assert match, "docs/contracts.md has no status example"
    example: dict[str, object] = json.loads(match.group(1))
    return example


def keys(value: object, prefix: str = "") -> set[str]:
    if isinstance(value, dict):
        out = set()
        for k, v in value.items():
            name = "*" if k.isdigit() or prefix.endswith(("pools", "stalenessHistogram")) else k
            out |= {f"{prefix}.{name}"} | keys(v, f"{prefix}.{name}")
        return out
    if isinstance(value, list):
        return set().union(*(keys(v, f"{prefix}[]") for v in value)) if value else set()
    return set()


def test_status_document_has_exactly_the_contract_keys() -> None:
    s = make_state(config(batch_size=1))
    w = register(s)
    s.heartbeat(w, wire.HeartbeatRequest(loaded_version=0), 0.0)
    task = lease_one(s, w)
    s.submit(w, task.task_id, group(s, task, 0), 0.0)
    s.pull_batch(0, 0.0)
    doc = json.loads(report.status_document(s, 1.0, 1_800_000_000.0).model_dump_json(by_alias=True))
    assert keys(doc) == keys(contract_example())
    assert doc["workers"][0]["lastHeartbeat"].endswith("Z") and doc["pools"]["cpu"] == {
        "workers": 1,
        "minLoadedVersion": 0,
        "leases": 0,
        "quarantined": 0,
        "rejectedRollouts": {"tokenMismatch": 0, "unloadedVersion": 0},
    }
    assert doc["reward"] == 0.5 and doc["rolloutsPerSecond"] > 0


class FakeStore:
    def __init__(self, latest: int | None) -> None:
        self.latest = latest

    def latest_version(self) -> int | None:
        return self.latest


def test_restart_recovers_t_train_and_resumes_the_prompt_stream() -> None:
    assert service.recover_version(FakeStore(None)) == 0
    assert service.recover_version(None) == 0
    t = service.recover_version(FakeStore(7))
    restarted = make_state(config(batch_size=2), t_train=t)
    assert (restarted.t_train, restarted.published) == (7, 7)
    assert report.status_document(restarted, 0.0, 0.0).policy_version == 7
    # The prompt stream resumes past the 7 batches of 2 groups already consumed.
    stream = list(itertools.islice(restarted.task.prompts("train", 0), 15))
    assert lease_one(restarted, register(restarted)).prompt == stream[14].prompt


def test_config_checks() -> None:
    with pytest.raises(ValueError, match="bufferSize"):
        config(capacity=1, batch_size=2)
    with pytest.raises(ValueError, match="heartbeatInterval"):
        config(heartbeat_interval=20.0)


# ------------------------------------------------------------------------------------------- trust
def test_a_worker_holding_leases_past_the_task_timeout_again_and_again_is_quarantined() -> None:
    s = make_state(config(max_staleness=2, task_timeout=5.0, lease_timeout=10.0))
    hoarder, honest = register(s), register(s)
    now = 0.0
    for round_ in range(quarantine.HOARDING_EXPIRIES):
        assert s.lease(hoarder, 4, now).tasks, f"round {round_}: the hoarder got nothing to hoard"
        now += 6.0
        s.heartbeat(hoarder, wire.HeartbeatRequest(loaded_version=0), now)  # alive, never submitting
        s.heartbeat(honest, wire.HeartbeatRequest(loaded_version=0), now)
        s.expire(now)
    doc = report.status_document(s, now, 0.0)
    assert [q.id for q in doc.quarantined] == [hoarder] and "lease hoarding" in doc.quarantined[0].reason
    with pytest.raises(errors.Rejected) as refused:
        s.lease(hoarder, 1, now)
    assert (refused.value.status, refused.value.code) == (403, "quarantined")
    task = lease_one(s, honest, now)  # the hoarded prompts went back to the queue, for honest workers
    assert s.submit(honest, task.task_id, group(s, task, 0), now).outcome == "buffered"


def test_a_slow_worker_that_still_submits_is_not_taken_for_a_hoarder() -> None:
    s = make_state(config(max_staleness=8, capacity=40, task_timeout=5.0, lease_timeout=10.0))
    slow = register(s)
    now = 0.0
    for _ in range(2 * quarantine.HOARDING_EXPIRIES):
        assert len(s.lease(slow, 2, now).tasks) == 2
        now += 6.0
        s.heartbeat(slow, wire.HeartbeatRequest(loaded_version=0), now)
        s.expire(now)  # one lease ran over ...
        again = lease_one(s, slow, now)  # ... it is leased again and submitted this time
        s.submit(slow, again.task_id, group(s, again, 0), now)
    assert not report.status_document(s, now, 0.0).quarantined


def test_the_trainer_quarantines_a_worker_and_its_groups_leave_buffer_and_batch() -> None:
    s = make_state(config(max_staleness=1, batch_size=2, capacity=6))
    liar, honest = register(s), register(s)
    for w in (liar, honest, liar):
        task = lease_one(s, w)
        s.submit(w, task.task_id, group(s, task, 0), 0.0)
    batch = s.pull_batch(0, 0.0)  # oldest first: the liar's first group and the honest one
    assert sorted(g.worker_id for g in batch.groups) == sorted([liar, honest])
    reply = s.quarantine(wire.QuarantineRequest(worker_id=liar, reason="fabricated log-probs", version=0))
    assert (reply.dropped_groups, s.counters.dropped_quarantined, s.counters.requeued_prompts) == (2, 2, 2)
    assert s.ledger.buffered == 0 and s.counters.consumed_groups == 1
    again = s.pull_batch(0, 0.0)  # the batch was withdrawn: a retry assembles a new one
    assert again is not batch and not again.ready
    doc = report.status_document(s, 0.0, 0.0)
    assert doc.quarantined[0].id == liar and doc.pools["cpu"].quarantined == 1
    assert [w.quarantined for w in doc.workers if w.id == liar] == [True]
    with pytest.raises(errors.Rejected) as refused:
        s.heartbeat(liar, wire.HeartbeatRequest(loaded_version=0), 0.0)
    assert refused.value.code == "quarantined"


def test_groups_a_caught_worker_had_already_had_trained_on_are_counted_not_silent() -> None:
    """Its groups in batches steps took before the one it was caught in count; the withdrawn ones do not."""
    s = make_state(config(max_staleness=1, batch_size=2, capacity=8))
    liar, honest = register(s, capacity=8), register(s, capacity=8)

    def deliver(worker: str) -> None:
        task = lease_one(s, worker)
        s.submit(worker, task.task_id, group(s, task, s.published), 0.0)

    for w in (liar, liar):
        deliver(w)
    assert sorted(g.worker_id for g in s.pull_batch(0, 0.0).groups) == [liar, liar]  # trained on: step 0 → 1
    s.announce(1)
    for w in (honest, liar):
        s.heartbeat(w, wire.HeartbeatRequest(loaded_version=1), 0.0)
        deliver(w)
    caught_in = s.pull_batch(1, 0.0)  # the batch the trainer checks, and catches the liar in
    assert sorted(g.worker_id for g in caught_in.groups) == sorted([liar, honest])
    s.quarantine(wire.QuarantineRequest(worker_id=liar, reason="fabricated log-probs", version=1))
    doc = report.status_document(s, 0.0, 0.0)
    assert [(q.id, q.trained_groups) for q in doc.quarantined] == [(liar, 2)]
    exposition = metrics.render(metrics.registry_for(s, metrics.Rejections())).decode()
    assert 'groups_trained_before_quarantine_total{job="test",pool="cpu"} 2.0' in exposition


def test_a_pool_token_registers_at_most_max_workers_quarantined_ones_included() -> None:
    s = make_state(config(pool_max_workers={"cpu": 2}, pool_max_leases={"cpu": 3}))
    a, b = register(s, capacity=4), register(s, capacity=4)
    with pytest.raises(errors.Rejected) as full:
        register(s)
    assert (full.value.status, full.value.code, full.value.field) == (429, "limit", "pool")
    assert "maxWorkers is 2" in full.value.message
    assert len(s.lease(a, 4, 0.0).tasks) == 3  # maxLeases 3 for the whole pool
    assert s.lease(b, 4, 0.0).tasks == []
    s.quarantine(wire.QuarantineRequest(worker_id=a, reason="caught", version=0))
    s.leave(a)
    with pytest.raises(errors.Rejected):
        register(s)  # the quarantined worker still counts: it cannot come back under a new id
    s.leave(b)
    register(s)


def test_chat_prompts_travel_as_messages_to_workers_and_to_the_trainer() -> None:
    """A task whose prompts are chat messages (a dataset's ``messages`` field): leased, then handed to the
    trainer, as messages — and back to plain dicts for the backends."""
    from echo_runtime import tasks as tasks_mod

    inner = tasks_mod.get_task("arithmetic")
    chat = [
        dataclasses.replace(
            p, prompt=({"role": "system", "content": "Be brief."}, {"role": "user", "content": p.prompt})
        )
        for p in itertools.islice(inner.prompts("train", 0), 8)
    ]
    s = state.CoordinatorState(config(batch_size=1), inner, now=0.0, prompts=iter(chat))
    w = register(s)
    task = lease_one(s, w)
    assert isinstance(task.prompt, list) and [m.role for m in task.prompt] == ["system", "user"]
    assert wire.plain_prompt(task.prompt) == chat[0].prompt
    wire_form = json.loads(task.model_dump_json(by_alias=True))["prompt"]
    assert wire_form == [dict(m) for m in chat[0].prompt]
    right = wire.SubmitRequest(rollouts=[rollout(0, str(chat[0].answer)) for _ in range(s.config.group_size)])
    assert s.submit(w, task.task_id, right, 0.0).rewards == [1.0] * s.config.group_size
    batch = s.pull_batch(0, 0.0)
    assert batch.ready and wire.plain_prompt(batch.groups[0].prompt) == chat[0].prompt


def test_the_versions_a_worker_may_claim_stay_bounded_and_forgotten_ones_are_only_ever_dropped() -> None:
    """A worker's record of the versions it may claim does not grow with the run: versions no step can
    consume any more are forgotten. A claim of one is dropped as stale (never trained on, never counted
    as a lie), and a version inside the window it was never told of is still refused."""
    s = make_state(config(max_staleness=1, capacity=8))
    w = register(s)
    task = lease_one(s, w)  # leased at version 0, submitted long after
    for version in range(1, 301):
        s.announce(version)
        s.heartbeat(w, wire.HeartbeatRequest(loaded_version=version), float(version))
    record = s.roster.get(w)
    assert record.known_versions == {299, 300} and record.known_floor == 299  # Δmax 1: versions ≥ 300 − 1
    old = s.submit(w, task.task_id, group(s, task, 0), 301.0)  # honest, but 300 versions behind
    assert old.outcome == "dropped" and old.staleness == 300
    assert s.counters.dropped_stale == 1 and sum(s.counters.rejected.of("cpu").values()) == 0
    other = register(s, 302.0)  # told to load 300 on registering; never told of 299
    again = lease_one(s, other, 302.0)
    with pytest.raises(errors.Rejected) as refused:
        s.submit(other, again.task_id, group(s, again, 299), 302.0)
    assert (
        refused.value.field.endswith(".policyVersion")
        and "never told to load version 299" in refused.value.message
    )


def test_each_lease_gets_a_fresh_key_and_the_trainer_gets_the_key_of_the_lease_that_was_submitted() -> None:
    s = make_state(config(max_staleness=1, batch_size=2, capacity=8, task_timeout=5.0))
    w = register(s, capacity=4)
    first = s.lease(w, 2, 0.0).tasks
    keys = [t.sampling.key for t in first]
    assert all(k is not None and re.fullmatch(r"[0-9a-f]{32}", k) for k in keys) and len(set(keys)) == 2
    s.heartbeat(w, wire.HeartbeatRequest(loaded_version=0), 6.0)
    s.expire(6.0)  # both leases ran out: re-issued, with new keys
    again = s.lease(w, 2, 6.0).tasks
    assert {t.problem_id for t in again} == {t.problem_id for t in first}
    assert not {t.sampling.key for t in again} & set(keys)
    vllm = s.register(
        wire.RegisterRequest(pool="cpu", backend="vllm", device="cuda", dtype="bfloat16", capacity=2),
        b"digest",
        6.0,
    ).worker_id
    unkeyed = s.lease(vllm, 1, 6.0).tasks[0]
    s.submit(w, again[0].task_id, group(s, again[0], 0), 6.0)
    s.submit(vllm, unkeyed.task_id, group(s, unkeyed, 0), 6.0)
    batch = s.pull_batch(0, 6.0)
    by_task = {g.task_id: g.key for g in batch.groups}
    assert by_task == {again[0].task_id: again[0].sampling.key, unkeyed.task_id: None}  # vLLM draws no keys


# ------------------------------------------------------------------------------------------- engines
def test_a_worker_joins_only_with_its_pools_backend_and_dtype(tmp_path: Path) -> None:
    """The token check is judged for float32 transformers and mlx workers: a worker may not register as
    a backend or dtype its pool does not run to escape it (a pool's dtype defaults to the model's)."""
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: engines}\n"
        "spec:\n  model: {path: echorl:tiny}\n  task: {name: arithmetic}\n"
        "  inferenceSwarms:\n    - {name: cpu}\n    - {name: gpu, backend: vllm, device: cuda, dtype: bfloat16}\n"
    )
    settings = CoordinatorConfig.from_job(spec.load_job(manifest), vocab_size=VOCAB)
    assert settings.pool_engine == {"cpu": ("transformers", "float32"), "gpu": ("vllm", "bfloat16")}
    s = make_state(settings)
    joins = [
        ("cpu", "vllm", "float32", "backend"),
        ("cpu", "transformers", "bfloat16", "dtype"),
        ("gpu", "transformers", "bfloat16", "backend"),
        ("gpu", "vllm", "float32", "dtype"),
    ]
    for pool, backend, dtype, field in joins:
        req = wire.RegisterRequest(pool=pool, backend=backend, device="cpu", dtype=dtype, capacity=1)
        with pytest.raises(errors.Rejected) as refused:
            s.register(req, b"digest", 0.0)
        assert (refused.value.status, refused.value.field) == (422, field), (pool, backend, dtype)
        assert f"pool {pool!r} runs" in refused.value.message
    assert not s.roster.workers
    for pool, backend, dtype in (("cpu", "transformers", "float32"), ("gpu", "vllm", "bfloat16")):
        req = wire.RegisterRequest(pool=pool, backend=backend, device="cpu", dtype=dtype, capacity=1)
        assert s.register(req, b"digest", 0.0).worker_id in s.roster.workers


@pytest.mark.parametrize(("field", "claim"), [("backend", "vllm"), ("device", "cuda"), ("dtype", "bfloat16")])
def test_a_rollout_may_not_contradict_its_workers_registration(field: str, claim: str) -> None:
    s = make_state()
    w = register(s)
    task = lease_one(s, w)
    before = snapshot(s)
    with pytest.raises(errors.Rejected) as refused:
        s.submit(w, task.task_id, bad_group(s, task, **{field: claim}), 0.0)
    assert (refused.value.status, refused.value.field) == (422, f"rollouts[0].{field}")
    assert "may not claim another" in refused.value.message
    assert snapshot(s) == before
    same = {"backend": "transformers", "device": "cpu", "dtype": "float32"}[field]  # repeating it is fine
    assert s.submit(w, task.task_id, bad_group(s, task, **{field: same}), 0.0).outcome == "buffered"
