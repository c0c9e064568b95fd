"""Manifest loading: defaults that make a minimal job work, and every problem reported by path."""

from __future__ import annotations

import textwrap

import pytest

from echo_runtime import spec

MINIMAL = """
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: demo}
"""


def problems_of(text: str) -> dict[str, str]:
    with pytest.raises(spec.ManifestError) as info:
        spec.load_documents(textwrap.dedent(text))
    return {p.path: p.message for p in info.value.problems}


def test_minimal_manifest_gets_working_defaults() -> None:
    (job,) = spec.load_documents(MINIMAL)
    assert isinstance(job, spec.EchoJob)
    resolved = spec.resolve(job)
    assert resolved.name == "demo"
    assert resolved.spec.model.path == "echorl:tiny"
    assert resolved.sync_policy.mode == "Async"
    assert resolved.sync_policy.max_staleness == 1
    assert resolved.training_swarm.nodes == 1
    assert [name for name, _ in resolved.inference_pools] == ["default"]
    assert resolved.inference_pools[0][1].backend == "transformers"
    assert resolved.spec.storage.type == "Local"


def test_camel_case_keys_round_trip() -> None:
    text = MINIMAL + "spec:\n  syncPolicy: {mode: Sequential, maxStaleness: 0}\n  algorithm: {groupSize: 4}\n"
    (job,) = spec.load_documents(text)
    assert isinstance(job, spec.EchoJob)
    dumped = job.to_manifest()
    assert dumped["spec"]["syncPolicy"]["maxStaleness"] == 0
    assert dumped["spec"]["algorithm"]["groupSize"] == 4
    (again,) = spec.load_documents(__import__("yaml").safe_dump(dumped))
    assert again == job


def test_every_problem_is_reported_with_its_path() -> None:
    found = problems_of(
        MINIMAL
        + """
spec:
  model: {dtype: int8}
  algorithm: {groupSize: many, learningRate: -1}
  syncPolicy: {maxStaleness: -1, mode: Eventually}
  inferenceSwarms:
    - {name: gpu, backend: tensorrt}
"""
    )
    assert found["spec.syncPolicy.maxStaleness"] == "must be ≥ 0, got -1"
    assert "'Sequential'" in found["spec.syncPolicy.mode"] and "'Eventually'" in found["spec.syncPolicy.mode"]
    assert found["spec.algorithm.groupSize"] == "must be an integer, got 'many'"
    assert found["spec.algorithm.learningRate"].startswith("must be > 0")
    assert "'int8'" in found["spec.model.dtype"]
    assert "'vllm'" in found["spec.inferenceSwarms[0].backend"]
    assert len(found) == 6


def test_unknown_field_suggests_the_closest_name() -> None:
    found = problems_of(MINIMAL + "spec:\n  syncPolicy: {maxStalenes: 3}\n")
    assert found == {"spec.syncPolicy.maxStalenes": "unknown field (did you mean 'maxStaleness'?)"}


def test_missing_required_fields() -> None:
    found = problems_of("apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\n")
    assert found == {"metadata": "required field is missing"}
    found = problems_of(MINIMAL + "spec:\n  inferenceSwarms: [{backend: mlx}]\n")
    assert found == {"spec.inferenceSwarms[0].name": "required field is missing"}


def test_wrong_api_version_and_kind() -> None:
    found = problems_of("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n")
    assert found["apiVersion"] == "must be 'echorl.dev/v1alpha1', got 'v1'"
    assert found["kind"].startswith("must be one of EchoJob, InferenceSwarm")


@pytest.mark.parametrize(
    ("snippet", "path", "needle"),
    [
        (
            "syncPolicy: {maxStaleness: 1, refreshThreshold: 2}",
            "spec.syncPolicy.refreshThreshold",
            "≤ maxStaleness (1)",
        ),
        (
            "syncPolicy: {mode: Sequential, bufferSize: 8}",
            "spec.syncPolicy.bufferSize",
            "only allowed in Async",
        ),
        ("storage: {type: S3, bucket: abc}", "spec.storage.endpoint", "required when type is S3"),
        (
            "inferenceSwarms: [{name: a, backend: vllm, device: cpu}]",
            "spec.inferenceSwarms[0].device",
            "CUDA",
        ),
        (
            "inferenceSwarms: [{name: a, external: true, replicas: 3}]",
            "spec.inferenceSwarms[0].replicas",
            "external",
        ),
        (
            "inferenceSwarms: [{name: a, swarmRef: s, backend: mlx}]",
            "spec.inferenceSwarms[0].swarmRef",
            "backend",
        ),
        ("inferenceSwarms: [{name: a}, {name: a}]", "spec.inferenceSwarms", "appears twice"),
        ("inferenceSwarms: []", "spec.inferenceSwarms", "at least 1"),
        ("syncPolicyRef: p\n  syncPolicy: {}", "spec.syncPolicyRef", "cannot be combined"),
        (
            "trainingSwarm: {gpusPerNode: 2, processesPerNode: 4}",
            "spec.trainingSwarm.processesPerNode",
            "≤ gpusPerNode",
        ),
        ("task: {name: 'not a task!'}", "spec.task.name", "pattern"),
        ("model: {lora: {rank: 0}}", "spec.model.lora.rank", "≥ 1"),
        (
            "algorithm: {learningRate: 1.0e-4, minLearningRate: 1.0e-3}",
            "spec.algorithm.minLearningRate",
            "≤ learningRate (0.0001)",
        ),
    ],
)
def test_cross_field_rules(snippet: str, path: str, needle: str) -> None:
    found = problems_of(MINIMAL + "spec:\n  " + snippet + "\n")
    assert path in found, found
    assert needle in found[path]


def test_metadata_name_must_be_a_dns_label() -> None:
    found = problems_of("apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: Bad_Name}\n")
    assert "DNS-1123" in found["metadata.name"]


def test_problems_in_several_documents_are_all_reported() -> None:
    text = (
        MINIMAL
        + "spec: {suspend: maybe}\n---\n"
        + MINIMAL.replace("EchoJob", "SyncPolicy")
        + ("spec: {maxStaleness: -2}\n")
    )
    with pytest.raises(spec.ManifestError) as info:
        spec.load_documents(text)
    by_doc = {(p.document, p.path) for p in info.value.problems}
    assert by_doc == {(0, "spec.suspend"), (1, "spec.maxStaleness")}


def test_invalid_yaml_is_reported_not_raised_raw() -> None:
    with pytest.raises(spec.ManifestError, match="not valid YAML"):
        spec.load_documents("a: [unclosed\n")


def test_references_resolve_within_a_file() -> None:
    text = """
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: demo}
spec:
  syncPolicyRef: shared
  trainingSwarmRef: trainers
  inferenceSwarms: [{name: cpu, replicas: 2}, {name: macs, swarmRef: macs}]
---
apiVersion: echorl.dev/v1alpha1
kind: SyncPolicy
metadata: {name: shared}
spec: {mode: Sequential, maxStaleness: 0}
---
apiVersion: echorl.dev/v1alpha1
kind: InferenceSwarm
metadata: {name: macs}
spec: {backend: mlx, external: true}
---
apiVersion: echorl.dev/v1alpha1
kind: TrainingSwarm
metadata: {name: trainers}
spec: {nodes: 2, checkpointInterval: 5}
"""
    manifests = spec.load_documents(text)
    job = next(m for m in manifests if isinstance(m, spec.EchoJob))
    resolved = spec.resolve(job, manifests)
    assert resolved.sync_policy.mode == "Sequential"
    assert resolved.training_swarm.nodes == 2
    pools = dict(resolved.inference_pools)
    assert pools["cpu"].replicas == 2 and pools["cpu"].backend == "transformers"
    assert pools["macs"].backend == "mlx" and pools["macs"].external


def test_missing_reference_names_the_field() -> None:
    (job,) = spec.load_documents(MINIMAL + "spec:\n  inferenceSwarms: [{name: a, swarmRef: nope}]\n")
    assert isinstance(job, spec.EchoJob)
    with pytest.raises(spec.ManifestError) as info:
        spec.resolve(job)
    (problem,) = info.value.problems
    assert problem.path == "spec.inferenceSwarms[0].swarmRef"
    assert "'nope'" in problem.message


def test_models_carry_descriptions_for_the_crd_schema() -> None:
    schema = spec.SyncPolicySpec.model_json_schema(by_alias=True)
    props = schema["properties"]
    assert "Δmax" in props["maxStaleness"]["description"]
    assert props["maxStaleness"]["minimum"] == 0
    assert props["staleAction"]["enum"] == ["Drop", "ImportanceWeight"]
