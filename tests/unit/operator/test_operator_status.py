"""Status, conditions and Δmax enforcement, computed from a coordinator status document."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from operator_scenarios import doc, observation, worker

from echo_operator import conditions, pool_lag
from echo_operator import status as status_mod
from echo_operator.children import inputs
from echo_operator.conditions import Condition
from echo_runtime.coordinator import wire
from echo_runtime.spec import SyncPolicySpec


def by_type(conds: list[Condition]) -> dict[str, Condition]:
    return {c.type: c for c in conds}


# ---------------------------------------------------------------------------------------------
# Status fields


def test_status_fields_come_from_the_coordinator_and_the_deployments(make_job: Any) -> None:
    mac = worker("mac-1", "mac", 16, external=True)
    obs = observation(
        make_job, coordinator=doc(workers=[worker("w1", "gpu", 16), worker("w2", "cpu", 15), mac])
    )
    out = status_mod.job_status(obs)
    assert out["observedGeneration"] == 3
    assert (out["mode"], out["maxStaleness"]) == ("Async", 2)
    assert (out["policyVersion"], out["maxObservedStaleness"], out["droppedStale"]) == (17, 2, 4)
    assert (out["weightedStale"], out["reward"], out["rolloutsPerSecond"]) == (1, 0.42, 41.5)
    pools = {p["name"]: p for p in out["pools"]}
    assert list(pools) == ["gpu", "cpu", "mac", "shared"]
    assert pools["gpu"] == {
        "name": "gpu",
        "replicas": 3,
        "readyReplicas": 2,
        "pending": 0,
        "workers": 1,
        "observedPolicyVersion": 16,
        "quarantined": 0,
        "externalWorkers": [],
    }
    assert pools["mac"]["externalWorkers"] == [
        {
            "id": "mac-1",
            "backend": "mlx",
            "device": "mps",
            "loadedVersion": 16,
            "lastHeartbeat": "2026-11-29T19:00:00Z",
        }
    ]
    assert pools["shared"]["workers"] == 0 and pools["shared"]["observedPolicyVersion"] is None


def test_last_coordinator_values_are_kept_while_it_cannot_be_read(make_job: Any) -> None:
    previous = {"policyVersion": 9, "reward": 0.3, "droppedStale": 2, "maxObservedStaleness": 1}
    out = status_mod.job_status(
        observation(make_job, coordinator=None, coordinator_error="refused"), previous
    )
    assert (out["policyVersion"], out["reward"], out["droppedStale"], out["maxObservedStaleness"]) == (
        9,
        0.3,
        2,
        1,
    )
    assert out["rolloutsPerSecond"] is None


def test_max_observed_staleness_survives_a_coordinator_restart(make_job: Any) -> None:
    # A restarted coordinator has consumed nothing yet (None), then less than its predecessor did (1).
    for since_restart in (None, 1):
        obs = observation(make_job, coordinator=doc(max_observed=since_restart, max_staleness=2))
        assert status_mod.job_status(obs, {"maxObservedStaleness": 2})["maxObservedStaleness"] == 2
        bounded = by_type(status_mod.conditions(obs, {"maxObservedStaleness": 2}))["StalenessBounded"]
        assert (bounded.status, bounded.message.split(" ≤")[0]) == ("True", "max observed staleness 2")
    # A larger value since the restart wins, and one the run broke before stays broken.
    grown = observation(make_job, coordinator=doc(max_observed=2, max_staleness=2))
    assert status_mod.job_status(grown, {"maxObservedStaleness": 1})["maxObservedStaleness"] == 2
    broken = by_type(
        status_mod.conditions(
            observation(make_job, coordinator=doc(max_observed=0)), {"maxObservedStaleness": 3}
        )
    )
    assert (broken["StalenessBounded"].reason, broken["Degraded"].reason) == (
        "BoundExceeded",
        "BoundExceeded",
    )
    fresh = observation(make_job, coordinator=doc(max_observed=None))
    assert status_mod.job_status(fresh, {})["maxObservedStaleness"] is None


def test_differs_ignores_absent_versus_none() -> None:
    assert not status_mod.differs({"a": 1, "b": None}, {"a": 1})
    assert status_mod.differs({"a": 1}, {"a": 2})
    assert not status_mod.differs({"p": [{"x": None, "y": 1}]}, {"p": [{"y": 1}]})


# ---------------------------------------------------------------------------------------------
# Conditions


def test_all_good(make_job: Any) -> None:
    conds = by_type(status_mod.conditions(observation(make_job)))
    assert [c for c in conds] == [
        "Ready",
        "Progressing",
        "StalenessBounded",
        "LearningSignal",
        "Degraded",
        "Suspended",
    ]
    assert (conds["LearningSignal"].status, conds["LearningSignal"].reason) == ("True", "SignalPresent")
    assert (conds["Ready"].status, conds["Ready"].reason) == ("True", "AllComponentsReady")
    assert (conds["Progressing"].status, conds["Progressing"].reason) == ("True", "Training")
    assert "policy version 17 of 100" in conds["Progressing"].message
    assert (conds["StalenessBounded"].status, conds["StalenessBounded"].reason) == ("True", "WithinBound")
    assert (conds["Degraded"].status, conds["Suspended"].status) == ("False", "False")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"coordinator": None, "coordinator_error": "connection refused"}, "CoordinatorNotReady"),
        ({"trainer": {"spec": {"replicas": 2}, "status": {"readyReplicas": 1}}}, "TrainerNotReady"),
        (
            {
                "trainer": {
                    "kind": "Job",
                    "spec": {"parallelism": 1},
                    "status": {"ready": 0, "conditions": [{"type": "Complete", "status": "True"}]},
                }
            },
            "TrainerFinished",
        ),
        ({"coordinator": doc(workers=[worker("w1", "gpu", 16)])}, "PoolsNotReady"),
        ({"job": None}, "Reconciling"),
        ({"suspended": True}, "Suspended"),
        (
            {"faults": (status_mod.Fault("ReferenceNotFound", "SyncPolicy 'x' not found"),)},
            "ReferenceNotFound",
        ),
    ],
)
def test_not_ready_says_why(make_job: Any, change: dict[str, Any], reason: str) -> None:
    ready = by_type(status_mod.conditions(observation(make_job, **change)))["Ready"]
    assert (ready.status, ready.reason) == ("False", reason)
    assert ready.message


def test_pools_scaled_to_zero_and_external_pools_do_not_block_ready(make_job: Any, hetero_text: str) -> None:
    job = make_job(hetero_text.replace("replicas: 3", "replicas: 0"))
    obs = observation(
        make_job, job=job, coordinator=doc(workers=[worker("w2", "cpu", 15), worker("w3", "shared", 16)])
    )
    obs = status_mod.Observation(**{**obs.__dict__, "deployments": {}})
    assert by_type(status_mod.conditions(obs))["Ready"].status == "True"


def test_completed_and_suspended(make_job: Any) -> None:
    done = by_type(status_mod.conditions(observation(make_job, coordinator=doc(t=100))))
    assert (done["Progressing"].status, done["Progressing"].reason) == ("False", "Completed")
    suspended = by_type(status_mod.conditions(observation(make_job, suspended=True, coordinator=None)))
    assert (suspended["Suspended"].status, suspended["Suspended"].reason) == ("True", "JobSuspended")
    assert suspended["Progressing"].reason == "Suspended"
    assert suspended["Degraded"].status == "False"


def test_staleness_bound_false_names_the_pools_that_cannot_keep_up(make_job: Any) -> None:
    d = doc(t=17, workers=[worker("w1", "gpu", 10, stuck=True), worker("w2", "cpu", 16)])
    behind = pool_lag.pools_behind(d, SyncPolicySpec(max_staleness=2))
    cond = by_type(
        status_mod.conditions(observation(make_job, coordinator=d, behind=behind, restarted=("p1",)))
    )
    bounded = cond["StalenessBounded"]
    assert (bounded.status, bounded.reason) == ("False", "PoolFallingBehind")
    assert "pool gpu is at policy version 10 while t_train is 17" in bounded.message
    assert "stuck worker(s): w1" in bounded.message and "restarted 1 stuck worker pod(s)" in bounded.message
    assert "cpu" not in bounded.message.split(":")[0]


def test_a_broken_bound_is_loud(make_job: Any) -> None:
    cond = by_type(
        status_mod.conditions(observation(make_job, coordinator=doc(max_observed=3, max_staleness=2)))
    )
    assert (cond["StalenessBounded"].status, cond["StalenessBounded"].reason) == ("False", "BoundExceeded")
    assert (cond["Degraded"].status, cond["Degraded"].reason) == ("True", "BoundExceeded")


def test_unreachable_coordinator_with_a_ready_pod_is_degraded(make_job: Any) -> None:
    ready = {"demo-coordinator": {"spec": {"replicas": 1}, "status": {"readyReplicas": 1}}}
    obs = observation(
        make_job, coordinator=None, coordinator_error="timed out", deployments=ready, unreadable_s=31
    )
    degraded = by_type(status_mod.conditions(obs))["Degraded"]
    assert (degraded.status, degraded.reason) == ("True", "CoordinatorUnreachable")
    assert "timed out" in degraded.message and "for 31 s" in degraded.message
    # A new operator's first read, or one while the coordinator restarts: not (yet) a problem.
    brief = observation(
        make_job, coordinator=None, coordinator_error="refused", deployments=ready, unreadable_s=0.2
    )
    assert by_type(status_mod.conditions(brief))["Degraded"].status == "False"
    starting = observation(make_job, coordinator=None, coordinator_error="refused", deployments={})
    assert by_type(status_mod.conditions(starting))["Degraded"].status == "False"


def test_a_finished_trainer_is_news_not_a_warning() -> None:
    """Between the trainer's last step and Succeeded, Ready turns False for a good reason: a Normal event."""
    before = [{"type": "Ready", "status": "True", "reason": "AllComponentsReady"}]
    finished = conditions.transitions(before, [Condition("Ready", "False", "TrainerFinished", "done")])
    crashed = conditions.transitions(before, [Condition("Ready", "False", "TrainerNotReady", "0 of 1")])
    assert [t.warning for t in finished] == [False] and [t.warning for t in crashed] == [True]


def test_merge_keeps_transition_times_while_status_holds() -> None:
    first = conditions.merge([], [Condition("Ready", "False", "CoordinatorNotReady", "wait")], 1, "T1")
    assert first == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "CoordinatorNotReady",
            "message": "wait",
            "lastTransitionTime": "T1",
            "observedGeneration": 1,
        }
    ]
    same = conditions.merge(first, [Condition("Ready", "False", "TrainerNotReady", "1 of 2")], 2, "T2")
    assert same[0]["lastTransitionTime"] == "T1" and same[0]["reason"] == "TrainerNotReady"
    assert same[0]["observedGeneration"] == 2
    flipped = conditions.merge(same, [Condition("Ready", "True", "AllComponentsReady", "up")], 2, "T3")
    assert flipped[0]["lastTransitionTime"] == "T3"
    foreign = [*flipped, {"type": "Custom", "status": "True", "reason": "X"}]
    kept = conditions.merge(foreign, [Condition("Ready", "True", "AllComponentsReady", "up")], 2, "T4")
    assert kept[1] == {"type": "Custom", "status": "True", "reason": "X"}


def test_transitions_are_news_only_when_something_changed() -> None:
    before = conditions.merge(
        [],
        [
            Condition("Ready", "False", "CoordinatorNotReady", "m"),
            Condition("StalenessBounded", "True", "WithinBound", "m"),
        ],
        1,
        "T",
    )
    assert conditions.transitions([], [Condition("Ready", "False", "CoordinatorNotReady", "m")]) == []
    assert (
        conditions.transitions(before, [Condition("Ready", "False", "CoordinatorNotReady", "other msg")])
        == []
    )
    (change,) = conditions.transitions(
        before, [Condition("StalenessBounded", "False", "PoolFallingBehind", "m")]
    )
    assert change.warning and change.previous_status == "True"
    (back,) = conditions.transitions(before, [Condition("Ready", "True", "AllComponentsReady", "m")])
    assert not back.warning
    # A recovery is news of its own, and a Normal one: Degraded back to False after an unreachable coordinator.
    degraded = conditions.merge([], [Condition("Degraded", "True", "CoordinatorUnreachable", "m")], 1, "T")
    (recovered,) = conditions.transitions(degraded, [Condition("Degraded", "False", "AsExpected", "")])
    assert not recovered.warning and recovered.previous_status == "True"
    (suspended,) = conditions.transitions(
        conditions.merge([], [Condition("Suspended", "False", "NotSuspended", "")], 1, "T"),
        [Condition("Suspended", "True", "JobSuspended", "")],
    )
    assert not suspended.warning


# ---------------------------------------------------------------------------------------------
# Δmax enforcement


def test_pools_behind_use_the_staleness_rule_per_mode() -> None:
    d = doc(t=10, workers=[worker("a", "gpu", 8), worker("b", "cpu", 7), worker("c", "mac", None)])
    assert set(pool_lag.pools_behind(d, SyncPolicySpec(mode="Async", max_staleness=2))) == {"cpu"}
    assert set(pool_lag.pools_behind(d, SyncPolicySpec(mode="Async", max_staleness=3))) == set()
    seq = SyncPolicySpec(mode="Sequential", max_staleness=3, refresh_threshold=1)
    assert set(pool_lag.pools_behind(d, seq)) == {"gpu", "cpu"}  # Sequential's bound is refreshThreshold
    lag = pool_lag.pools_behind(d, seq)["cpu"]
    assert (lag.staleness, lag.bound) == (3, 1)
    assert "refreshThreshold 1" in lag.describe("Sequential")


def test_a_stuck_worker_puts_its_pool_behind_even_within_the_bound() -> None:
    d = doc(t=10, workers=[worker("a", "gpu", 10, stuck=True)])
    assert pool_lag.pools_behind(d, SyncPolicySpec(max_staleness=2))["gpu"].stuck == ("a",)


def test_only_a_persistent_lag_counts() -> None:
    since = pool_lag.track({"gpu"}, {}, now=100.0)
    assert pool_lag.cannot_keep_up(since, 110.0, grace_s=30.0) == []
    since = pool_lag.track({"gpu", "cpu"}, since, now=131.0)
    assert since == {"gpu": 100.0, "cpu": 131.0}
    assert pool_lag.cannot_keep_up(since, 131.0, grace_s=30.0) == ["gpu"]
    assert pool_lag.track({"cpu"}, since, now=140.0) == {"cpu": 131.0}  # gpu caught up: forgotten


class HostedWorker(wire.WorkerStatus):
    """A worker as reported once the status document carries the worker's host (its pod name)."""

    host: str | None = None


def test_restarts_only_our_stuck_pods_and_not_too_often() -> None:
    workers = [
        worker("demo-gpu-7d9-abcde", "gpu", 3, stuck=True),
        worker("w-2", "gpu", 3, stuck=True, host="demo-gpu-7d9-fghij"),
        worker("w-3", "gpu", 3, stuck=True, host="someone-else"),
        worker("mac-1", "mac", 3, stuck=True, external=True),
        worker("demo-cpu-1", "cpu", 16),
    ]
    d = doc().model_copy(update={"workers": [HostedWorker.model_validate(w) for w in workers]})
    pods = {"gpu": ["demo-gpu-7d9-abcde", "demo-gpu-7d9-fghij"], "cpu": ["demo-cpu-1"]}
    out = pool_lag.restarts(d, pods, {}, now=100.0, cooldown_s=60.0)
    assert [(r.pool, r.pod, r.worker, r.loaded_version) for r in out] == [
        ("gpu", "demo-gpu-7d9-abcde", "demo-gpu-7d9-abcde", 3),
        ("gpu", "demo-gpu-7d9-fghij", "w-2", 3),
    ]
    again = pool_lag.restarts(d, pods, {"demo-gpu-7d9-abcde": 80.0}, now=100.0, cooldown_s=60.0)
    assert [r.pod for r in again] == ["demo-gpu-7d9-fghij"]
    assert [w.id for w in pool_lag.stuck_external(d)] == ["mac-1"]


def test_quarantined_workers_degrade_the_job_and_are_counted(make_job: Any) -> None:
    caught = doc(workers=[worker("w1", "gpu", 16)]).model_copy(
        update={
            "quarantined": [
                wire.QuarantinedWorker(
                    id="w9",
                    pool="gpu",
                    reason="made-up log-probs",
                    mismatch=0.8,
                    version=12,
                    trained_groups=3,
                )
            ],
            "pools": {"gpu": wire.PoolSummary(workers=1, min_loaded_version=16, quarantined=1)},
        }
    )
    obs = observation(make_job, coordinator=caught)
    out = status_mod.job_status(obs)
    assert out["quarantinedWorkers"] == 1
    assert {p["name"]: p["quarantined"] for p in out["pools"]}["gpu"] == 1
    degraded = {c.type: c for c in status_mod.conditions(obs)}["Degraded"]
    assert (degraded.status, degraded.reason) == ("True", "WorkersQuarantined")
    assert "w9 (pool gpu, 3 group(s) trained on before it was caught): made-up log-probs" in degraded.message


def test_learning_signal_follows_the_coordinators_warnings(make_job: Any) -> None:
    quiet = doc().model_copy(
        update={
            "warnings": [
                "no learning signal: the last 7 batches held only groups whose rewards were all equal"
            ]
        }
    )
    conds = by_type(status_mod.conditions(observation(make_job, coordinator=quiet)))
    learning = conds["LearningSignal"]
    assert (learning.status, learning.reason) == ("False", "NoSignal")
    assert "last 7 batches" in learning.message
    filtered = doc().model_copy(
        update={"warnings": ["nearly every group is filtered: 63 of the last 64 had equal rewards"]}
    )
    assert by_type(status_mod.conditions(observation(make_job, coordinator=filtered)))[
        "LearningSignal"
    ].reason == ("NearlyAllFiltered")
    # While the coordinator cannot be read the last verdict stands; the transition is a Warning Event.
    previous = {
        "conditions": [{"type": "LearningSignal", "status": "False", "reason": "NoSignal", "message": "m"}]
    }
    gone = by_type(
        status_mod.conditions(observation(make_job, coordinator=None, coordinator_error="x"), previous)
    )
    assert (gone["LearningSignal"].status, gone["LearningSignal"].reason) == ("False", "NoSignal")
    before = [{"type": "LearningSignal", "status": "True", "reason": "SignalPresent", "message": ""}]
    changes = conditions.transitions(before, [learning])
    assert len(changes) == 1 and changes[0].warning


def test_pods_ready_needs_every_deployment_at_its_replicas_and_every_trainer_rank(make_job: Any) -> None:
    def dep(replicas: int, ready: int) -> dict[str, Any]:
        return {"spec": {"replicas": replicas}, "status": {"replicas": replicas, "readyReplicas": ready}}

    trainer = {"kind": "Job", "spec": {"parallelism": 2}, "status": {"ready": 2}}
    ready = {"demo-coordinator": dep(1, 1), "demo-gpu": dep(3, 3)}
    assert status_mod.pods_ready(observation(make_job, deployments=ready, trainer=trainer))
    for change in (
        {"deployments": {**ready, "demo-gpu": dep(3, 2)}},  # a worker not ready
        {"deployments": {"demo-gpu": dep(3, 3)}},  # no coordinator
        {"trainer": {**trainer, "status": {"ready": 1}}},  # one rank of two
        {"trainer": None},
        {"suspended": True, "job": dataclasses.replace(make_job(), held=inputs.Hold("Queued", "waiting"))},
    ):
        kw: dict[str, Any] = {"deployments": ready, "trainer": trainer, **change}
        assert not status_mod.pods_ready(observation(make_job, **kw)), change
    done = {**trainer, "status": {"ready": 0, "conditions": [{"type": "Complete", "status": "True"}]}}
    assert status_mod.pods_ready(observation(make_job, deployments=ready, trainer=done))
