"""The coordinator's children: its Deployment (a singleton, ``Recreate``) and Service, and
``<job>-coordinator-external`` when a pool has external workers (TLS only, port 8443, with the
certificate of :attr:`~echo_operator.children.inputs.JobInput.tls`; the coordinator then serves both
ports).

Promises: the pod restarts when the job manifest, the tokens file or the TLS certificate changes (all
three are in its spec hash), and only then; Prometheus is invited to scrape by annotation only where
``/metrics`` needs no token.
"""

from __future__ import annotations

from typing import Any

import yaml

from echo_operator import names
from echo_operator.children import inputs, manifest, pods, scorers, token_secrets
from echo_operator.config import Settings
from echo_runtime import spec as echo_spec
from echo_runtime.spec import commands

Object = dict[str, Any]


def coordinator_args(job: inputs.JobInput, settings: Settings) -> list[str]:
    """``echorl coordinator`` in its pod, listening on every address."""
    return commands.coordinator(
        pods.PROGRAM,
        job_file=pods.JOB_FILE,
        tokens_file=pods.TOKENS_FILE,
        host="0.0.0.0",
        port=names.COORDINATOR_PORT,
        metrics_auth=settings.metrics_auth,
        # TLS beside the plain port: pods in the cluster keep http, the external Service has only https.
        tls=None
        if job.tls is None
        else commands.TLSFiles(
            f"{pods.TLS_DIR}/tls.crt", f"{pods.TLS_DIR}/tls.key", names.COORDINATOR_TLS_PORT
        ),
        reward_pools={
            m.name: [names.scorer_url(job.name, job.namespace, m.name)] for m in job.spec.reward_models
        },
    )


STARTUP_WAIT = """\
import sys, time, urllib.request
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    try:
        urllib.request.urlopen(sys.argv[2], timeout=2).close()
        sys.exit(0)
    except Exception:
        time.sleep(0.2)
sys.exit(1)
"""
"""The coordinator's startup probe: waits (up to ``argv[1]`` seconds) until ``/healthz`` answers. An HTTP
probe would be refused while the coordinator starts — a kubelet ``Unhealthy`` Warning on every job
although nothing is wrong; this one fails only if the coordinator does not come up at all."""
STARTUP_WAIT_S = 110


def coordinator_deployment(job: inputs.JobInput, settings: Settings) -> Object:
    config_volume, config_mount = pods.config_volume(job)
    scratch, scratch_mounts = pods.scratch_volumes(shm=False)
    container: Object = {
        "name": "coordinator",
        "image": settings.images.coordinator,
        "imagePullPolicy": settings.image_pull_policy,
        "command": coordinator_args(job, settings),
        "ports": [{"name": "http", "containerPort": names.COORDINATOR_PORT, "protocol": "TCP"}],
        "env": pods.common_env()
        + pods.store_env(job.store, readonly=False)
        + ([scorers.token_env(job)] if job.spec.reward_models else []),
        "startupProbe": {
            "exec": {
                "command": [
                    "python",
                    "-c",
                    STARTUP_WAIT,
                    str(STARTUP_WAIT_S),
                    f"http://127.0.0.1:{names.COORDINATOR_PORT}/healthz",
                ]
            },
            "timeoutSeconds": STARTUP_WAIT_S + 10,
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
        "securityContext": pods.CONTAINER_SECURITY,
        "volumeMounts": [
            config_mount,
            {"name": "tokens", "mountPath": pods.TOKENS_DIR, "readOnly": True},
            *scratch_mounts,
        ],
    }
    volumes = [
        config_volume,
        {"name": "tokens", "secret": {"secretName": names.tokens_secret(job.name)}},
        *scratch,
    ]
    if job.tls is not None:
        container["ports"].append(
            {"name": "https", "containerPort": names.COORDINATOR_TLS_PORT, "protocol": "TCP"}
        )
        container["volumeMounts"].append({"name": "tls", "mountPath": pods.TLS_DIR, "readOnly": True})
        # Only the certificate and its key: the CA's key in the operator's Secret stays out of the pod.
        items = [{"key": k, "path": k} for k in ("tls.crt", "tls.key")]
        volumes.append({"name": "tls", "secret": {"secretName": job.tls.secret, "items": items}})
    pod_labels = names.labels(job.name, "coordinator")
    hash_ = pods.digest(
        yaml.safe_dump(manifest.process_manifest(job)),
        token_secrets.tokens_file(job),
        *([job.tls.secret, job.tls.fingerprint] if job.tls is not None else []),
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": pods.object_meta(job, names.coordinator(job.name), "coordinator"),
        "spec": {
            "replicas": pods.replicas(job, 1),
            # One coordinator per job: two at once would split the workers between two buffers.
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": names.selector(job.name, "coordinator")},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {
                        names.SPEC_HASH: hash_,
                        # An annotation-driven scrape sends no token: only where /metrics is open.
                        **(
                            {}
                            if settings.metrics_auth
                            else {
                                "prometheus.io/scrape": "true",
                                "prometheus.io/port": str(names.COORDINATOR_PORT),
                                "prometheus.io/path": "/metrics",
                            }
                        ),
                    },
                },
                "spec": pods.pod_spec([container], volumes, echo_spec.Placement()),
            },
        },
    }


def coordinator_service(job: inputs.JobInput) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pods.object_meta(job, names.coordinator(job.name), "coordinator"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector(job.name, "coordinator"),
            "ports": [
                {"name": "http", "port": names.COORDINATOR_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def coordinator_external_service(job: inputs.JobInput, settings: Settings) -> Object | None:
    """The Service external workers reach the coordinator through (None if not wanted)."""
    if not job.has_external_pools or settings.external_service_type == "None":
        return None
    port = names.COORDINATOR_TLS_PORT if job.tls is not None else names.COORDINATOR_PORT
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pods.object_meta(job, names.coordinator_external(job.name), "coordinator"),
        "spec": {
            "type": settings.external_service_type,
            "selector": names.selector(job.name, "coordinator"),
            # Outside the cluster nothing else protects the tokens and rollouts: TLS only there.
            "ports": [
                {"name": "https", "port": port, "targetPort": "https", "protocol": "TCP"}
                if job.tls is not None
                else {"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }
