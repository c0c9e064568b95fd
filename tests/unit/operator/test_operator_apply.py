"""Apply and prune: what happens to the trainer gang, which children stay, what a scale says."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from echo_operator import apply, children, names
from echo_operator.children import inputs
from echo_operator.config import Settings

MakeJob = Callable[..., inputs.JobInput]  # the make_job fixture (tests/unit/operator/conftest.py)


def trainer(spec_hash: str | None = "h1", **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "demo-trainer", "uid": "t-1", "annotations": {}}
    if spec_hash is not None:
        meta["annotations"][names.SPEC_HASH] = spec_hash
    return {"kind": "Job", "metadata": meta, "status": status}


def wanted_trainer(spec_hash: str = "h1") -> dict[str, Any]:
    return {"kind": "Job", "metadata": {"name": "demo-trainer", "annotations": {names.SPEC_HASH: spec_hash}}}


def test_a_missing_trainer_is_created() -> None:
    assert apply.trainer_action(None, wanted_trainer()) == "create"


def test_an_unchanged_trainer_is_left_alone() -> None:
    assert apply.trainer_action(trainer("h1"), wanted_trainer("h1")) is None


def test_a_changed_trainer_is_replaced_whole() -> None:
    assert apply.trainer_action(trainer("h1"), wanted_trainer("h2")) == "replace"
    assert apply.trainer_action(trainer(None), wanted_trainer("h2")) == "replace"


def test_a_terminating_trainer_is_left_to_finish_even_if_it_changed() -> None:
    current = trainer("h1")
    current["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert apply.trainer_action(current, wanted_trainer("h2")) is None


def test_what_stays(make_job: MakeJob) -> None:
    job = make_job()
    wanted = [{"kind": "ConfigMap", "metadata": {"name": "demo-config"}}]
    kept = apply.keep(job, wanted)
    assert ("ConfigMap", "demo-config") in kept
    for role in ("trainer", "gpu", "cpu", "mac", "shared"):
        assert ("Secret", f"demo-{role}-join") in kept
    assert ("Secret", "demo-storage-readonly") in kept
    # The status token is kept too: pruned, it would be made anew each pass, rolling the coordinator.
    assert ("Secret", "demo-status-token") in kept and ("Secret", "demo-status-join") not in kept
    assert ("Job", "demo-trainer") not in kept  # not wanted (say, suspended) and not finished
    assert ("Job", "demo-trainer") in apply.keep(dataclasses.replace(job, finished=True), wanted)


def obj(kind: str, name: str, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"u-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"kind": kind, "metadata": meta}


def test_prune_deletes_what_is_not_kept_except_a_trainer_already_going() -> None:
    existing = {
        ("Deployment", "demo-old"): obj("Deployment", "demo-old"),
        ("Deployment", "demo-cpu"): obj("Deployment", "demo-cpu"),
        ("Job", "demo-trainer"): obj("Job", "demo-trainer", deleting=True),
        ("Service", "demo-gone"): obj("Service", "demo-gone", deleting=True),
    }
    kept = {("Deployment", "demo-cpu")}
    assert apply.prune(existing, kept) == [("Deployment", "demo-old"), ("Service", "demo-gone")]
    assert apply.prune(existing, set(existing)) == []


def test_a_suspended_job_prunes_its_running_trainer(make_job: MakeJob) -> None:
    job = make_job()
    suspended = dataclasses.replace(job, spec=job.spec.model_copy(update={"suspend": True}))
    wanted = children.desired(suspended, Settings())
    existing = {
        children.key(o): {**o, "metadata": {**o["metadata"], "uid": "x"}}
        for o in children.desired(job, Settings())
    }
    assert apply.prune(existing, apply.keep(suspended, wanted)) == [("Job", "demo-trainer")]


def deployment(replicas: int | None, pool: str | None = "cpu") -> dict[str, Any]:
    labels = {names.POOL: pool} if pool else {}
    return {
        "kind": "Deployment",
        "metadata": {"name": "demo-cpu", "labels": labels},
        "spec": {"replicas": replicas},
    }


def test_a_scale_is_said_with_the_pools_name() -> None:
    assert apply.scaled_message(deployment(1), deployment(4)) == "pool cpu: 1 → 4 replica(s)"
    assert (
        apply.scaled_message(deployment(2, pool=None), deployment(0, pool=None))
        == "demo-cpu: 2 → 0 replica(s)"
    )


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (deployment(3), deployment(3)),
        (
            {"kind": "Service", "metadata": {"name": "s"}, "spec": {}},
            {"kind": "Service", "metadata": {"name": "s"}, "spec": {"replicas": 1}},
        ),
    ],
)
def test_no_scale_no_message(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert apply.scaled_message(before, after) is None


def test_summary() -> None:
    assert apply.summary("created", ["Secret a", "Service b"]) == "created 2 object(s): Secret a, Service b"
    assert apply.summary("deleted", iter([])) == "deleted 0 object(s): "


def suspend(job: inputs.JobInput, value: bool = True) -> inputs.JobInput:
    return dataclasses.replace(job, spec=job.spec.model_copy(update={"suspend": value}))


def pool_deployment(job: inputs.JobInput, pool: str) -> dict[str, Any]:
    return next(o for o in children.desired(job, Settings()) if o["metadata"]["name"] == f"demo-{pool}")


def stored(replicas: int, held: str | None = None) -> dict[str, Any]:
    annotations = {names.RESUME_REPLICAS: held} if held is not None else {}
    return {"kind": "Deployment", "metadata": {"annotations": annotations}, "spec": {"replicas": replicas}}


def test_suspending_keeps_what_a_pool_without_replicas_was_scaled_to(make_job: MakeJob) -> None:
    job = suspend(make_job())  # pool cpu: replicas unset; pool gpu: replicas 3
    cpu = pool_deployment(job, "cpu")
    assert apply.held_replicas(job, cpu, stored(4)) == 4  # scaled to 4 by hand or an HPA
    assert apply.held_replicas(job, cpu, stored(0, held="4")) == 4  # every later pass while suspended
    assert apply.held_replicas(job, cpu, stored(0)) is None  # it stood at zero: nothing to keep
    assert apply.held_replicas(job, cpu, None) is None  # created suspended (Kueue): nothing to keep
    assert apply.held_replicas(job, cpu, stored(0, held="junk")) is None


def test_nothing_is_kept_where_the_spec_says_what_comes_back(make_job: MakeJob) -> None:
    job = suspend(make_job())
    assert apply.held_replicas(job, pool_deployment(job, "gpu"), stored(5)) is None
    coordinator = next(
        o for o in children.desired(job, Settings()) if o["metadata"]["name"] == "demo-coordinator"
    )
    assert apply.held_replicas(job, coordinator, stored(1)) is None
    running = make_job()
    assert apply.held_replicas(running, pool_deployment(running, "cpu"), stored(4)) is None


def test_a_finished_job_keeps_them_too(make_job: MakeJob) -> None:
    job = dataclasses.replace(make_job(), finished=True)
    assert apply.held_replicas(job, pool_deployment(job, "cpu"), stored(2)) == 2


def test_resuming_gives_back_what_was_kept(make_job: MakeJob) -> None:
    job = suspend(make_job(), False)
    cpu = pool_deployment(job, "cpu")
    assert apply.to_restore(job, cpu, stored(0, held="4")) == 4
    assert apply.to_restore(job, cpu, stored(0)) is None
    assert apply.to_restore(job, cpu, None) is None
    assert apply.to_restore(job, pool_deployment(job, "gpu"), stored(0, held="4")) is None  # spec: 3
    assert apply.to_restore(suspend(job), cpu, stored(0, held="4")) is None  # still suspended


def test_what_is_kept_rides_on_the_applied_deployment(make_job: MakeJob) -> None:
    job = suspend(make_job())
    cpu = pool_deployment(job, "cpu")
    held = apply.with_held(cpu, 4)
    assert held["metadata"]["annotations"] == {names.RESUME_REPLICAS: "4"}
    assert held["spec"] == cpu["spec"] and held["spec"]["replicas"] == 0
    assert names.RESUME_REPLICAS not in (cpu["metadata"].get("annotations") or {})  # not modified
    assert apply.with_held(cpu, None) is cpu


def test_the_restore_apply_names_only_the_replicas() -> None:
    obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "demo-cpu", "namespace": "ml", "labels": {}},
        "spec": {"template": {}},
    }
    assert apply.restore(obj, 4) == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "demo-cpu", "namespace": "ml"},
        "spec": {"replicas": 4},
    }
