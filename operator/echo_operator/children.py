"""The children an EchoJob needs, computed by pure functions from its resolved spec.

:func:`desired` turns a :class:`JobInput` (the job with its references resolved, the storage wiring and
the digests of its join tokens) into the list of Kubernetes objects the operator server-side-applies:

* ``<job>-config`` ConfigMap: the job manifest the processes read (placement and replicas left out, so
  scaling a pool or moving it to other nodes does not restart the coordinator and the trainer);
* ``<job>-tokens`` Secret: the coordinator's tokens file, SHA-256 digests only (docs/contracts.md);
* ``<job>-coordinator`` Deployment (a singleton, ``Recreate``) and Service, plus
  ``<job>-coordinator-external`` when a pool has external workers (TLS only, port 8443, with the
  certificate of :attr:`JobInput.tls`; the coordinator then serves both ports);
* ``<job>-<pool>`` Deployment per in-cluster inference pool, with that pool's image, node selector,
  tolerations, affinity and resources (``nvidia.com/gpu`` added for GPU pools);
* ``<job>-trainer`` Job and headless Service: the trainer as a gang, an indexed Job with one pod per
  node (``completions = parallelism = nodes``) and ``backoffLimit: 0``, so one failed rank fails the
  whole Job and the Job controller stops the others; the operator then restarts every rank together
  (:mod:`echo_operator.lifecycle`). torch.distributed meets at rank 0's stable DNS name
  (``<job>-trainer-0.<job>-trainer``: the Job names pods' hostnames by index, the Service is their
  subdomain); ``NODE_RANK`` is the completion index.

Promises: the same input gives byte-identical output (re-applying changes nothing); every object is
labelled (:mod:`echo_operator.names`) and controlled by the EchoJob through an owner reference;
``suspend`` sets every replica count to zero and leaves the trainer Job out, and so does a job that
is over (:attr:`JobInput.finished`); a pool whose ``replicas`` is unset leaves the field unowned, so
``kubectl scale`` or an HPA on the Deployment is not fought. Join-token Secrets hold random tokens,
so they are made by :func:`join_secret` from a token the caller generated.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from echo_operator import names
from echo_operator.config import Settings
from echo_runtime import spec as echo_spec
from echo_runtime.spec import commands, podtemplate
from echo_runtime.spec.podtemplate import PodTemplate

if TYPE_CHECKING:
    from echo_operator.status import Hold

Object = dict[str, Any]

CONFIG_DIR = "/etc/echorl/job"
TOKENS_DIR = "/etc/echorl/tokens"
TLS_DIR = "/etc/echorl/tls"
JOB_FILE = f"{CONFIG_DIR}/job.yaml"
TOKENS_FILE = f"{TOKENS_DIR}/tokens.yaml"
GPU = "nvidia.com/gpu"


def _torchrun(swarm: echo_spec.TrainingSwarmSpec) -> tuple[str, ...]:
    """torchrun across the trainer's pods: the world's shape and rank 0's address from
    :func:`rendezvous_env` (Kubernetes expands ``$(VAR)`` in a command from the container's env)."""
    return (
        "torchrun", "--no-python", "--nnodes=$(NNODES)", "--nproc-per-node=$(NPROC_PER_NODE)",
        "--node-rank=$(NODE_RANK)", "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)", "echorl",
    )  # fmt: skip


PROGRAM = commands.Program(echorl=("echorl",), torchrun=_torchrun)
"""``echorl`` as the images install it (`command`, not `args`: the whole argv, whatever the entrypoint)."""


@dataclasses.dataclass(frozen=True)
class Pool:
    """One inference pool of the job, resolved."""

    name: str
    spec: echo_spec.InferenceSwarmSpec
    swarm: str | None = None
    """The InferenceSwarm object it comes from (None for an inline pool)."""


@dataclasses.dataclass(frozen=True)
class StoreWiring:
    """Which Secret keys hold the snapshot store's credentials, for whom.

    The coordinator and the trainer get the job's credentials (``spec.storage.credentialsSecret``);
    inference pods get the read-only pair when the store could issue one, else the same pair.
    """

    secret: str | None
    access_key: str = "accessKey"
    secret_key: str = "secretKey"
    readonly_secret: str | None = None
    readonly_access_key: str = "accessKey"
    readonly_secret_key: str = "secretKey"


@dataclasses.dataclass(frozen=True)
class TLSWiring:
    """The certificate the coordinator serves external workers with (:mod:`echo_operator.coordinator_tls`)."""

    secret: str
    """The ``kubernetes.io/tls`` Secret the coordinator's pod mounts (``tls.crt``, ``tls.key``)."""
    fingerprint: str
    """``sha256:<hex>`` of that certificate: in the pod's spec hash, so a new one restarts it."""
    ca: str | None = None
    """The CA's PEM certificate, when known (always, for one the operator issued)."""


@dataclasses.dataclass(frozen=True)
class JobInput:
    """Everything the children depend on: nothing here is read from the cluster by this module."""

    name: str
    namespace: str
    uid: str
    spec: echo_spec.EchoJobSpec
    sync_policy: echo_spec.SyncPolicySpec
    training: echo_spec.TrainingSwarmSpec
    pools: tuple[Pool, ...]
    token_digests: Mapping[str, str]
    """``trainer`` and each pool name → hex SHA-256 of its join token."""
    store: StoreWiring = StoreWiring(secret=None)
    finished: bool = False
    """The job Succeeded or Failed: nothing runs any more (its processes are scaled to zero)."""
    tls: TLSWiring | None = None
    """Set when external workers join: the coordinator also serves TLS, on its external Service."""
    held: Hold | None = None
    """Why Kueue does not let the job run now (:mod:`echo_operator.queueing`); None: not held."""

    @classmethod
    def from_resolved(
        cls,
        resolved: echo_spec.ResolvedJob,
        uid: str,
        token_digests: Mapping[str, str],
        store: StoreWiring,
    ) -> JobInput:
        refs = {p.name: p.swarm_ref for p in resolved.spec.inference_swarms}
        return cls(
            name=resolved.name,
            namespace=resolved.namespace or "default",
            uid=uid,
            spec=resolved.spec,
            sync_policy=resolved.sync_policy,
            training=resolved.training_swarm,
            pools=tuple(
                Pool(name, pool_spec, refs.get(name)) for name, pool_spec in resolved.inference_pools
            ),
            token_digests=dict(token_digests),
            store=store,
        )

    @property
    def suspended(self) -> bool:
        """Scaled to zero by ``spec.suspend`` or by its queue (Kueue has not admitted it)."""
        return self.spec.suspend or self.held is not None

    @property
    def active(self) -> bool:
        """Processes should run: neither suspended, nor held by the job's queue, nor over."""
        return not (self.suspended or self.finished)

    @property
    def has_external_pools(self) -> bool:
        return any(p.spec.external for p in self.pools)


# ---------------------------------------------------------------------------------------------
# Helpers


def owner_reference(job: JobInput) -> Object:
    return {
        "apiVersion": echo_spec.GROUP_VERSION,
        "kind": "EchoJob",
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(
    job: JobInput,
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


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _resources(resources: echo_spec.Resources, gpus: int = 0) -> Object:
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
            "nodeSelectorTerms": [_drop_empty(term.to_manifest()) for term in node.required]
        }
    if node.preferred:
        out["preferredDuringSchedulingIgnoredDuringExecution"] = [
            _drop_empty(p.to_manifest()) for p in node.preferred
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


def _secret_env(name: str, secret: str, key: str) -> Object:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _field_env(name: str, path: str) -> Object:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _store_env(store: StoreWiring, readonly: bool) -> list[Object]:
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
        _secret_env("ECHORL_S3_ACCESS_KEY", secret, access),
        _secret_env("ECHORL_S3_SECRET_KEY", secret, secret_key),
    ]


def _common_env() -> list[Object]:
    return [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_NAMESPACE", "metadata.namespace"),
        {"name": "HOME", "value": "/tmp"},
        {"name": "ECHORL_CACHE_DIR", "value": "/cache/echorl"},
        {"name": "HF_HOME", "value": "/cache/huggingface"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]


_CONTAINER_SECURITY: Object = {
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


def _scratch_volumes(shm: bool) -> tuple[list[Object], list[Object]]:
    """Writable scratch (the root filesystem is read-only) and, for GPU/NCCL processes, a large /dev/shm."""
    volumes: list[Object] = [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
    mounts: list[Object] = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": "/cache"}]
    if shm:
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def _config_volume(job: JobInput) -> tuple[Object, Object]:
    return (
        {"name": "job", "configMap": {"name": names.config(job.name)}},
        {"name": "job", "mountPath": CONFIG_DIR, "readOnly": True},
    )


def _pod_spec(
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
    t = _drop_empty(template.spec.to_manifest())
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


def _replicas(job: JobInput, wanted: int) -> int:
    return wanted if job.active else 0


# ---------------------------------------------------------------------------------------------
# The job manifest the processes read


_PLACEMENT = frozenset(
    {"image", "resources", "node_selector", "tolerations", "affinity", "pod_template", "gpus_per_replica"}
)
_OPERATOR_ONLY = {"suspend", "backoff_limit", "ttl_seconds_after_finished"}
"""Spec fields only the operator acts on: changing them restarts no process."""


def process_manifest(job: JobInput) -> Object:
    """The self-contained EchoJob every Echo process of the job reads from ``<job>-config``.

    References are resolved; what only the operator uses (placement, replicas, suspend, the
    lifecycle fields) is left out, so that scaling a pool or moving it to other nodes does not change this file, which would
    roll the coordinator and the trainer.
    """
    keep_training = set(echo_spec.TrainingSwarmSpec.model_fields) - _PLACEMENT
    keep_pool = set(echo_spec.InferenceSwarmSpec.model_fields) - _PLACEMENT - {"replicas"}
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
    )
    manifest = echo_spec.EchoJob(
        metadata=echo_spec.ObjectMeta(name=job.name, namespace=job.namespace), spec=body
    ).model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"spec": _OPERATOR_ONLY})
    return dict(_drop_empty(manifest))


def _drop_empty(value: Any) -> Any:
    """Leave out empty maps and lists (``nodeSelector: {}``): noise in a file people read."""
    if isinstance(value, dict):
        pruned = {k: _drop_empty(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value


def config_map(job: JobInput) -> Object:
    text = yaml.safe_dump(process_manifest(job), sort_keys=False, allow_unicode=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, names.config(job.name), "config"),
        "data": {"job.yaml": text},
    }


def tokens_file(job: JobInput) -> str:
    """The coordinator's ``--tokens-file``: ``sha256:<hex>`` per role, so it never holds a token."""
    data = {
        "trainer": f"sha256:{job.token_digests['trainer']}",
        "pools": {p.name: f"sha256:{job.token_digests[p.name]}" for p in job.pools},
    }
    if names.STATUS_ROLE in job.token_digests:
        data["status"] = f"sha256:{job.token_digests[names.STATUS_ROLE]}"
    return yaml.safe_dump(data, sort_keys=False)


def tokens_secret(job: JobInput) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(job, names.tokens_secret(job.name), "join-token"),
        "type": "Opaque",
        "data": {"tokens.yaml": _b64(tokens_file(job))},
    }


def join_secret(
    job_name: str,
    namespace: str,
    owner: Object,
    role: str,
    token: str,
    external: Mapping[str, str | None] | None = None,
) -> Object:
    """A join token Secret (``<job>-<role>-join``, key ``token``; for an external pool also
    ``coordinator``, ``fingerprint`` and ``ca.crt`` when known), or the status token's
    (``<job>-status-token``)."""
    data = {"token": _b64(token)}
    for key, value in (external or {}).items():
        if value is not None:
            data[key] = _b64(value)
    labels = names.labels(job_name, "join-token", None if role in ("trainer", names.STATUS_ROLE) else role)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": names.role_secret(job_name, role),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "type": "Opaque",
        "data": data,
    }


# ---------------------------------------------------------------------------------------------
# Coordinator


def coordinator_args(job: JobInput, settings: Settings) -> list[str]:
    """``echorl coordinator`` in its pod, listening on every address."""
    return commands.coordinator(
        PROGRAM,
        job_file=JOB_FILE,
        tokens_file=TOKENS_FILE,
        host="0.0.0.0",
        port=names.COORDINATOR_PORT,
        metrics_auth=settings.metrics_auth,
        # TLS beside the plain port: pods in the cluster keep http, the external Service has only https.
        tls=None
        if job.tls is None
        else commands.TLSFiles(f"{TLS_DIR}/tls.crt", f"{TLS_DIR}/tls.key", names.COORDINATOR_TLS_PORT),
    )


def coordinator_deployment(job: JobInput, settings: Settings) -> Object:
    config_volume, config_mount = _config_volume(job)
    scratch, scratch_mounts = _scratch_volumes(shm=False)
    container: Object = {
        "name": "coordinator",
        "image": settings.images.coordinator,
        "imagePullPolicy": settings.image_pull_policy,
        "command": coordinator_args(job, settings),
        "ports": [{"name": "http", "containerPort": names.COORDINATOR_PORT, "protocol": "TCP"}],
        "env": _common_env() + _store_env(job.store, readonly=False),
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
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [
            config_mount,
            {"name": "tokens", "mountPath": TOKENS_DIR, "readOnly": True},
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
        container["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        # Only the certificate and its key: the CA's key in the operator's Secret stays out of the pod.
        items = [{"key": k, "path": k} for k in ("tls.crt", "tls.key")]
        volumes.append({"name": "tls", "secret": {"secretName": job.tls.secret, "items": items}})
    pod_labels = names.labels(job.name, "coordinator")
    hash_ = digest(
        yaml.safe_dump(process_manifest(job)),
        tokens_file(job),
        *([job.tls.secret, job.tls.fingerprint] if job.tls is not None else []),
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(job, names.coordinator(job.name), "coordinator"),
        "spec": {
            "replicas": _replicas(job, 1),
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
                "spec": _pod_spec([container], volumes, echo_spec.Placement()),
            },
        },
    }


def coordinator_service(job: JobInput) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, names.coordinator(job.name), "coordinator"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector(job.name, "coordinator"),
            "ports": [
                {"name": "http", "port": names.COORDINATOR_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def coordinator_external_service(job: JobInput, settings: Settings) -> Object | None:
    """The Service external workers reach the coordinator through (None if not wanted)."""
    if not job.has_external_pools or settings.external_service_type == "None":
        return None
    port = names.COORDINATOR_TLS_PORT if job.tls is not None else names.COORDINATOR_PORT
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, names.coordinator_external(job.name), "coordinator"),
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


# ---------------------------------------------------------------------------------------------
# Inference pools


def is_gpu_pool(pool: echo_spec.InferenceSwarmSpec) -> bool:
    return pool.backend == "vllm" or pool.device == "cuda"


def worker_args(job: JobInput, pool: Pool) -> list[str]:
    """The ``echorl worker`` command line of a pool (the join token comes from ``ECHORL_TOKEN``)."""
    return commands.worker(
        PROGRAM,
        pool.name,
        pool.spec,
        job_file=JOB_FILE,
        coordinator_url=names.coordinator_url(job.name, job.namespace),
    )


def pool_hash(pool: Pool) -> str:
    """Hash of what a pool's pods run: its spec without ``replicas`` (scaling must not roll pods)."""
    body = pool.spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"replicas"})
    return digest(pool.name, json.dumps(body, sort_keys=True))


def pool_deployment(job: JobInput, pool: Pool, settings: Settings) -> Object | None:
    """The Deployment of one in-cluster pool; None for an external pool (it has no pods)."""
    p = pool.spec
    if p.external:
        return None
    gpu = is_gpu_pool(p)
    config_volume, config_mount = _config_volume(job)
    scratch, scratch_mounts = _scratch_volumes(shm=gpu)
    env = [
        *_common_env(),
        _secret_env(commands.WORKER_TOKEN_ENV, names.join_secret(job.name, pool.name), "token"),
        *_store_env(job.store, readonly=True),
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
        "resources": _resources(p.resources, gpus=(p.gpus_per_replica or 1) if gpu else 0),
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [config_mount, *scratch_mounts],
    }
    pod_meta, pod = templated(
        p.pod_template,
        {
            "labels": names.labels(job.name, "inference", pool.name, pool.swarm),
            "annotations": {names.SPEC_HASH: pool_hash(pool)},
        },
        _pod_spec([container], [config_volume, *scratch], p, terminationGracePeriodSeconds=30),
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
        "metadata": _meta(job, names.pool(job.name, pool.name), "inference", pool.name, pool.swarm),
        "spec": deployment_spec,
    }


# ---------------------------------------------------------------------------------------------
# Trainer


def trainer_args(job: JobInput) -> list[str]:
    """``echorl trainer``, under torchrun when the group has more than one process."""
    return commands.trainer(
        PROGRAM,
        job.training,
        job_file=JOB_FILE,
        coordinator_url=names.coordinator_url(job.name, job.namespace),
        # A restarted trainer (node lost, spec changed, resumed from suspend) continues from the
        # newest checkpoint in the store instead of refusing to overwrite it.
        resume=True,
    )


def rendezvous_env(job: JobInput) -> list[Object]:
    """torch.distributed environment: rank 0's stable DNS name, world shape, this pod's node rank."""
    t = job.training
    master = f"{names.trainer(job.name)}-0.{names.trainer(job.name)}.{job.namespace}.svc"
    return [
        {"name": "MASTER_ADDR", "value": master},
        {"name": "MASTER_PORT", "value": str(names.RENDEZVOUS_PORT)},
        {"name": "NNODES", "value": str(t.nodes)},
        {"name": "NPROC_PER_NODE", "value": str(t.processes_per_node)},
        # The Job controller labels each pod of an indexed Job with its completion index.
        _field_env("NODE_RANK", f"metadata.labels['{names.JOB_INDEX_LABEL}']"),
    ]


def trainer_pod_spec(job: JobInput, settings: Settings) -> Object:
    t = job.training
    config_volume, config_mount = _config_volume(job)
    gpus = t.gpus_per_node
    scratch, scratch_mounts = _scratch_volumes(shm=gpus > 0 or t.processes_per_node > 1)
    env = (
        _common_env()
        + rendezvous_env(job)
        + [
            _secret_env(commands.TRAINER_TOKEN_ENV, names.trainer_join_secret(job.name), "token"),
            *_store_env(job.store, readonly=False),
        ]
    )
    if t.threads is not None:
        env.append({"name": "OMP_NUM_THREADS", "value": str(t.threads)})
    container: Object = {
        "name": "trainer",
        "image": t.image or settings.images.trainer,
        "imagePullPolicy": settings.image_pull_policy,
        "command": trainer_args(job),
        "ports": [{"name": "rendezvous", "containerPort": names.RENDEZVOUS_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": _resources(t.resources, gpus=gpus),
        "securityContext": _CONTAINER_SECURITY,
        # A failed trainer's last log lines become its termination message: the operator quotes
        # them in the EchoJob's Failed condition without reading logs.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [config_mount, *scratch_mounts],
    }
    return _pod_spec(
        [container],
        [config_volume, *scratch],
        t,
        restartPolicy="Never",
        subdomain=names.trainer(job.name),
        terminationGracePeriodSeconds=60,
    )


def trainer_job(job: JobInput, settings: Settings) -> Object:
    """The trainer gang: an indexed Job, one pod per node, failing (and restarted) as a whole."""
    nodes = job.training.nodes
    pod_meta, pod = templated(
        job.training.pod_template,
        {"labels": names.labels(job.name, "trainer")},
        trainer_pod_spec(job, settings),
    )
    # A Job's pod template is immutable: a new hash means a new Job (every rank restarts together,
    # from the last checkpoint).
    labels = [json.dumps(pod_meta, sort_keys=True)] if job.training.pod_template is not None else []
    hash_ = digest(yaml.safe_dump(process_manifest(job)), json.dumps(pod, sort_keys=True), *labels)
    pod_meta["annotations"] = {**pod_meta.get("annotations", {}), names.SPEC_HASH: hash_}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            **_meta(job, names.trainer(job.name), "trainer"),
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


def trainer_service(job: JobInput) -> Object:
    """Headless Service: stable per-pod DNS names for the rendezvous, ready or not."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, names.trainer(job.name), "trainer"),
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


# ---------------------------------------------------------------------------------------------


def desired(job: JobInput, settings: Settings) -> list[Object]:
    """Every object the job needs (except join-token Secrets), in the order they are applied.

    The trainer Job only while the job is :attr:`~JobInput.active`: suspending the job, or the job
    being over, stops the trainer (its pods hold GPUs) while everything else is scaled to zero.
    """
    objects: list[Object | None] = [
        config_map(job),
        tokens_secret(job),
        coordinator_service(job),
        coordinator_external_service(job, settings),
        coordinator_deployment(job, settings),
        trainer_service(job),
        trainer_job(job, settings) if job.active else None,
        *(pool_deployment(job, pool, settings) for pool in job.pools),
    ]
    return [o for o in objects if o is not None]


def key(obj: Object) -> tuple[str, str]:
    """(kind, name): how children are matched between desired and existing."""
    return obj["kind"], obj["metadata"]["name"]


def roles(job: JobInput) -> Sequence[str]:
    """The roles that need a join token: the trainer and every pool."""
    return ["trainer", names.STATUS_ROLE, *(p.name for p in job.pools)]
