"""The pieces every pod of a job is built from: metadata and owner references, environment, volumes,
security contexts, placement, the merge of a user's ``podTemplate``, and where files are mounted.

Promises: every pod runs as a non-root user on a read-only root filesystem with all capabilities
dropped and no service-account token (no Echo process talks to the Kubernetes API); writable scratch
is ``/tmp`` and ``/cache`` (and a memory-backed ``/dev/shm`` for GPU/NCCL processes); the job
manifest is mounted read-only at :data:`JOB_FILE`. Pure: new objects every call.
"""

from __future__ import annotations

import base64
import copy
import hashlib
from typing import Any

from echo_operator import names
from echo_operator.children import inputs
from echo_runtime import spec as echo_spec
from echo_runtime.spec import commands, podtemplate
from echo_runtime.spec.podtemplate import PodTemplate

Object = dict[str, Any]


CONFIG_DIR = "/etc/echorl/job"


TOKENS_DIR = "/etc/echorl/tokens"


TLS_DIR = "/etc/echorl/tls"


JOB_FILE = f"{CONFIG_DIR}/job.yaml"


TOKENS_FILE = f"{TOKENS_DIR}/tokens.yaml"


GPU = "nvidia.com/gpu"


def _torchrun(swarm: echo_spec.TrainingSwarmSpec) -> tuple[str, ...]:
    """torchrun across the trainer's pods: the world's shape and rank 0's address from
    :func:`.trainer.rendezvous_env` (Kubernetes expands ``$(VAR)`` in a command from the container's env)."""
    return (
        "torchrun", "--no-python", "--nnodes=$(NNODES)", "--nproc-per-node=$(NPROC_PER_NODE)",
        "--node-rank=$(NODE_RANK)", "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)", "echorl",
    )  # fmt: skip


PROGRAM = commands.Program(echorl=("echorl",), torchrun=_torchrun)
"""``echorl`` as the images install it (`command`, not `args`: the whole argv, whatever the entrypoint)."""


def owner_reference(job: inputs.JobInput) -> Object:
    return {
        "apiVersion": echo_spec.GROUP_VERSION,
        "kind": "EchoJob",
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(
    job: inputs.JobInput,
    name: str,
    component: names.Component,
    pool: str | None = None,
    swarm: str | None = None,
) -> Object:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": names.labels(job.name, component, pool, swarm),
        "ownerReferences": [owner_reference(job)],
    }


def digest(*parts: str) -> str:
    """Short stable hash of the given texts (for the pod-template ``spec-hash`` annotation)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def container_resources(resources: echo_spec.Resources, gpus: int = 0) -> Object:
    """Container resources; ``gpus`` > 0 adds ``nvidia.com/gpu`` unless the spec already sets it."""
    requests = dict(resources.requests)
    limits = dict(resources.limits)
    if gpus and GPU not in limits and GPU not in requests:
        limits[GPU] = str(gpus)
    out: Object = {}
    if requests:
        out["requests"] = dict(sorted(requests.items()))
    if limits:
        out["limits"] = dict(sorted(limits.items()))
    return out


def _affinity(affinity: echo_spec.Affinity | None) -> Object | None:
    if affinity is None or affinity.node_affinity is None:
        return None
    node = affinity.node_affinity
    out: Object = {}
    if node.required:
        out["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [drop_empty(term.to_manifest()) for term in node.required]
        }
    if node.preferred:
        out["preferredDuringSchedulingIgnoredDuringExecution"] = [
            drop_empty(p.to_manifest()) for p in node.preferred
        ]
    return {"nodeAffinity": out} if out else None


def _placement(placement: echo_spec.Placement) -> Object:
    """nodeSelector / tolerations / affinity of a pod spec (keys only when set)."""
    out: Object = {}
    if placement.node_selector:
        out["nodeSelector"] = dict(sorted(placement.node_selector.items()))
    if placement.tolerations:
        out["tolerations"] = [t.to_manifest() for t in placement.tolerations]
    affinity = _affinity(placement.affinity)
    if affinity is not None:
        out["affinity"] = affinity
    return out


def secret_env(name: str, secret: str, key: str) -> Object:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def field_env(name: str, path: str) -> Object:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def store_env(store: inputs.StoreWiring, readonly: bool) -> list[Object]:
    if readonly and store.readonly_secret is not None:
        secret, access, secret_key = (
            store.readonly_secret,
            store.readonly_access_key,
            store.readonly_secret_key,
        )
    elif store.secret is not None:
        secret, access, secret_key = store.secret, store.access_key, store.secret_key
    else:
        return []  # ambient credentials (e.g. IAM roles for service accounts)
    return [
        secret_env("ECHORL_S3_ACCESS_KEY", secret, access),
        secret_env("ECHORL_S3_SECRET_KEY", secret, secret_key),
    ]


def common_env() -> list[Object]:
    return [
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        {"name": "HOME", "value": "/tmp"},
        {"name": "ECHORL_CACHE_DIR", "value": "/cache/echorl"},
        {"name": "HF_HOME", "value": "/cache/huggingface"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]


CONTAINER_SECURITY: Object = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


_POD_SECURITY: Object = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "fsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def scratch_volumes(shm: bool) -> tuple[list[Object], list[Object]]:
    """Writable scratch (the root filesystem is read-only) and, for GPU/NCCL processes, a large /dev/shm."""
    volumes: list[Object] = [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
    mounts: list[Object] = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": "/cache"}]
    if shm:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def config_volume(job: inputs.JobInput) -> tuple[Object, Object]:
    return (
        {"name": "job", "configMap": {"name": names.config(job.name)}},
        {"name": "job", "mountPath": CONFIG_DIR, "readOnly": True},
    )


def pod_spec(
    containers: list[Object], volumes: list[Object], placement: echo_spec.Placement, **extra: Any
) -> Object:
    pod: Object = {
        "automountServiceAccountToken": False,  # no Echo process talks to the Kubernetes API
        "enableServiceLinks": False,
        "securityContext": _POD_SECURITY,
        "containers": containers,
        "volumes": volumes,
        **_placement(placement),
    }
    pod.update(extra)
    return pod


def templated(template: PodTemplate | None, pod_meta: Object, pod: Object) -> tuple[Object, Object]:
    """A pool's or the trainer's ``podTemplate`` merged over the operator's pod (metadata, spec).

    Labels and annotations are added (the spec forbids the operator's own keys); the pod-spec fields
    are set; volumes are added, and a mount at one of the operator's scratch paths (``/tmp``,
    ``/cache``, ``/dev/shm``) replaces the operator's volume there; the one Echo container gets the
    template's ``env`` after its own, its ``envFrom`` and its ``volumeMounts``. Pure: new objects.
    """
    meta, pod = copy.deepcopy(pod_meta), copy.deepcopy(pod)
    if template is None:
        return meta, pod
    meta["labels"] = {**template.metadata.labels, **meta.get("labels", {})}
    meta["annotations"] = {**template.metadata.annotations, **meta.get("annotations", {})}
    t = drop_empty(template.spec.to_manifest())
    for key in (
        "priorityClassName",
        "serviceAccountName",
        "automountServiceAccountToken",
        "runtimeClassName",
        "imagePullSecrets",
        "topologySpreadConstraints",
    ):
        if key in t:
            pod[key] = t[key]
    if "affinity" in t:
        pod["affinity"] = {**pod.get("affinity", {}), **t["affinity"]}
    (container,) = pod["containers"]
    patch: Object = next(iter(t.get("containers", [])), {})
    mounts: list[Object] = patch.get("volumeMounts", [])
    replaced = {m["mountPath"].rstrip("/") for m in mounts} & set(podtemplate.SCRATCH_MOUNTS)
    gone = {m["name"] for m in container["volumeMounts"] if m["mountPath"] in replaced}
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] not in gone] + mounts
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in gone] + t.get("volumes", [])
    container["env"] = [*container.get("env", []), *patch.get("env", [])]
    if "envFrom" in patch:
        container["envFrom"] = patch["envFrom"]
    return meta, pod


def replicas(job: inputs.JobInput, wanted: int) -> int:
    return wanted if job.active else 0


def drop_empty(value: Any) -> Any:
    """Leave out empty maps and lists (``nodeSelector: {}``): noise in a file people read."""
    if isinstance(value, dict):
        pruned = {k: drop_empty(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [drop_empty(v) for v in value]
    return value
