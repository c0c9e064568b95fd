"""Status of Echo's objects as the operator writes it (and ``echorl run`` reports it).

Conditions follow the Kubernetes API conventions: a ``type`` (``Ready``, ``Progressing``,
``StalenessBounded``, ``Degraded``, ``Suspended``, and once the job is over ``Succeeded`` or
``Failed``), ``status`` True/False/Unknown, a CamelCase
``reason``, a human ``message``, ``observedGeneration`` and ``lastTransitionTime``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from echo_runtime.spec.base import SpecModel

# Lists keyed like Kubernetes' own status lists, so patches and server-side apply merge by key.
_MAP_BY_TYPE: dict[str, Any] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
_MAP_BY_NAME: dict[str, Any] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}

ConditionType = Literal[
    "Ready",
    "Progressing",
    "StalenessBounded",
    "LearningSignal",
    "Degraded",
    "Suspended",
    "Succeeded",
    "Failed",
]


class Condition(SpecModel):
    """One observation of the object's state."""

    type: str
    """Condition type: Ready, Progressing, StalenessBounded, LearningSignal, Degraded, Suspended, Succeeded
    or Failed."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    """Why the condition has this status, in one CamelCase word."""
    message: str = Field(default="", max_length=32_768)
    """What a human should know: details, names, numbers."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The ``metadata.generation`` this condition was computed for."""
    last_transition_time: str | None = None
    """RFC 3339 time of the last change of ``status``."""


class ExternalWorker(SpecModel):
    """A worker that joined from outside the cluster, as the coordinator reports it."""

    id: str
    """Worker id (the pod name for workers inside the cluster)."""
    backend: str
    """Inference backend the worker runs."""
    device: str
    """Device the backend runs on (cpu, cuda, mps)."""
    loaded_version: int | None = None
    """Policy version the worker has loaded."""
    last_heartbeat: str | None = None
    """RFC 3339 time of the worker's last heartbeat."""


class PoolStatus(SpecModel):
    """Status of one inference pool."""

    name: str
    """Pool name."""
    replicas: int = 0
    """Worker pods of the pool's Deployment."""
    ready_replicas: int = 0
    """Worker pods that are ready."""
    pending: int = 0
    """Worker pods the scheduler cannot place (the Ready condition says why)."""
    workers: int = 0
    """Workers registered with the coordinator (pods and external)."""
    observed_policy_version: int | None = None
    """The oldest policy version loaded by a live worker of this pool."""
    quarantined: int = 0
    """Workers of this pool the trainer quarantined: their behaviour log-probs disagreed with its
    recomputation, so their rollouts are dropped and they are refused (Degraded says which)."""
    external_workers: list[ExternalWorker] = Field(default_factory=list)
    """Workers that joined from outside the cluster."""


class TrainerPodRecord(SpecModel):
    """One rank's pod of a trainer Job the operator stopped, as it last saw it."""

    rank: int | None = None
    """The pod's node rank (its Job completion index)."""
    name: str
    """Pod name."""
    node: str | None = None
    """The node it ran on."""
    phase: str | None = None
    """Its phase when the trainer stopped (``Running``, ``Failed``, ...), ``Terminating`` while being
    deleted, or ``Gone`` when it was no longer in the API (deleted or evicted) by then."""
    exit_code: int | None = None
    """The trainer container's exit code, once it ended."""
    reason: str | None = None
    """Why the trainer container ended (``OOMKilled``, ``Error``, ``Completed``), once it did."""


class TrainerStop(SpecModel):
    """Where one trainer Job stopped and why: the operator restarted, suspended or failed it."""

    restart: int = Field(ge=1)
    """Its number over the job's life (1: the first trainer Job the operator stopped); names its logs
    ConfigMap."""
    time: str
    """RFC 3339 time the operator stopped it."""
    reason: str
    """Why, in one CamelCase word: ``TrainerFailed`` (a counted failure: a rank exited non-zero or its pod
    was deleted), ``TrainerDisrupted`` (evicted or preempted, not counted), ``OOMKilled``,
    ``BackoffLimitExceeded``, ``DeadlineExceeded``, ``SpecChanged``, ``Suspended`` (spec.suspend) or
    Kueue's reason (``Preempted``, ``WorkloadDeactivated``, ...)."""
    message: str = Field(default="", max_length=2048)
    """What a human should know: the failed pod, its exit code, the Job's reason."""
    uid: str
    """The UID of the trainer Job that stopped."""
    policy_version: int | None = None
    """The policy version published when it stopped (as the status last read it)."""
    logs_config_map: str | None = None
    """The ConfigMap holding the last lines of each of its pods' logs (``kubectl get configmap NAME -o
    yaml``); absent when it had no pod."""
    pods: list[TrainerPodRecord] = Field(default_factory=list, max_length=16)
    """Each rank's pod (the first 16 ranks)."""


class EchoJobStatus(SpecModel):
    """What the operator last observed of a job."""

    observed_generation: int | None = None
    """The ``metadata.generation`` the operator last reconciled."""
    mode: Literal["Sequential", "Async"] | None = None
    """The sync mode in force (from the inline or referenced SyncPolicy)."""
    max_staleness: int | None = None
    """Δmax in force (from the inline or referenced SyncPolicy)."""
    policy_version: int | None = None
    """t_train: optimizer steps applied."""
    max_observed_staleness: int | None = None
    """The largest staleness of any rollout an optimizer step consumed."""
    dropped_stale: int = 0
    """Groups dropped because they would have broken Δmax."""
    weighted_stale: int = 0
    """Groups consumed with importance weights because they were stale."""
    quarantined_workers: int = 0
    """Workers the trainer quarantined over the job's life (Degraded names them)."""
    reward: float | None = None
    """Mean reward of the rollouts consumed recently, as the coordinator reports it."""
    rollouts_per_second: float | None = None
    """Rollouts pushed per second, across all workers."""
    pools: list[PoolStatus] = Field(default_factory=list, json_schema_extra=_MAP_BY_NAME)
    """One entry per inference pool."""
    start_time: str | None = None
    """RFC 3339 time the operator first started the job's processes."""
    completion_time: str | None = None
    """RFC 3339 time the job Succeeded: the final version and its checkpoint were in the store."""
    restarts: int = 0
    """Trainer failures counted against ``spec.backoffLimit`` (each restarted every rank)."""
    last_counted_trainer: str | None = None
    """The UID of the trainer Job whose failure ``restarts`` counted last: written with ``restarts`` before
    that Job is deleted, so an operator that stops between the two neither loses the count nor counts it
    twice."""
    trainer_history: list[TrainerStop] = Field(default_factory=list, max_length=10)
    """The last 10 trainer Jobs the operator stopped (restarted, suspended, preempted, failed), oldest
    first: when, why, each rank's pod and the ConfigMap that keeps their last log lines."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=_MAP_BY_TYPE)
    """Ready, Progressing, StalenessBounded, LearningSignal, Degraded, Suspended; Succeeded or Failed at the
    end."""


class SwarmStatus(SpecModel):
    """Status of a standalone InferenceSwarm, TrainingSwarm or SyncPolicy object."""

    observed_generation: int | None = None
    """The ``metadata.generation`` the operator last reconciled."""
    replicas: int | None = None
    """Current worker pods (the scale subresource's status replicas)."""
    selector: str | None = None
    """Label selector of the pool's pods (the scale subresource's selector, for an HPA)."""
    used_by: list[str] = Field(default_factory=list)
    """EchoJobs that reference this object."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=_MAP_BY_TYPE)
    """Conditions of the object (``Ready`` once every job using it has its children)."""
