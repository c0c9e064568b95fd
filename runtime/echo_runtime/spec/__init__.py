"""Echo's manifest models: the single source of the CLI's, the runtime's and the CRDs' schemas.

Kinds (``apiVersion: echorl.dev/v1alpha1``): :class:`EchoJob`, :class:`InferenceSwarm`,
:class:`TrainingSwarm`, :class:`SyncPolicy`. Load files with :func:`load_file` / :func:`load_job`
(:func:`read_file` also lists the documents of other kinds it skipped).
"""

from echo_runtime.spec.base import API_GROUP, API_VERSION, GROUP_VERSION, LOCAL_DEFAULT, ObjectMeta, SpecModel
from echo_runtime.spec.load import (
    Documents,
    Finding,
    ManifestError,
    ResolvedJob,
    load_documents,
    load_file,
    load_job,
    read_documents,
    read_file,
    resolve,
)
from echo_runtime.spec.objects import (
    KINDS,
    EchoJob,
    EchoJobSpec,
    InferenceSwarm,
    Manifest,
    SyncPolicy,
    TrainingSwarm,
)
from echo_runtime.spec.policy import Algorithm, LoRA, Model, Retention, Sampling, SyncPolicySpec, Task
from echo_runtime.spec.rewards import RewardModel
from echo_runtime.spec.scheduling import Affinity, Placement, Resources, Toleration
from echo_runtime.spec.status import Condition, EchoJobStatus, PoolStatus, SwarmStatus
from echo_runtime.spec.swarms import InferencePool, InferenceSwarmSpec, Storage, TrainingSwarmSpec

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "GROUP_VERSION",
    "KINDS",
    "LOCAL_DEFAULT",
    "Affinity",
    "Algorithm",
    "Condition",
    "Documents",
    "EchoJob",
    "EchoJobSpec",
    "EchoJobStatus",
    "Finding",
    "InferencePool",
    "InferenceSwarm",
    "InferenceSwarmSpec",
    "LoRA",
    "Manifest",
    "ManifestError",
    "Model",
    "ObjectMeta",
    "Placement",
    "PoolStatus",
    "ResolvedJob",
    "Resources",
    "Retention",
    "RewardModel",
    "Sampling",
    "SpecModel",
    "Storage",
    "SwarmStatus",
    "SyncPolicy",
    "SyncPolicySpec",
    "Task",
    "Toleration",
    "TrainingSwarm",
    "TrainingSwarmSpec",
    "load_documents",
    "load_file",
    "load_job",
    "read_documents",
    "read_file",
    "resolve",
]
