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
    return {p.path: p.message for p in info.value.findings}


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
    found = problems_of("apiVersion: echorl.dev/v1\nkind: EchoJob\nmetadata: {name: x}\n")
    assert found["apiVersion"] == "must be 'echorl.dev/v1alpha1', got 'echorl.dev/v1'"
    found = problems_of("apiVersion: echorl.dev/v1alpha1\nkind: Pod\nmetadata: {name: x}\n")
    assert found["kind"].startswith("must be one of EchoJob, InferenceSwarm")


def test_documents_of_other_kinds_are_skipped_and_listed() -> None:
    secret = "apiVersion: v1\nkind: Secret\nmetadata: {name: creds}\nstringData: {accessKey: a}\n"
    hpa = "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: scale}\n"
    read = spec.read_documents(secret + "---\n" + MINIMAL + "---\n" + hpa)
    assert [(m.kind, m.metadata.name) for m in read.manifests] == [("EchoJob", "demo")]
    assert read.skipped == ["Secret/creds", "HorizontalPodAutoscaler/scale"]
    assert spec.read_documents(secret).manifests == []


@pytest.mark.parametrize(
    ("snippet", "path", "needle"),
    [
        ('inferenceSwarms: [{name: a, replicas: "2"}]', "spec.inferenceSwarms[0].replicas", "an integer"),
        ("inferenceSwarms: [{name: a, replicas: 2.5}]", "spec.inferenceSwarms[0].replicas", "an integer"),
        ("inferenceSwarms: [{name: a, replicas: true}]", "spec.inferenceSwarms[0].replicas", "an integer"),
        (
            'storage: {type: S3, endpoint: e, bucket: abc, secure: "false"}',
            "spec.storage.secure",
            "true or false",
        ),
        ("suspend: 0", "spec.suspend", "true or false"),
        ('algorithm: {learningRate: "1e-4"}', "spec.algorithm.learningRate", "a number"),
        ("algorithm: {clipRange: true}", "spec.algorithm.clipRange", "a number"),
        ("syncPolicy: {maxStaleness: 1.5}", "spec.syncPolicy.maxStaleness", "an integer"),
    ],
)
def test_scalars_are_as_strict_as_the_crd_schema(snippet: str, path: str, needle: str) -> None:
    found = problems_of(MINIMAL + "spec:\n  " + snippet + "\n")
    assert path in found, found
    assert needle in found[path]


def test_numbers_are_read_as_kubectl_reads_them() -> None:
    # PyYAML's YAML 1.1 reads 1e-5 (no dot) as a string; kubectl's YAML reads it as a number.
    (job,) = spec.load_documents(
        MINIMAL + "spec:\n  algorithm: {learningRate: 1e-5, minLearningRate: 2E-6}\n"
    )
    assert isinstance(job, spec.EchoJob)
    assert job.spec.algorithm.learning_rate == pytest.approx(1e-5)
    assert job.spec.algorithm.min_learning_rate == pytest.approx(2e-6)
    (job,) = spec.load_documents(MINIMAL + "spec:\n  algorithm: {learningRate: 1}\n")
    assert isinstance(job, spec.EchoJob) and job.spec.algorithm.learning_rate == 1.0  # an integer is a number


def test_integral_floats_and_nulls_are_read_as_the_api_server_reads_them() -> None:
    # kubectl sends `2.0` as 2; the API server prunes `key: null` and then applies the default.
    text = (
        MINIMAL + "spec:\n  inferenceSwarms: [{name: a, replicas: 2.0}]\n  syncPolicy: {maxStaleness: null}\n"
    )
    assert problems_of(text) == {"spec.syncPolicy.maxStaleness": "must be an integer, got None"}
    (job,) = spec.load_documents(text.replace("maxStaleness: null", "mode: Async"))
    assert isinstance(job, spec.EchoJob) and job.spec.inference_swarms[0].replicas == 2
    cluster = text + "  model: {path: m}\n  storage: {type: S3, endpoint: e, bucket: abc, region: null}\n"
    (job,) = spec.load_documents(cluster, cluster=True)
    assert isinstance(job, spec.EchoJob) and job.spec.sync_policy is not None
    assert job.spec.sync_policy.max_staleness == 1


def test_one_wrong_field_gives_one_problem() -> None:
    assert problems_of(MINIMAL + "spec:\n  syncPolicy: {maxStaleness: -1}\n").keys() == {
        "spec.syncPolicy.maxStaleness"
    }
    assert problems_of(MINIMAL + "spec:\n  algorithm: {learningRate: -1e-5}\n").keys() == {
        "spec.algorithm.learningRate"
    }
    found = problems_of(MINIMAL + "spec:\n  storage: {type: S3}\n")
    assert found == {"spec.storage.endpoint": "required when type is S3 (and so is bucket)"}
    found = problems_of(MINIMAL + "spec:\n  storage: {type: S3, endpoint: e}\n")
    assert found == {"spec.storage.bucket": "required when type is S3"}


CLUSTER_JOB = """
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: NAME}
spec:
  model: {path: Qwen/Qwen3-0.6B}
  storage: {type: S3, endpoint: "minio:9000", bucket: echorl}
"""


def cluster_problems_of(text: str) -> dict[str, str]:
    spec.load_documents(text)  # valid for `echorl run`
    with pytest.raises(spec.ManifestError) as info:
        spec.load_documents(text, cluster=True)
    return {p.path: p.message for p in info.value.findings}


def test_a_complete_cluster_job_passes_the_cluster_rules() -> None:
    (job,) = spec.load_documents(CLUSTER_JOB.replace("NAME", "a" * 40), cluster=True)
    assert job.metadata.name == "a" * 40


@pytest.mark.parametrize(
    ("text", "path", "needle"),
    [
        (CLUSTER_JOB.replace("NAME", "a" * 41), "metadata.name", "got 41 characters"),
        (CLUSTER_JOB.replace("NAME", "9lives"), "metadata.name", "must start with a letter"),
        (MINIMAL, "spec", "required in a cluster"),
        (MINIMAL + "spec: {model: {path: m}}\n", "spec.storage", "required in a cluster"),
        (
            MINIMAL + "spec:\n  model: {path: m}\n  storage: {type: Local}\n",
            "spec.storage.type",
            "must be S3",
        ),
        (
            CLUSTER_JOB.replace("NAME", "j").replace("  model: {path: Qwen/Qwen3-0.6B}\n", ""),
            "spec.model.path",
            "required",
        ),
        (
            CLUSTER_JOB.replace("NAME", "j") + "  inferenceSwarms: [{name: a}, {name: coordinator}]\n",
            "spec.inferenceSwarms[1].name",
            "reserved",
        ),
        (
            CLUSTER_JOB.replace("NAME", "j") + "  inferenceSwarms: [{name: trainer}]\n",
            "spec.inferenceSwarms[0].name",
            "reserved",
        ),
        (
            CLUSTER_JOB.replace("NAME", "j") + "  syncPolicy: {mode: Colocated, maxStaleness: 0}\n",
            "spec.syncPolicy.mode",
            "local-only",
        ),
        (
            MINIMAL.replace("EchoJob", "SyncPolicy") + "spec: {mode: Colocated, maxStaleness: 0}\n",
            "spec.mode",
            "local-only",
        ),
    ],
)
def test_cluster_only_rules(text: str, path: str, needle: str) -> None:
    found = cluster_problems_of(text)
    assert path in found, found
    assert needle in found[path]


def test_cluster_rules_report_every_problem_of_a_job() -> None:
    text = MINIMAL.replace("demo", "0" + "x" * 45) + "spec:\n  inferenceSwarms: [{name: coordinator}]\n"
    assert set(cluster_problems_of(text)) == {
        "metadata.name",
        "spec.storage",
        "spec.model.path",
        "spec.inferenceSwarms[0].name",
    }


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
    by_doc = {(p.document, p.path) for p in info.value.findings}
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
    (problem,) = info.value.findings
    assert problem.path == "spec.inferenceSwarms[0].swarmRef"
    assert "'nope'" in problem.message


def test_models_carry_descriptions_for_the_crd_schema() -> None:
    schema = spec.SyncPolicySpec.model_json_schema(by_alias=True)
    props = schema["properties"]
    assert "Δmax" in props["maxStaleness"]["description"]
    assert props["maxStaleness"]["minimum"] == 0
    assert props["staleAction"]["enum"] == ["Drop", "ImportanceWeight"]
