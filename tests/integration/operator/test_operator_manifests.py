"""manifests/ against the real API server: the kustomize base, the examples, invalid manifests, RBAC."""

from __future__ import annotations

import pathlib

import pytest
import yaml
from operator_kit import kubectl_ok

from echo_runtime import spec
from services.kube import KubeApiServer

pytestmark = pytest.mark.services

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))


def test_the_kustomize_base_installs_everything(kube_apiserver: KubeApiServer, echorl_system: None) -> None:
    for kind, name in [
        ("namespace", "echorl-system"),
        ("serviceaccount", "echorl-operator"),
        ("deployment", "echorl-operator"),
        ("clusterrole", "echorl-operator"),
        ("clusterrole", "echorl-edit"),
        ("clusterrolebinding", "echorl-operator"),
        ("clusterrole", "echorl-operator-discovery"),
        ("clusterrolebinding", "echorl-operator-discovery"),
        ("crd", "echojobs.echorl.dev"),
        ("crd", "inferenceswarms.echorl.dev"),
    ]:
        kubectl_ok(kube_apiserver, "get", "-n", "echorl-system", kind, name)


def test_the_base_installs_no_dev_minio_and_the_dev_kustomization_is_only_it(
    kube_apiserver: KubeApiServer,
) -> None:
    def built(path: pathlib.Path) -> set[tuple[str, str]]:
        proc = kube_apiserver.kubectl("kustomize", str(path))
        assert proc.returncode == 0, proc.stderr
        return {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(proc.stdout) if d}

    base, dev = built(REPO / "manifests"), built(REPO / "manifests" / "dev")
    assert not any("minio" in name for _, name in base), sorted(base)
    assert ("Deployment", "echorl-operator") in base
    assert dev == {("Deployment", "minio"), ("Service", "minio"), ("Secret", "minio-root")}


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_applies(
    kube_apiserver: KubeApiServer, kube_namespace: str, example: pathlib.Path
) -> None:
    kubectl_ok(kube_apiserver, "apply", "-n", kube_namespace, "-f", str(example))
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d and d["apiVersion"] == spec.GROUP_VERSION]
    if docs:
        spec.load_documents(yaml.safe_dump_all(docs))  # the same files pass `echorl validate`
    for doc in docs:
        kubectl_ok(kube_apiserver, "get", "-n", kube_namespace, doc["kind"].lower(), doc["metadata"]["name"])


JOB = """
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: {name}}}
spec:
  model: {{path: echorl:tiny}}
  storage: {{type: S3, endpoint: "minio:9000", bucket: echorl}}
{extra}
"""

INVALID = {
    "negative maxStaleness": (
        "  syncPolicy: {maxStaleness: -1}",
        "spec.syncPolicy.maxStaleness: Invalid value: -1: spec.syncPolicy.maxStaleness in body should be "
        "greater than or equal to 0",
    ),
    "bufferSize in Sequential mode": (
        "  syncPolicy: {mode: Sequential, bufferSize: 8}",
        'spec.syncPolicy.bufferSize: Invalid value: "object": bufferSize is only allowed in Async mode',
    ),
    "refreshThreshold above maxStaleness": (
        "  syncPolicy: {maxStaleness: 1, refreshThreshold: 2}",
        "refreshThreshold must be ≤ maxStaleness",
    ),
    "unknown mode": ("  syncPolicy: {mode: Eventually}", 'Unsupported value: "Eventually"'),
    "inline and referenced policy": (
        "  syncPolicy: {mode: Async}\n  syncPolicyRef: shared",
        'spec.syncPolicyRef: Invalid value: "object": syncPolicyRef cannot be combined with an inline syncPolicy',
    ),
    "swarmRef with inline fields": (
        "  inferenceSwarms: [{name: a, swarmRef: pool, replicas: 2}]",
        "swarmRef cannot be combined with inline pool fields",
    ),
    "duplicate pool names": ("  inferenceSwarms: [{name: a}, {name: a}]", "Duplicate value"),
    "reserved pool name": (
        "  inferenceSwarms: [{name: trainer}]",
        "pool names 'trainer' and 'coordinator', and names starting with 'scorer-', are reserved",
    ),
    "pool named like a scoring pool": (
        "  inferenceSwarms: [{name: scorer-judge}]",
        "names starting with 'scorer-', are reserved",
    ),
    "judge without a rubric": (
        "  rewardModels: [{name: j, type: Judge, model: m}]",
        "a Judge needs a rubric containing {prompt} and {completion}",
    ),
    "vllm on cpu": (
        "  inferenceSwarms: [{name: a, backend: vllm, device: cpu}]",
        'spec.inferenceSwarms[0].device: Invalid value: "object": the vllm backend needs CUDA',
    ),
    "replicas on an external pool": (
        "  inferenceSwarms: [{name: macs, backend: mlx, external: true, replicas: 2}]",
        "external pools create no pods: leave replicas unset",
    ),
    "more processes than GPUs": (
        "  trainingSwarm: {gpusPerNode: 2, processesPerNode: 4}",
        "processesPerNode must be ≤ gpusPerNode",
    ),
    "unknown field": ("  maxStalness: 3", 'unknown field "spec.maxStalness"'),
    "no pools": ("  inferenceSwarms: []", "should have at least 1 items"),
    "zero group size": ("  algorithm: {groupSize: 1}", "should be greater than or equal to 2"),
    "schedule floor above the peak": (
        "  algorithm: {learningRate: 1.0e-4, lrSchedule: Cosine, minLearningRate: 1.0e-3}",
        "minLearningRate must be ≤ learningRate",
    ),
    "unknown schedule": ("  algorithm: {lrSchedule: Exponential}", 'Unsupported value: "Exponential"'),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_manifests_are_rejected_with_a_clear_message(
    kube_apiserver: KubeApiServer, kube_namespace: str, case: str
) -> None:
    extra, message = INVALID[case]
    proc = kube_apiserver.kubectl(
        "create", "-n", kube_namespace, "-f", "-", input=JOB.format(name="bad", extra=extra)
    )
    assert proc.returncode != 0, f"{case}: accepted"
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (
            "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: local}\n",
            'spec: Invalid value: "object": required in a cluster: a storage block with type S3',
        ),
        (
            "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: local}\nspec: {model: {path: m}}\n",
            'spec.storage.type: Invalid value: "object": must be S3 in a cluster',
        ),
        (
            JOB.format(name="a-name-that-is-far-too-long-for-its-children-x", extra=""),
            "at most 40 characters",
        ),
        (JOB.format(name="1st", extra=""), "must start with a letter"),
        (
            "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: s3}\nspec: {storage: {type: S3}}\n",
            'spec.storage.endpoint: Invalid value: "object": endpoint is required when type is S3',
        ),
    ],
)
def test_cluster_only_rules(
    kube_apiserver: KubeApiServer, kube_namespace: str, manifest: str, message: str
) -> None:
    proc = kube_apiserver.kubectl("create", "-n", kube_namespace, "-f", "-", input=manifest)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("{path: echorl:tiny}", "{path: Qwen/Qwen3-0.6B}", "model is immutable once the job exists"),
        (
            "{path: echorl:tiny}",
            "{path: echorl:tiny, finetune: Full}",
            "model is immutable once the job exists",
        ),
        ("bucket: echorl", "bucket: elsewhere", "storage type, bucket, prefix and path are immutable"),
    ],
)
def test_model_and_store_are_immutable(
    kube_apiserver: KubeApiServer, kube_namespace: str, old: str, new: str, message: str
) -> None:
    kubectl_ok(
        kube_apiserver,
        "apply",
        "--server-side",
        "-n",
        kube_namespace,
        "-f",
        "-",
        input=JOB.format(name="fixed", extra=""),
    )
    changed = JOB.format(name="fixed", extra="").replace(old, new)
    proc = kube_apiserver.kubectl("apply", "--server-side", "-n", kube_namespace, "-f", "-", input=changed)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    allowed = JOB.format(name="fixed", extra="  algorithm: {learningRate: 0.001}\n  suspend: true")
    kubectl_ok(kube_apiserver, "apply", "--server-side", "-n", kube_namespace, "-f", "-", input=allowed)


ALLOWED = [
    ("patch", "deployments.apps"),
    ("create", "jobs.batch"),
    ("delete", "jobs.batch"),
    ("create", "secrets"),
    ("get", "secrets"),
    ("delete", "pods"),
    ("create", "events"),
    ("patch", "events"),
    ("patch", "echojobs.echorl.dev/status"),
    ("patch", "echojobs.echorl.dev"),
    ("watch", "inferenceswarms.echorl.dev"),
]
FORBIDDEN = [
    ("create", "pods"),
    ("create", "pods/exec"),
    ("get", "nodes"),
    ("delete", "namespaces"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("create", "roles.rbac.authorization.k8s.io"),
    ("delete", "echojobs.echorl.dev"),
    ("create", "echojobs.echorl.dev"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "persistentvolumeclaims"),
    ("create", "serviceaccounts/token"),
    ("watch", "secrets"),
]


def test_the_operator_may_do_what_it_needs_and_nothing_else(
    kube_apiserver: KubeApiServer, operator_kubeconfig: pathlib.Path, kube_namespace: str
) -> None:
    def can(verb: str, resource: str) -> bool:
        proc = kube_apiserver.kubectl(
            "auth", "can-i", verb, resource, "-n", kube_namespace, kubeconfig=operator_kubeconfig
        )
        return proc.stdout.strip() == "yes"

    assert [a for a in ALLOWED if not can(*a)] == []
    assert [f for f in FORBIDDEN if can(*f)] == []
    pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: sneaky}\nspec: {containers: [{name: c, image: busybox}]}\n"
    proc = kube_apiserver.kubectl(
        "create", "-n", kube_namespace, "-f", "-", input=pod, kubeconfig=operator_kubeconfig
    )
    assert proc.returncode != 0 and "forbidden" in proc.stderr
    proc = kube_apiserver.kubectl("get", "nodes", kubeconfig=operator_kubeconfig)
    assert proc.returncode != 0 and "forbidden" in proc.stderr
