"""The trainer as a gang: an indexed Job with one pod per node (``completions = parallelism = nodes``)
and ``backoffLimit: 0``, and the headless Service its ranks meet through.

One failed rank fails the whole Job and the Job controller stops the others; the operator then
restarts every rank together (:mod:`echo_operator.lifecycle`). torch.distributed meets at rank 0's
stable DNS name (``<job>-trainer-0.<job>-trainer``: the Job names pods' hostnames by index, the
Service is their subdomain); ``NODE_RANK`` is the completion index. A Job's pod template is
immutable, so a changed spec hash means a new Job, every rank restarting from the last checkpoint.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from echo_operator import names
from echo_operator.children import inputs, manifest, pods
from echo_operator.config import Settings
from echo_runtime import tracking
from echo_runtime.spec import commands

Object = dict[str, Any]


def trainer_args(job: inputs.JobInput) -> list[str]:
    """``echorl trainer``, under torchrun when the group has more than one process."""
    return commands.trainer(
        pods.PROGRAM,
        job.training,
        job_file=pods.JOB_FILE,
        coordinator_url=names.coordinator_url(job.name, job.namespace),
        # A restarted trainer (node lost, spec changed, resumed from suspend) continues from the
        # newest checkpoint in the store instead of refusing to overwrite it.
        resume=True,
    )


def rendezvous_env(job: inputs.JobInput) -> list[Object]:
    """torch.distributed environment: rank 0's stable DNS name, world shape, this pod's node rank."""
    t = job.training
    master = f"{names.trainer(job.name)}-0.{names.trainer(job.name)}.{job.namespace}.svc"
    return [
        {"name": "MASTER_ADDR", "value": master},
        {"name": "MASTER_PORT", "value": str(names.RENDEZVOUS_PORT)},
        {"name": "NNODES", "value": str(t.nodes)},
        {"name": "NPROC_PER_NODE", "value": str(t.processes_per_node)},
        # The Job controller labels each pod of an indexed Job with its completion index.
        pods.field_env("NODE_RANK", f"metadata.labels['{names.JOB_INDEX_LABEL}']"),
    ]


def trainer_pod_spec(job: inputs.JobInput, settings: Settings) -> Object:
    t = job.training
    config_volume, config_mount = pods.config_volume(job)
    gpus = t.gpus_per_node
    scratch, scratch_mounts = pods.scratch_volumes(shm=gpus > 0 or t.processes_per_node > 1)
    env = (
        pods.common_env()
        + rendezvous_env(job)
        + [
            pods.secret_env(commands.TRAINER_TOKEN_ENV, names.trainer_join_secret(job.name), "token"),
            *pods.store_env(job.store, readonly=False),
        ]
    )
    if t.threads is not None:
        env.append({"name": "OMP_NUM_THREADS", "value": str(t.threads)})
    if t.tracking.report_to:
        # One tracker run per EchoJob object: a restarted trainer reports to the same run.
        env.append({"name": tracking.RUN_ID_ENV, "value": f"{job.name}-{job.uid[:8]}"})
    container: Object = {
        "name": "trainer",
        "image": t.image or settings.images.trainer,
        "imagePullPolicy": settings.image_pull_policy,
        "command": trainer_args(job),
        "ports": [{"name": "rendezvous", "containerPort": names.RENDEZVOUS_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": pods.container_resources(t.resources, gpus=gpus),
        "securityContext": pods.CONTAINER_SECURITY,
        # A failed trainer's last log lines become its termination message: the operator quotes
        # them in the EchoJob's Failed condition without reading logs.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [config_mount, *scratch_mounts],
    }
    if (
        t.tracking.secret_name is not None
    ):  # the trackers' credentials (WANDB_API_KEY, MLFLOW_TRACKING_URI...)
        container["envFrom"] = [{"secretRef": {"name": t.tracking.secret_name}}]
    return pods.pod_spec(
        [container],
        [config_volume, *scratch],
        t,
        restartPolicy="Never",
        subdomain=names.trainer(job.name),
        terminationGracePeriodSeconds=60,
    )


def trainer_job(job: inputs.JobInput, settings: Settings) -> Object:
    """The trainer gang: an indexed Job, one pod per node, failing (and restarted) as a whole."""
    nodes = job.training.nodes
    pod_meta, pod = pods.templated(
        job.training.pod_template,
        {"labels": names.labels(job.name, "trainer")},
        trainer_pod_spec(job, settings),
    )
    # A Job's pod template is immutable: a new hash means a new Job (every rank restarts together,
    # from the last checkpoint).
    labels = [json.dumps(pod_meta, sort_keys=True)] if job.training.pod_template is not None else []
    hash_ = pods.digest(
        yaml.safe_dump(manifest.process_manifest(job)), json.dumps(pod, sort_keys=True), *labels
    )
    pod_meta["annotations"] = {**pod_meta.get("annotations", {}), names.SPEC_HASH: hash_}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            **pods.object_meta(job, names.trainer(job.name), "trainer"),
            "annotations": {names.SPEC_HASH: hash_},
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            # One failed rank fails the Job, and the Job controller stops the other ranks: the
            # operator restarts them all (counting spec.backoffLimit) rather than one at a time.
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [
                    {
                        # Evicted or preempted, not broken: fail the Job with reason PodFailurePolicy,
                        # which the operator restarts without counting it as a failure.
                        "action": "FailJob",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    }
                ]
            },
            "podReplacementPolicy": "Failed",
            "template": {"metadata": pod_meta, "spec": pod},
        },
    }


def trainer_service(job: inputs.JobInput) -> Object:
    """Headless Service: stable per-pod DNS names for the rendezvous, ready or not."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pods.object_meta(job, names.trainer(job.name), "trainer"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": names.selector(job.name, "trainer"),
            "ports": [
                {
                    "name": "rendezvous",
                    "port": names.RENDEZVOUS_PORT,
                    "targetPort": "rendezvous",
                    "protocol": "TCP",
                }
            ],
        },
    }
