"""``<job>-config``: the self-contained job manifest every Echo process of the job reads.

Promises: what only the operator acts on (placement, replicas, suspend, the lifecycle fields) is left
out, so scaling a pool, moving it to other nodes or suspending the job does not change this file
(which would roll the coordinator and the trainer); the same input gives byte-identical YAML.
"""

from __future__ import annotations

from typing import Any

import yaml

from echo_operator import names
from echo_operator.children import inputs, pods
from echo_runtime import spec as echo_spec

Object = dict[str, Any]


_PLACEMENT = frozenset(
    {"image", "resources", "node_selector", "tolerations", "affinity", "pod_template", "gpus_per_replica"}
)


_OPERATOR_ONLY = {
    "suspend", "backoff_limit", "ttl_seconds_after_finished", "active_deadline_seconds", "oom_policy",
    "managed_by",
}  # fmt: skip
"""Spec fields only the operator acts on: changing them restarts no process."""


def process_manifest(job: inputs.JobInput) -> Object:
    """The self-contained EchoJob every Echo process of the job reads from ``<job>-config``.

    References are resolved; what only the operator uses (placement, replicas, suspend, the
    lifecycle fields) is left out, so that scaling a pool or moving it to other nodes does not change this file, which would
    roll the coordinator and the trainer.
    """
    keep_training = set(echo_spec.TrainingSwarmSpec.model_fields) - _PLACEMENT
    keep_pool = set(echo_spec.InferenceSwarmSpec.model_fields) - _PLACEMENT - {"replicas"}
    keep_scorer = set(echo_spec.RewardModel.model_fields) - _PLACEMENT - {"replicas"}
    body = echo_spec.EchoJobSpec(
        model=job.spec.model,
        task=job.spec.task,
        algorithm=job.spec.algorithm,
        sync_policy=job.sync_policy,
        storage=job.spec.storage,
        training_swarm=echo_spec.TrainingSwarmSpec(**{k: getattr(job.training, k) for k in keep_training}),
        inference_swarms=[
            echo_spec.InferencePool(name=p.name, **{k: getattr(p.spec, k) for k in keep_pool})
            for p in job.pools
        ],
        reward_models=[
            echo_spec.RewardModel(**{k: getattr(m, k) for k in keep_scorer}) for m in job.spec.reward_models
        ],
    )
    manifest = echo_spec.EchoJob(
        metadata=echo_spec.ObjectMeta(name=job.name, namespace=job.namespace), spec=body
    ).model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"spec": _OPERATOR_ONLY})
    return dict(pods.drop_empty(manifest))


def config_map(job: inputs.JobInput) -> Object:
    text = yaml.safe_dump(process_manifest(job), sort_keys=False, allow_unicode=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": pods.object_meta(job, names.config(job.name), "config"),
        "data": {"job.yaml": text},
    }
