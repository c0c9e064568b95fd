"""Status of Echo's objects as the operator writes it (and ``echorl run`` reports it).

Conditions follow the Kubernetes API conventions: a ``type`` (``Ready``, ``Progressing``,
``StalenessBounded``, ``Degraded``, ``Suspended``), ``status`` True/False/Unknown, a CamelCase
``reason``, a human ``message``, ``observedGeneration`` and ``lastTransitionTime``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from echo_runtime.spec.base import SpecModel

ConditionType = Literal["Ready", "Progressing", "StalenessBounded", "Degraded", "Suspended"]


class Condition(SpecModel):
    """One observation of the object's state."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32_768)
    observed_generation: int | None = Field(default=None, ge=0)
    last_transition_time: str | None = None
    """RFC 3339 time of the last change of ``status``."""


class ExternalWorker(SpecModel):
    """A worker that joined from outside the cluster, as the coordinator reports it."""

    id: str
    backend: str
    device: str
    loaded_version: int | None = None
    last_heartbeat: str | None = None


class PoolStatus(SpecModel):
    """Status of one inference pool."""

    name: str
    replicas: int = 0
    ready_replicas: int = 0
    workers: int = 0
    """Workers registered with the coordinator (pods and external)."""
    observed_policy_version: int | None = None
    """The oldest policy version loaded by a live worker of this pool."""
    external_workers: list[ExternalWorker] = Field(default_factory=list)


class EchoJobStatus(SpecModel):
    """What the operator last observed of a job."""

    observed_generation: int | None = None
    policy_version: int | None = None
    """t_train: optimizer steps applied."""
    max_observed_staleness: int | None = None
    """The largest staleness of any rollout an optimizer step consumed."""
    dropped_stale: int = 0
    """Groups dropped because they would have broken Δmax."""
    weighted_stale: int = 0
    """Groups consumed with importance weights because they were stale."""
    reward: float | None = None
    rollouts_per_second: float | None = None
    pools: list[PoolStatus] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)


class SwarmStatus(SpecModel):
    """Status of a standalone InferenceSwarm, TrainingSwarm or SyncPolicy object."""

    observed_generation: int | None = None
    replicas: int | None = None
    """Current worker pods (the scale subresource's status replicas)."""
    selector: str | None = None
    """Label selector of the pool's pods (the scale subresource's selector, for an HPA)."""
    used_by: list[str] = Field(default_factory=list)
    """EchoJobs that reference this object."""
    conditions: list[Condition] = Field(default_factory=list)
