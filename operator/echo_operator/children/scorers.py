"""A reward model's scoring pool: ``<job>-scorer-<model>`` Deployment (``echorl scorer``) and Service.

The coordinator calls the Service (``--reward-model <model>=http://<job>-scorer-<model>.<ns>.svc:8710``)
with the scoring token of ``<job>-scorer-token``, which the scorer pods check; no worker holds it.
Scaled like a pool: ``replicas`` (0 while the job is suspended or over), its own image, placement,
resources and ``podTemplate``; the ready probe waits for the model to be loaded.
"""

from __future__ import annotations

import json
from typing import Any

from echo_operator import names
from echo_operator.children import inputs, pods
from echo_operator.config import Settings
from echo_runtime import rewards
from echo_runtime import spec as echo_spec
from echo_runtime.spec import commands

Object = dict[str, Any]


def scorer_args(job: inputs.JobInput, model: echo_spec.RewardModel) -> list[str]:
    return commands.scorer(
        pods.PROGRAM, model, job_file=pods.JOB_FILE, port=names.SCORER_PORT, host="0.0.0.0"
    )


def token_env(job: inputs.JobInput) -> Object:
    """The scoring token, for the scorer pods and the coordinator."""
    return pods.secret_env(rewards.TOKEN_ENV, names.role_secret(job.name, names.SCORER_ROLE), "token")


def scorer_children(job: inputs.JobInput, model: echo_spec.RewardModel, settings: Settings) -> list[Object]:
    name = names.scorer(job.name, model.name)
    gpu = model.device == "cuda"
    config_volume, config_mount = pods.config_volume(job)
    scratch, scratch_mounts = pods.scratch_volumes(shm=gpu)
    env = [*pods.common_env(), token_env(job)]
    if model.threads is not None:
        env.append({"name": "OMP_NUM_THREADS", "value": str(model.threads)})
    container: Object = {
        "name": "scorer",
        "image": model.image or settings.images.worker("transformers", model.device),
        "imagePullPolicy": settings.image_pull_policy,
        "command": scorer_args(job, model),
        "ports": [{"name": "http", "containerPort": names.SCORER_PORT, "protocol": "TCP"}],
        "env": env,
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
        "resources": pods.container_resources(model.resources, gpus=1 if gpu else 0),
        "securityContext": pods.CONTAINER_SECURITY,
        "volumeMounts": [config_mount, *scratch_mounts],
    }
    body = model.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"replicas"})
    pod_meta, pod = pods.templated(
        model.pod_template,
        {
            "labels": names.labels(job.name, "scorer", model.name),
            "annotations": {names.SPEC_HASH: pods.digest(model.name, json.dumps(body, sort_keys=True))},
        },
        pods.pod_spec([container], [config_volume, *scratch], model, terminationGracePeriodSeconds=30),
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": pods.object_meta(job, name, "scorer", model.name),
        "spec": {
            "replicas": model.replicas if job.active else 0,
            "selector": {"matchLabels": names.selector(job.name, "scorer", model.name)},
            "template": {"metadata": pod_meta, "spec": pod},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pods.object_meta(job, name, "scorer", model.name),
        "spec": {
            "selector": names.selector(job.name, "scorer", model.name),
            "ports": [{"name": "http", "port": names.SCORER_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return [service, deployment]
