"""An inference pool's Deployment: one per in-cluster pool, with that pool's image, node selector,
tolerations, affinity and resources (``nvidia.com/gpu`` added for GPU pools).

Promises: a pool whose ``replicas`` is unset leaves the field unowned, so ``kubectl scale`` or an HPA
on the Deployment is not fought; scaling a pool never rolls its pods (``replicas`` is not in their
spec hash); a GPU pool is replaced in place (``maxSurge: 0``) rather than surging onto a free GPU; an
external pool has no Deployment.
"""

from __future__ import annotations

import json
from typing import Any

from echo_operator import names
from echo_operator.children import inputs, pods
from echo_operator.config import Settings
from echo_runtime import spec as echo_spec
from echo_runtime.spec import commands

Object = dict[str, Any]


def is_gpu_pool(pool: echo_spec.InferenceSwarmSpec) -> bool:
    return pool.backend == "vllm" or pool.device == "cuda"


def worker_args(job: inputs.JobInput, pool: inputs.Pool) -> list[str]:
    """The ``echorl worker`` command line of a pool (the join token comes from ``ECHORL_TOKEN``)."""
    return commands.worker(
        pods.PROGRAM,
        pool.name,
        pool.spec,
        job_file=pods.JOB_FILE,
        coordinator_url=names.coordinator_url(job.name, job.namespace),
    )


def pool_hash(pool: inputs.Pool) -> str:
    """Hash of what a pool's pods run: its spec without ``replicas`` (scaling must not roll pods)."""
    body = pool.spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"replicas"})
    return pods.digest(pool.name, json.dumps(body, sort_keys=True))


def pool_deployment(job: inputs.JobInput, pool: inputs.Pool, settings: Settings) -> Object | None:
    """The Deployment of one in-cluster pool; None for an external pool (it has no pods)."""
    p = pool.spec
    if p.external:
        return None
    gpu = is_gpu_pool(p)
    config_volume, config_mount = pods.config_volume(job)
    scratch, scratch_mounts = pods.scratch_volumes(shm=gpu)
    env = [
        *pods.common_env(),
        pods.secret_env(commands.WORKER_TOKEN_ENV, names.join_secret(job.name, pool.name), "token"),
        *pods.store_env(job.store, readonly=True),
    ]
    threads = commands.worker_threads(p, None)
    if threads is not None:
        env.append({"name": "OMP_NUM_THREADS", "value": str(threads)})
    container: Object = {
        "name": "worker",
        "image": p.image or settings.images.worker(p.backend, p.device),
        "imagePullPolicy": settings.image_pull_policy,
        "command": worker_args(job, pool),
        "env": env,
        "resources": pods.container_resources(p.resources, gpus=(p.gpus_per_replica or 1) if gpu else 0),
        "securityContext": pods.CONTAINER_SECURITY,
        "volumeMounts": [config_mount, *scratch_mounts],
    }
    pod_meta, pod = pods.templated(
        p.pod_template,
        {
            "labels": names.labels(job.name, "inference", pool.name, pool.swarm),
            "annotations": {names.SPEC_HASH: pool_hash(pool)},
        },
        pods.pod_spec([container], [config_volume, *scratch], p, terminationGracePeriodSeconds=30),
    )
    deployment_spec: Object = {}
    if not job.active:
        deployment_spec["replicas"] = 0
    elif p.replicas is not None:
        deployment_spec["replicas"] = p.replicas
    # else: the field stays unowned, so `kubectl scale deployment` or an HPA may own it.
    deployment_spec.update(
        {
            "revisionHistoryLimit": 3,
            # GPUs are scarce: replace a GPU worker in place rather than surging onto a free GPU.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}
                if gpu
                else {"maxSurge": "25%", "maxUnavailable": "25%"},
            },
            "selector": {"matchLabels": names.selector(job.name, "inference", pool.name)},
            "template": {"metadata": pod_meta, "spec": pod},
        }
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": pods.object_meta(
            job, names.pool(job.name, pool.name), "inference", pool.name, pool.swarm
        ),
        "spec": deployment_spec,
    }
