"""The four Kubernetes kinds: ``EchoJob``, ``InferenceSwarm``, ``TrainingSwarm``, ``SyncPolicy``.

An EchoJob names its model, task, algorithm and storage, and either embeds its sync policy and
swarms or references separate objects by name (shared pools, a SyncPolicy used by several jobs).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from echo_runtime.spec.base import ObjectMeta, SpecModel, cel
from echo_runtime.spec.policy import Algorithm, Model, SyncPolicySpec, Task
from echo_runtime.spec.status import EchoJobStatus, SwarmStatus
from echo_runtime.spec.swarms import InferencePool, InferenceSwarmSpec, Storage, TrainingSwarmSpec


class EchoJobSpec(SpecModel):
    """A whole RL post-training job."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "!(has(self.syncPolicy) && has(self.syncPolicyRef))",
                "syncPolicyRef cannot be combined with an inline syncPolicy",
                ".syncPolicyRef",
            ),
            (
                "!(has(self.trainingSwarm) && has(self.trainingSwarmRef))",
                "trainingSwarmRef cannot be combined with an inline trainingSwarm",
                ".trainingSwarmRef",
            ),
            (  # in a cluster they would collide with `<job>-trainer-join` and `<job>-coordinator`
                "self.inferenceSwarms.all(p, p.name != 'trainer' && p.name != 'coordinator')",
                "pool names 'trainer' and 'coordinator' are reserved: they name other children of the job",
                ".inferenceSwarms",
            ),
        )
    )

    model: Model = Field(default_factory=Model)
    """The base model and how it is fine-tuned; immutable once the job exists."""
    task: Task = Field(default_factory=Task)
    """Prompt source and verifier."""
    algorithm: Algorithm = Field(default_factory=Algorithm)
    """GRPO settings."""
    sync_policy: SyncPolicySpec | None = None
    """Inline sync policy (default: Async with maxStaleness 1); exclusive with ``syncPolicyRef``."""
    sync_policy_ref: str | None = None
    """Name of a SyncPolicy object in the same namespace."""
    storage: Storage = Field(default_factory=Storage)
    """Where snapshots and checkpoints live (S3/MinIO in a cluster)."""
    training_swarm: TrainingSwarmSpec | None = None
    """Inline training swarm (default: one process); exclusive with ``trainingSwarmRef``."""
    training_swarm_ref: str | None = None
    """Name of a TrainingSwarm object in the same namespace."""
    inference_swarms: list[InferencePool] = Field(
        default_factory=lambda: [InferencePool(name="default")],
        min_length=1,
        max_length=64,
        # A list keyed by pool name: the API server rejects duplicate names, and server-side apply
        # (kubectl, Argo CD, Flux) merges pools by name instead of replacing the whole list.
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Inference pools; each inline or a ``swarmRef``."""
    suspend: bool = False
    """Scale every process of the job to zero (state in the snapshot store is kept)."""
    backoff_limit: int = Field(default=3, ge=0, le=1000)
    """How many times the trainer may fail before the job is Failed (as a Kubernetes Job's
    ``backoffLimit``). Every rank of the trainer restarts together, from the last checkpoint; a pod
    deleted by hand counts as a failure, a disruption (eviction, preemption) does not."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Seconds after the job Succeeded or Failed before its children (Deployments, Services, the
    trainer Job, Secrets, ConfigMap) are deleted; the EchoJob, its status and the snapshots stay.
    Unset: the children stay (scaled to zero) until the job is deleted."""

    @model_validator(mode="after")
    def _refs(self) -> EchoJobSpec:
        if self.sync_policy is not None and self.sync_policy_ref is not None:
            raise ValueError("syncPolicyRef: cannot be combined with an inline syncPolicy")
        if self.training_swarm is not None and self.training_swarm_ref is not None:
            raise ValueError("trainingSwarmRef: cannot be combined with an inline trainingSwarm")
        seen: set[str] = set()
        for pool in self.inference_swarms:
            if pool.name in seen:
                raise ValueError(
                    f"inferenceSwarms: pool name {pool.name!r} appears twice; names must be unique"
                )
            seen.add(pool.name)
        return self


class EchoJob(SpecModel):
    """An RL post-training job (``kind: EchoJob``)."""

    # Rules only the API server applies: a cluster's pods share snapshots through S3, and child
    # names (``<name>-coordinator``, ``<name>-trainer-0``) must stay valid DNS labels.
    model_config = ConfigDict(
        json_schema_extra=cel(
            (  # no fieldPath: it cannot point into metadata
                "self.metadata.name.size() <= 40 && self.metadata.name.matches('^[a-z]')",
                "EchoJob names must start with a letter and have at most 40 characters: they prefix "
                "the names of the job's Services and pods",
            ),
            (
                "has(self.spec) && self.spec.storage.type == 'S3'",
                "must be S3 in a cluster: pods on different nodes share snapshots through "
                "S3/MinIO (manifests/ ships a dev MinIO)",
                ".spec.storage.type",
            ),
        )
    )

    api_version: Literal["echorl.dev/v1alpha1"] = "echorl.dev/v1alpha1"
    kind: Literal["EchoJob"] = "EchoJob"
    metadata: ObjectMeta
    spec: EchoJobSpec = Field(default_factory=EchoJobSpec)
    status: EchoJobStatus | None = None


class InferenceSwarm(SpecModel):
    """A pool of inference workers that jobs reference (``kind: InferenceSwarm``)."""

    api_version: Literal["echorl.dev/v1alpha1"] = "echorl.dev/v1alpha1"
    kind: Literal["InferenceSwarm"] = "InferenceSwarm"
    metadata: ObjectMeta
    spec: InferenceSwarmSpec = Field(default_factory=InferenceSwarmSpec)
    status: SwarmStatus | None = None


class TrainingSwarm(SpecModel):
    """A training group that jobs reference (``kind: TrainingSwarm``)."""

    api_version: Literal["echorl.dev/v1alpha1"] = "echorl.dev/v1alpha1"
    kind: Literal["TrainingSwarm"] = "TrainingSwarm"
    metadata: ObjectMeta
    spec: TrainingSwarmSpec = Field(default_factory=TrainingSwarmSpec)
    status: SwarmStatus | None = None


class SyncPolicy(SpecModel):
    """A sync policy that jobs reference (``kind: SyncPolicy``)."""

    api_version: Literal["echorl.dev/v1alpha1"] = "echorl.dev/v1alpha1"
    kind: Literal["SyncPolicy"] = "SyncPolicy"
    metadata: ObjectMeta
    spec: SyncPolicySpec = Field(default_factory=SyncPolicySpec)
    status: SwarmStatus | None = None


Manifest = EchoJob | InferenceSwarm | TrainingSwarm | SyncPolicy
KINDS: dict[str, type[EchoJob] | type[InferenceSwarm] | type[TrainingSwarm] | type[SyncPolicy]] = {
    "EchoJob": EchoJob,
    "InferenceSwarm": InferenceSwarm,
    "TrainingSwarm": TrainingSwarm,
    "SyncPolicy": SyncPolicy,
}
