"""Reference resolution: which objects a job references, and which jobs a changed object concerns."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from echo_operator import references
from echo_runtime import spec


def job(**job_spec: Any) -> spec.EchoJob:
    body = {
        "metadata": {"name": "j", "namespace": "ml"},
        "spec": {"storage": {"type": "S3", "endpoint": "s3:9000", "bucket": "snaps"}, **job_spec},
    }
    return references.parse_job(body)


def test_a_job_without_references_wants_nothing() -> None:
    assert references.wanted(job()) == []


def test_references_are_listed_in_spec_order_each_once() -> None:
    model = job(
        syncPolicyRef="strict",
        trainingSwarmRef="a100",
        inferenceSwarms=[
            {"name": "one", "swarmRef": "cpu-pool"},
            {"name": "two", "backend": "vllm"},
            {"name": "three", "swarmRef": "cpu-pool"},
            {"name": "four", "swarmRef": "gpu-pool"},
        ],
    )
    assert references.wanted(model) == [
        ("SyncPolicy", "strict"),
        ("TrainingSwarm", "a100"),
        ("InferenceSwarm", "cpu-pool"),
        ("InferenceSwarm", "gpu-pool"),
    ]


def test_an_invalid_spec_is_a_validation_error() -> None:
    with pytest.raises(pydantic.ValidationError):
        references.parse_job({"metadata": {"name": "j", "namespace": "ml"}, "spec": {"storage": 3}})


def test_the_missing_message_names_every_missing_object_and_the_namespace() -> None:
    message = references.missing_message([("SyncPolicy", "strict"), ("InferenceSwarm", "gpus")], "ml")
    assert message.startswith("SyncPolicy 'strict', InferenceSwarm 'gpus' not found in namespace ml")
    assert "fix the reference" in message


@pytest.mark.parametrize(
    ("job_spec", "kind", "name", "expected"),
    [
        ({"syncPolicyRef": "strict"}, "SyncPolicy", "strict", True),
        ({"syncPolicyRef": "strict"}, "SyncPolicy", "loose", False),
        ({"syncPolicyRef": "strict"}, "TrainingSwarm", "strict", False),
        ({"trainingSwarmRef": "a100"}, "TrainingSwarm", "a100", True),
        ({"inferenceSwarms": [{"name": "p", "swarmRef": "cpu"}]}, "InferenceSwarm", "cpu", True),
        ({"inferenceSwarms": [{"name": "cpu"}]}, "InferenceSwarm", "cpu", False),  # a pool's own name
        ({"inferenceSwarms": None}, "InferenceSwarm", "cpu", False),
        ({}, "SyncPolicy", "strict", False),
    ],
)
def test_refers(job_spec: dict[str, Any], kind: str, name: str, expected: bool) -> None:
    assert references.refers({"spec": job_spec}, kind, name) is expected


def test_a_job_without_spec_refers_to_nothing() -> None:
    assert not references.refers({"metadata": {}}, "SyncPolicy", "x")


def test_the_manifest_form_carries_the_objects_own_name() -> None:
    out = references.manifest("SyncPolicy", "strict", "ml", None)
    assert out == {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "SyncPolicy",
        "metadata": {"name": "strict", "namespace": "ml"},
        "spec": {},
    }


# ---------------------------------------------------------------------------------------------
# A shared InferenceSwarm's replicas: the total, split over the running jobs that use it


def stored(name: str, *pools: str, suspend: bool = False, ended: str | None = None) -> dict[str, Any]:
    conditions = [{"type": ended, "status": "True"}] if ended else []
    return {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"suspend": suspend, "inferenceSwarms": [{"name": p, "swarmRef": "shared"} for p in pools]},
        "status": {"conditions": conditions},
    }


@pytest.mark.parametrize("total", [0, 1, 2, 5, 6, 7, 100])
@pytest.mark.parametrize("jobs", [1, 2, 3, 4])
def test_the_shares_add_up_to_the_total_and_differ_by_at_most_one(total: int, jobs: int) -> None:
    users = [(f"job-{i}", "cpu") for i in range(jobs)]
    shares = [references.share(total, users, u) for u in users]
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)  # the remainder goes to the first names


def test_only_running_jobs_share_the_swarm_and_the_reconciled_body_wins() -> None:
    jobs = [
        stored("a", "cpu"),
        stored("b", "cpu", "more"),  # two pools of one job on the same swarm: two shares
        stored("c", "cpu", suspend=True),
        stored("d", "cpu", ended="Succeeded"),
        stored("e", "cpu", ended="Failed"),
        {**stored("f", "cpu"), "metadata": {"name": "f", "namespace": "ml", "deletionTimestamp": "now"}},
        stored("g"),  # uses no shared swarm
    ]
    assert references.swarm_users(jobs, "shared", "a", jobs[0]) == [("a", "cpu"), ("b", "cpu"), ("b", "more")]
    # The job being reconciled is read from its newest body: suspending it takes it out.
    assert references.swarm_users(jobs, "shared", "a", stored("a", "cpu", suspend=True)) == [
        ("b", "cpu"),
        ("b", "more"),
    ]
    assert references.swarm_users(jobs, "other", "a", jobs[0]) == []
