"""Names and labels of everything the operator creates: one place, so handlers, tests and docs agree.

Every child of an EchoJob ``J`` is named after it (``J-coordinator``, ``J-<pool>``, ``J-trainer``,
``J-<pool>-join``) and carries the recommended ``app.kubernetes.io/*`` labels plus ``echorl.dev/*``
labels that select it: ``echorl.dev/job=J`` on all of them, ``echorl.dev/component`` (coordinator,
inference, trainer, trainer-logs, config, join-token, storage) and, on inference children, ``echorl.dev/pool``.
Pods of a pool that comes from an ``InferenceSwarm`` object also carry
``echorl.dev/inference-swarm=<name>``, the selector the swarm's scale subresource publishes for an HPA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from echo_runtime import spec

GROUP = spec.API_GROUP
MANAGER = "echorl-operator"
CONTROLLER = "echorl.dev/operator"
"""This operator's name in an EchoJob's ``spec.managedBy`` (unset means the same)."""


def managed_elsewhere(body: Mapping[str, Any]) -> str | None:
    """The other controller an EchoJob names in ``spec.managedBy`` (None: this operator runs it)."""
    value = (body.get("spec") or {}).get("managedBy")
    return str(value) if value and value != CONTROLLER else None


"""Field manager of the operator's server-side applies, and ``app.kubernetes.io/managed-by``."""
FINALIZER = f"{GROUP}/cleanup"

JOB = f"{GROUP}/job"
COMPONENT = f"{GROUP}/component"
POOL = f"{GROUP}/pool"
INFERENCE_SWARM = f"{GROUP}/inference-swarm"
SPEC_HASH = f"{GROUP}/spec-hash"
"""Pod-template annotation: a hash of what the pods run, so any change to it rolls them."""
EXTERNAL_URL = f"{GROUP}/external-url"
"""EchoJob annotation a user may set: the coordinator URL external workers use (e.g. an Ingress)."""
TLS_SECRET = f"{GROUP}/coordinator-tls-secret"
"""EchoJob annotation a user may set: a ``kubernetes.io/tls`` Secret (cert-manager's) the coordinator
serves external workers with, instead of the certificate the operator issues."""
READONLY_ACCOUNT = f"{GROUP}/readonly-access-key"
"""EchoJob annotation the operator sets when it created a read-only MinIO service account."""
RESUME_REPLICAS = f"{GROUP}/replicas-before-suspend"
"""Deployment annotation, while the job is suspended: the replicas a user or an HPA had set on a pool
whose own ``replicas`` is unset, given back on resume."""
RESUME_MANAGER = f"{MANAGER}-resume"
"""Field manager that gives those replicas back, so that afterwards they are not the operator's."""

Component = Literal[
    "coordinator", "inference", "trainer", "trainer-logs", "scorer", "config", "join-token", "storage"
]

COORDINATOR_PORT = 8700  # the coordinator's own default (`echorl coordinator --port`)
SCORER_PORT = 8710  # `echorl scorer --port`'s default
COORDINATOR_TLS_PORT = 8443
"""The coordinator's TLS port (``--tls-port``): the only port of its external Service."""
RENDEZVOUS_PORT = 29500
JOB_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
"""The label the Job controller puts on each pod of an indexed Job: the trainer's node rank."""


def coordinator(job: str) -> str:
    """Coordinator Deployment and Service."""
    return f"{job}-coordinator"


def coordinator_external(job: str) -> str:
    """The Service that exposes the coordinator to workers outside the cluster."""
    return f"{job}-coordinator-external"


def coordinator_tls(job: str) -> str:
    """The Secret with the CA and certificate the coordinator serves external workers with."""
    return f"{job}-coordinator-tls"


def workload(job: str) -> str:
    """The Kueue Workload of a job queued through Kueue (:mod:`echo_operator.queueing`)."""
    return f"echojob-{job}"


def pool(job: str, pool_name: str) -> str:
    """A pool's Deployment."""
    return f"{job}-{pool_name}"


def join_secret(job: str, pool_name: str) -> str:
    """A pool's join token Secret (docs/contracts.md: ``<job>-<pool>-join``, key ``token``)."""
    return f"{job}-{pool_name}-join"


def trainer(job: str) -> str:
    """Trainer Job (indexed: one pod per node rank) and its headless Service."""
    return f"{job}-trainer"


def trainer_logs(job: str, restart: int) -> str:
    """The ConfigMap that keeps the last log lines of the pods of the ``restart``-th trainer Job the
    operator stopped (:mod:`echo_operator.trainer_record`)."""
    return f"{job}-trainer-logs-{restart}"


def trainer_join_secret(job: str) -> str:
    return join_secret(job, "trainer")


STATUS_ROLE = "status"
"""The read-only role: the coordinator's status document and metrics, nothing else (the operator's)."""


SCORER_ROLE = "scorer"
"""The scoring pools' role: the coordinator calls them with its token, nothing else holds it."""


def role_secret(job: str, role: str) -> str:
    """The Secret holding a role's token: ``<job>-<role>-join``; ``<job>-status-token`` and
    ``<job>-scorer-token`` for the status and scorer tokens (not join tokens, and not names any pool's
    Secret can take)."""
    if role in (STATUS_ROLE, SCORER_ROLE):
        return f"{job}-{role}-token"
    return join_secret(job, role)


def scorer(job: str, model: str) -> str:
    """A reward model's scoring pool: its Deployment and Service (pool names may not start with
    ``scorer-``, so no pool's Deployment takes the name)."""
    return f"{job}-scorer-{model}"


def scorer_url(job: str, namespace: str, model: str) -> str:
    return f"http://{scorer(job, model)}.{namespace}.svc:{SCORER_PORT}"


def tokens_secret(job: str) -> str:
    """The coordinator's tokens file: SHA-256 digests of every join token, never the tokens."""
    return f"{job}-tokens"


def config(job: str) -> str:
    """ConfigMap with the job manifest every process reads."""
    return f"{job}-config"


def readonly_secret(job: str) -> str:
    """Read-only snapshot-store credentials for inference pods (when the store can issue them)."""
    return f"{job}-storage-readonly"


def coordinator_url(job: str, namespace: str, port: int = COORDINATOR_PORT) -> str:
    """The coordinator's in-cluster URL."""
    return f"http://{coordinator(job)}.{namespace}.svc:{port}"


def selector(job: str, component: Component, pool_name: str | None = None) -> dict[str, str]:
    """The labels that select one component's pods (immutable once a Deployment exists)."""
    labels = {JOB: job, COMPONENT: component}
    if pool_name is not None:
        labels[POOL] = pool_name
    return labels


def labels(
    job: str, component: Component, pool_name: str | None = None, swarm: str | None = None
) -> dict[str, str]:
    """All labels of a child: the selector plus the recommended ``app.kubernetes.io`` ones."""
    out = {
        "app.kubernetes.io/name": "echorl",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "echorl",
        "app.kubernetes.io/managed-by": MANAGER,
        **selector(job, component, pool_name),
    }
    if swarm is not None:
        out[INFERENCE_SWARM] = swarm
    return out


def swarm_selector(swarm: str) -> str:
    """Label selector (string form) of every pod of an InferenceSwarm, across the jobs using it."""
    return f"{INFERENCE_SWARM}={swarm}"
