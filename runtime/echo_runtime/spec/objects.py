"""The four Kubernetes kinds: ``EchoJob``, ``InferenceSwarm``, ``TrainingSwarm``, ``SyncPolicy``.

An EchoJob names its model, task, algorithm and storage, and either embeds its sync policy and
swarms or references separate objects by name (shared pools, a SyncPolicy used by several jobs).

Some rules hold only in a cluster (``echorl validate`` without ``--local``, and the API server through
the CRD's CEL): an EchoJob there needs S3 storage and an explicit model path, a short name, no pool named
after another child of the job, and no ``Colocated`` mode. Each kind states them once, in
``cluster_problems``, next to the CEL rule that restates it for the API server, with the same message.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from echo_runtime.spec.base import Bool, Int, ObjectMeta, SpecModel, cel
from echo_runtime.spec.policy import COLOCATED_IN_CLUSTER, Algorithm, Model, SyncPolicySpec, Task
from echo_runtime.spec.rewards import RewardModel
from echo_runtime.spec.status import EchoJobStatus, SwarmStatus
from echo_runtime.spec.swarms import InferencePool, InferenceSwarmSpec, Storage, TrainingSwarmSpec

MAX_JOB_NAME = 40
"""Longest EchoJob name in a cluster: it prefixes child names such as ``<job>-coordinator-external``."""
JOB_NAME_IN_CLUSTER = (
    f"must start with a letter and have at most {MAX_JOB_NAME} characters in a cluster: an EchoJob's name "
    "prefixes the names of its Services and pods"
)
STORAGE_IN_CLUSTER = (
    "required in a cluster: a storage block with type S3, an endpoint and a bucket (pods on different nodes "
    "share snapshots through S3/MinIO)"
)
S3_IN_CLUSTER = "must be S3 in a cluster: pods on different nodes share snapshots through S3/MinIO (Local is for `echorl run`)"
MODEL_PATH_IN_CLUSTER = (
    "required in a cluster: name the model to train (a hub id, a path in the image or on a volume, or "
    "echorl:tiny); only `echorl run` defaults it to echorl:tiny"
)
RESERVED_POOL_NAMES = (
    "pool names 'trainer' and 'coordinator', and names starting with 'scorer-', are reserved in a cluster: "
    "they name other children of the job"
)


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
                "self.inferenceSwarms.all(p, p.name != 'trainer' && p.name != 'coordinator' && !p.name.startsWith('scorer-'))",
                RESERVED_POOL_NAMES,
                ".inferenceSwarms",
            ),
            (
                "has(self.managedBy) == has(oldSelf.managedBy)",
                "managedBy is immutable: it may be set only when the job is created",
                ".managedBy",
            ),
        )
    )

    model: Model = Field(default_factory=Model)
    """The base model and how it is fine-tuned; immutable once the job exists."""
    task: Task = Field(default_factory=Task)
    """Prompt source and verifier."""
    algorithm: Algorithm = Field(default_factory=Algorithm)
    """The RL objective (a named preset, overridable field by field) and the optimizer's settings."""
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
    reward_models: list[RewardModel] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Reward models and LLM judges beside the task's verifier, each run by a scoring pool of the job's
    own (docs/rewards.md); the reward is the weighted mean of the verifier and every one of them."""
    suspend: Bool = False
    """Scale every process of the job to zero (state in the snapshot store is kept)."""
    backoff_limit: Int = Field(default=3, ge=0, le=1000)
    """How many times the trainer may fail before the job is Failed (as a Kubernetes Job's
    ``backoffLimit``). Every rank of the trainer restarts together, from the last checkpoint; a pod
    deleted by hand counts as a failure, a disruption (eviction, preemption) does not."""
    active_deadline_seconds: Int | None = Field(default=None, ge=1)
    """Seconds the job may run before it is Failed with reason ``DeadlineExceeded`` and every process
    stopped (as a Kubernetes Job's ``activeDeadlineSeconds``): counted from its start, or from its last
    resume, so time suspended or queued does not count. Unset: no limit. The operator's (``echorl run``
    stops at ``maxSteps``)."""
    oom_policy: Literal["Fail", "Retry"] = "Fail"
    """What a trainer rank killed for running out of memory does: ``Fail`` the job at once with reason
    ``OOMKilled`` (the same step would run out of memory again: raise the trainer's memory limit or
    lower ``microBatchSize``/``microBatchTokens``), or ``Retry`` it like any failure, counted against
    ``backoffLimit``."""
    managed_by: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        json_schema_extra=cel(
            ("self == oldSelf", "managedBy is immutable: it may be set only when the job is created")
        ),
    )
    """The controller that runs this job (as a Job's ``managedBy``): unset or ``echorl.dev/operator``,
    Echo's operator; anything else, e.g. ``kueue.x-k8s.io/multikueue`` on a MultiKueue manager cluster,
    and the operator leaves the job alone — no children, no status — for that controller to run it
    (elsewhere) and mirror its status. Set only at creation."""
    ttl_seconds_after_finished: Int | None = Field(default=None, ge=0)
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
        names = [m.name for m in self.reward_models]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"rewardModels: name {twice[0]!r} appears twice; names must be unique")
        if self.reward_models and self.task.reward_weight + sum(m.weight for m in self.reward_models) <= 0:
            raise ValueError(
                "rewardModels: every weight is 0 (task.rewardWeight too); the reward needs one above 0"
            )
        return self


class EchoJob(SpecModel):
    """An RL post-training job (``kind: EchoJob``)."""

    # Cluster-only rules (see cluster_problems): a cluster's pods share snapshots through S3, child
    # names (``<name>-coordinator``, ``<name>-trainer-0``) must stay valid DNS labels, and a job
    # without a model path would silently train the tiny built-in model.
    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                f"self.metadata.name.size() <= {MAX_JOB_NAME} && self.metadata.name.matches('^[a-z]')",
                JOB_NAME_IN_CLUSTER,
                ".metadata.name",
            ),
            ("has(self.spec)", STORAGE_IN_CLUSTER, ".spec"),
            (  # an omitted storage block is defaulted to Local by the API server, so this catches it too
                "!has(self.spec) || self.spec.storage.type == 'S3'",
                S3_IN_CLUSTER,
                ".spec.storage.type",
            ),
            (
                "!has(self.spec) || has(self.spec.model.path)",
                MODEL_PATH_IN_CLUSTER,
                ".spec.model.path",
            ),
        )
    )

    api_version: Literal["echorl.dev/v1alpha1"] = "echorl.dev/v1alpha1"
    kind: Literal["EchoJob"] = "EchoJob"
    metadata: ObjectMeta
    spec: EchoJobSpec = Field(default_factory=EchoJobSpec)
    status: EchoJobStatus | None = None

    def cluster_problems(self) -> list[tuple[str, str]]:
        """(field path, message) for each cluster-only rule this job breaks; the CEL rules above and
        EchoJobSpec's reserved-name rule restate them for the API server."""
        out: list[tuple[str, str]] = []
        name = self.metadata.name
        if len(name) > MAX_JOB_NAME:
            out.append(("metadata.name", f"{JOB_NAME_IN_CLUSTER}, got {len(name)} characters"))
        elif not name[0].isalpha():
            out.append(("metadata.name", f"{JOB_NAME_IN_CLUSTER}, got {name!r}"))
        if "spec" not in self.model_fields_set:
            return [*out, ("spec", STORAGE_IN_CLUSTER)]
        job = self.spec
        if "storage" not in job.model_fields_set:
            out.append(("spec.storage", STORAGE_IN_CLUSTER))
        elif job.storage.type != "S3":
            out.append(("spec.storage.type", f"{S3_IN_CLUSTER}, got {job.storage.type!r}"))
        if "path" not in job.model.model_fields_set:
            out.append(("spec.model.path", MODEL_PATH_IN_CLUSTER))
        for i, pool in enumerate(job.inference_swarms):
            if pool.name in ("trainer", "coordinator") or pool.name.startswith("scorer-"):
                out.append((f"spec.inferenceSwarms[{i}].name", f"{RESERVED_POOL_NAMES}, got {pool.name!r}"))
        if job.sync_policy is not None and job.sync_policy.mode == "Colocated":
            out.append(("spec.syncPolicy.mode", COLOCATED_IN_CLUSTER))
        return out


class InferenceSwarm(SpecModel):
    """A pool of inference workers that jobs reference (``kind: InferenceSwarm``)."""

    api_version: Literal["echorl.dev/v1alpha1"] = "echorl.dev/v1alpha1"
    kind: Literal["InferenceSwarm"] = "InferenceSwarm"
    metadata: ObjectMeta
    spec: InferenceSwarmSpec = Field(default_factory=InferenceSwarmSpec)
    status: SwarmStatus | None = None

    def cluster_problems(self) -> list[tuple[str, str]]:
        """None: a swarm obeys the same rules in a cluster as for ``echorl run``."""
        return []


class TrainingSwarm(SpecModel):
    """A training group that jobs reference (``kind: TrainingSwarm``)."""

    api_version: Literal["echorl.dev/v1alpha1"] = "echorl.dev/v1alpha1"
    kind: Literal["TrainingSwarm"] = "TrainingSwarm"
    metadata: ObjectMeta
    spec: TrainingSwarmSpec = Field(default_factory=TrainingSwarmSpec)
    status: SwarmStatus | None = None

    def cluster_problems(self) -> list[tuple[str, str]]:
        """None: a swarm obeys the same rules in a cluster as for ``echorl run``."""
        return []


class SyncPolicy(SpecModel):
    """A sync policy that jobs reference (``kind: SyncPolicy``)."""

    api_version: Literal["echorl.dev/v1alpha1"] = "echorl.dev/v1alpha1"
    kind: Literal["SyncPolicy"] = "SyncPolicy"
    metadata: ObjectMeta
    spec: SyncPolicySpec = Field(default_factory=SyncPolicySpec)
    status: SwarmStatus | None = None

    def cluster_problems(self) -> list[tuple[str, str]]:
        """(field path, message) for each cluster-only rule (SyncPolicySpec's CEL restates them)."""
        return [("spec.mode", COLOCATED_IN_CLUSTER)] if self.spec.mode == "Colocated" else []


Manifest = EchoJob | InferenceSwarm | TrainingSwarm | SyncPolicy
KINDS: dict[str, type[EchoJob] | type[InferenceSwarm] | type[TrainingSwarm] | type[SyncPolicy]] = {
    "EchoJob": EchoJob,
    "InferenceSwarm": InferenceSwarm,
    "TrainingSwarm": TrainingSwarm,
    "SyncPolicy": SyncPolicy,
}
