"""Fixtures for the operator's unit tests: resolved jobs built from YAML, as the reconciler builds them."""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Callable

import pytest

from echo_operator.children import inputs
from echo_runtime import spec

HETEROGENEOUS = """
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: demo, namespace: ml}
spec:
  storage: {type: S3, endpoint: "minio:9000", bucket: echorl, credentialsSecret: creds, secure: false}
  syncPolicy: {mode: Async, maxStaleness: 2}
  trainingSwarm:
    nodes: 2
    processesPerNode: 2
    gpusPerNode: 2
    nodeSelector: {echorl.dev/pool: train}
  inferenceSwarms:
  - name: gpu
    backend: vllm
    replicas: 3
    nodeSelector: {nvidia.com/gpu.product: H100}
    tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
    resources: {requests: {cpu: "8", memory: 64Gi}}
    affinity:
      nodeAffinity:
        required: [{matchExpressions: [{key: zone, operator: In, values: [a, b]}]}]
        preferred: [{weight: 10, preference: {matchExpressions: [{key: spot, operator: DoesNotExist}]}}]
  - name: cpu
    threads: 4
    resources: {requests: {cpu: "4"}, limits: {memory: 8Gi}}
  - name: mac
    backend: mlx
    external: true
  - name: shared
    swarmRef: shared-pool
---
apiVersion: echorl.dev/v1alpha1
kind: InferenceSwarm
metadata: {name: shared-pool, namespace: ml}
spec: {backend: transformers, device: cpu, replicas: 2, image: "registry.local/echorl-cpu:dev"}
"""

MakeJob = Callable[..., inputs.JobInput]


def build_job(text: str = HETEROGENEOUS, uid: str = "uid-1", **store: str | None) -> inputs.JobInput:
    docs = spec.load_documents(textwrap.dedent(text))
    job = next(d for d in docs if isinstance(d, spec.EchoJob))
    resolved = spec.resolve(job, docs)
    roles = ["trainer", "status", *(name for name, _ in resolved.inference_pools)]
    digests = {role: hashlib.sha256(role.encode()).hexdigest() for role in roles}
    wiring = inputs.StoreWiring(secret=store.get("secret", "creds"), readonly_secret=store.get("readonly"))
    return inputs.JobInput.from_resolved(resolved, uid, digests, wiring)


@pytest.fixture
def make_job() -> MakeJob:
    """``make_job(yaml=HETEROGENEOUS, uid=..., secret=..., readonly=...)`` → a JobInput."""
    return build_job


@pytest.fixture
def hetero_text() -> str:
    """The heterogeneous job above: a vLLM GPU pool, a CPU pool, an external Mac pool, a shared swarm."""
    return HETEROGENEOUS
