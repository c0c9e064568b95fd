"""Storage and the two swarms: where snapshots live, who generates rollouts, who trains.

An ``InferenceSwarm`` is one pool of workers of one backend (a GPU pool with vLLM, a CPU pool with
transformers, a pool of Macs with mlx joining from outside the cluster). A ``TrainingSwarm`` is the
torch.distributed group that runs the trainer.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from echo_runtime.spec import podtemplate
from echo_runtime.spec.base import Bool, Int, SpecModel, cel
from echo_runtime.spec.podtemplate import NODE_AFFINITY_RULE, TemplatedPlacement


class Storage(SpecModel):
    """The snapshot store: a local directory (the embedded default) or an S3/MinIO bucket."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("self.type != 'S3' || has(self.endpoint)", "endpoint is required when type is S3", ".endpoint"),
            ("self.type != 'S3' || has(self.bucket)", "bucket is required when type is S3", ".bucket"),
            (
                "self.type == oldSelf.type && self.prefix == oldSelf.prefix && self.path == oldSelf.path"
                " && (has(self.bucket) ? has(oldSelf.bucket) && self.bucket == oldSelf.bucket"
                " : !has(oldSelf.bucket))",
                "storage type, bucket, prefix and path are immutable once the job exists: its snapshots "
                "live there; create a new EchoJob to use another store",
            ),
        )
    )

    type: Literal["Local", "S3"] = "Local"
    """``Local`` (a directory; ``echorl run`` only) or ``S3`` (S3 or MinIO; required in a cluster)."""
    path: str = Field(default="runs/store", min_length=1)
    """Local: the store's root directory (relative paths are relative to the working directory)."""
    endpoint: str | None = None
    """S3: ``host:port`` or URL of the S3/MinIO endpoint."""
    bucket: str | None = Field(
        default=None, min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]+[a-z0-9]$"
    )
    """S3: bucket name (created by the operator or ``echorl run`` if missing)."""
    prefix: str = Field(default="", pattern=r"^([^/].*)?$")
    """Key prefix inside the bucket; the layout below it is ``<job>/snapshots/<version>/``."""
    secure: Bool = True
    """S3: use HTTPS."""
    region: str | None = None
    """S3: region of the bucket (MinIO ignores it)."""
    credentials_secret: str | None = None
    """S3: name of a Secret with keys ``accessKey`` and ``secretKey``. Locally the credentials come
    from ``ECHORL_S3_ACCESS_KEY`` / ``ECHORL_S3_SECRET_KEY`` instead."""
    delete_policy: Literal["Retain", "Delete"] = "Retain"
    """Whether deleting the EchoJob deletes its snapshot prefix too."""

    @model_validator(mode="after")
    def _s3_needs_endpoint(self) -> Storage:
        if self.type == "S3":
            missing = [name for name in ("endpoint", "bucket") if getattr(self, name) is None]
            if missing:
                also = f" (and so is {missing[1]})" if len(missing) > 1 else ""
                raise ValueError(f"{missing[0]}: required when type is S3{also}")
        return self


Backend = Literal["transformers", "mlx", "vllm"]
Device = Literal["auto", "cpu", "cuda", "mps"]


# Guarded with has(): inside an EchoJob's inferenceSwarms the fields carry no schema defaults (see
# InferencePool), so an omitted field means "the default" there.
_SWARM_RULES: tuple[tuple[str, str, str], ...] = (
    (
        "!(has(self.backend) && self.backend == 'vllm' && has(self.device) && self.device in ['cpu', 'mps'])",
        "the vllm backend needs CUDA: set device to cuda or auto",
        ".device",
    ),
    (
        "!(has(self.backend) && self.backend == 'mlx' && has(self.device) && self.device == 'cuda')",
        "the mlx backend runs on Apple Silicon or CPU, not cuda",
        ".device",
    ),
    (
        "!(has(self.external) && self.external && has(self.replicas) && self.replicas != 0)",
        "external pools create no pods: leave replicas unset",
        ".replicas",
    ),
    (
        "!has(self.gpusPerReplica) || (has(self.backend) && self.backend == 'vllm')",
        "tensor parallelism is for the vllm backend only",
        ".gpusPerReplica",
    ),
    NODE_AFFINITY_RULE,
    podtemplate.container_rule("worker"),
)


class InferenceSwarmSpec(TemplatedPlacement):
    """One pool of inference workers of one backend."""

    model_config = ConfigDict(json_schema_extra=cel(*_SWARM_RULES))

    backend: Backend = "transformers"
    """``transformers`` (torch: CPU, CUDA, MPS), ``mlx`` (Apple Silicon; slow on Linux CPU) or
    ``vllm`` (CUDA only)."""
    replicas: Int | None = Field(default=None, ge=0, le=100_000)
    """Worker count. Optional so an autoscaler or ``kubectl scale`` may own it (default 1). Of an
    InferenceSwarm several EchoJobs use: the total, split evenly over the running jobs (what its scale
    subresource reports, so an HPA sees the pods it sets)."""
    device: Device = "auto"
    """Torch device: ``auto`` picks CUDA, then MPS, then CPU."""
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Inference dtype; defaults to the model's dtype."""
    external: Bool = False
    """Workers join from outside the cluster with a join token; no pods are created."""
    capacity: Int = Field(default=1, ge=1, le=1024)
    """Tasks (groups) one worker holds leases on at once."""
    max_workers: Int | None = Field(default=None, ge=1, le=100_000)
    """Most workers the pool's join token may have registered at once; workers the trainer quarantined
    count until the job ends, so a caught worker cannot simply join again. Unset: no limit."""
    max_leases: Int | None = Field(default=None, ge=1, le=1_000_000)
    """Most leases the pool's workers hold together, so one pool (or one hoarding worker) cannot take
    all the work. Unset: no limit beyond ``capacity`` per worker."""
    threads: Int | None = Field(default=None, ge=1, le=1024)
    """CPU threads per worker (torch/mlx); default: the process's share of the cores."""
    gpus_per_replica: Int | None = Field(default=None, ge=1, le=16)
    """vLLM pools: GPUs each worker requests and shards the model over (``tensor_parallel_size``);
    default 1. Not exercised by CI (no GPU there)."""

    @model_validator(mode="after")
    def _backend_device(self) -> InferenceSwarmSpec:
        if self.backend == "vllm" and self.device in ("cpu", "mps"):
            raise ValueError(f"device: the vllm backend needs CUDA, got {self.device!r}")
        if self.backend == "mlx" and self.device == "cuda":
            raise ValueError("device: the mlx backend runs on Apple Silicon or CPU, not 'cuda'")
        if self.external and self.replicas not in (None, 0):
            raise ValueError("replicas: external pools create no pods; leave replicas unset")
        if self.gpus_per_replica is not None and self.backend != "vllm":
            raise ValueError("gpusPerReplica: tensor parallelism is for the vllm backend only")
        podtemplate.check_container(self.pod_template, "worker")
        return self


def _pool_schema(schema: dict[str, Any]) -> None:
    """CRD schema of an inline pool: no defaults on its own fields, and ``swarmRef`` excludes them.

    A default would make every field present after the API server's defaulting, so ``swarmRef``
    could never be used alone; the operator applies the defaults when it resolves the pool.
    """
    properties: dict[str, Any] = schema.get("properties", {})
    for prop in properties.values():
        prop.pop("default", None)
    inline = [name for name in properties if name not in ("name", "swarmRef")]
    rules = [*_SWARM_RULES]
    rules.append(
        (
            "!has(self.swarmRef) || !(" + " || ".join(f"has(self.{name})" for name in inline) + ")",
            "swarmRef cannot be combined with inline pool fields; set them on the referenced InferenceSwarm",
            ".swarmRef",
        )
    )
    schema.update(cel(*rules))


class InferencePool(InferenceSwarmSpec):
    """An inference pool of an EchoJob: inline fields, or ``swarmRef`` to a separate InferenceSwarm."""

    model_config = ConfigDict(json_schema_extra=_pool_schema)

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    """Pool name, unique within the job; names the pool's Deployment and metrics."""
    swarm_ref: str | None = None
    """Name of an InferenceSwarm object in the same namespace; then no inline fields may be set."""

    @model_validator(mode="after")
    def _ref_or_inline(self) -> InferencePool:
        if self.swarm_ref is not None:
            inline = sorted(self.model_fields_set - {"name", "swarm_ref"})
            if inline:
                raise ValueError(f"swarmRef: cannot be combined with inline fields ({', '.join(inline)})")
        return self


Tracker = Literal["tensorboard", "mlflow", "wandb", "trackio"]
TRACKERS: tuple[str, ...] = ("tensorboard", "mlflow", "wandb", "trackio")
"""The experiment trackers Echo reports to (TRL's ``report_to`` names); each is an optional extra."""


class Tracking(SpecModel):
    """Experiment trackers the job's metrics go to, besides ``metrics.jsonl`` (docs/tracking.md).

    The trainer's rank 0 reports in a cluster; ``echorl run`` reports from its own process, which also
    sees the held-out evaluations. A tracker that fails never stops training: it is reported once,
    retried, and turned off after repeated failures."""

    report_to: list[Tracker] = Field(
        default_factory=list, max_length=4, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """``tensorboard``, ``mlflow``, ``wandb``, ``trackio``; empty: no tracker (``echorl run
    --report-to`` overrides it)."""
    project: str = Field(default="echorl", min_length=1, max_length=128)
    """The W&B and trackio project, the MLflow experiment."""
    run_name: str | None = Field(default=None, min_length=1, max_length=128)
    """The run's name in the trackers (default: the job's name)."""
    dir: str | None = Field(default=None, min_length=1)
    """Where the file-based trackers write: TensorBoard's event files, MLflow's file store (unless
    ``MLFLOW_TRACKING_URI`` is set), W&B's offline runs (unless ``WANDB_MODE``/``WANDB_API_KEY`` say
    online), trackio's database (unless ``TRACKIO_DIR`` is set). Default: ``<run dir>/tracking`` for
    ``echorl run``, ``/tmp/echorl-tracking`` in the trainer pod (mount a volume there to keep it)."""
    samples_every: Int = Field(default=10, ge=0, le=1_000_000)
    """A table of sample completions (prompt, completion, reward, worker) every N versions; 0: none."""
    samples: Int = Field(default=4, ge=1, le=64)
    """Rows in each table of samples (one completion from each of the batch's first groups)."""
    secret_name: str | None = Field(default=None, min_length=1, max_length=253)
    """A Secret whose keys become the trainer pod's environment (``WANDB_API_KEY``,
    ``MLFLOW_TRACKING_URI``, ``MLFLOW_TRACKING_TOKEN``, ...). Locally, set them in your shell."""

    @model_validator(mode="after")
    def _unique(self) -> Tracking:
        twice = sorted({t for t in self.report_to if self.report_to.count(t) > 1})
        if twice:
            raise ValueError(f"reportTo: each tracker may appear once, {', '.join(twice)} appears twice")
        return self


class FSDP(SpecModel):
    """How ``strategy: FSDP`` shards (PyTorch's FSDP2, ``fully_shard``)."""

    mixed_precision: Bool = False
    """On CUDA: compute the forward and backward in bfloat16 and reduce gradients in float32 (the
    sharded parameters and the optimizer stay in the model's dtype). The trainer's recomputed
    log-probs are then bfloat16's: set ``syncPolicy.maxLogprobMismatch`` for it (docs/sharding.md).
    On CPU the model's dtype is used throughout."""
    offload: Bool = False
    """On CUDA: keep the sharded parameters, their gradients and the optimizer state in host memory,
    copying each layer's to the GPU while it runs (larger models fit, steps are slower). Ignored on
    CPU."""
    reshard_after_forward: Bool = True
    """Free each layer's gathered parameters after its forward and gather them again for its
    backward (less memory, one more all-gather a layer); false keeps them in between."""


class TrainingSwarmSpec(TemplatedPlacement):
    """The trainer's torch.distributed group; rank 0 publishes snapshots."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "self.gpusPerNode == 0 || self.processesPerNode <= self.gpusPerNode",
                "processesPerNode must be ≤ gpusPerNode (one process per GPU)",
                ".processesPerNode",
            ),
            NODE_AFFINITY_RULE,
            podtemplate.container_rule("trainer"),
        )
    )

    nodes: Int = Field(default=1, ge=1, le=4096)
    """Trainer nodes (pods of the trainer StatefulSet); torchrun ``--nnodes``."""
    processes_per_node: Int = Field(default=1, ge=1, le=64)
    """torchrun ``--nproc-per-node``; one per GPU on GPU nodes."""
    gpus_per_node: Int = Field(default=0, ge=0, le=64)
    """GPUs each trainer pod requests (``nvidia.com/gpu``); 0 trains on CPU."""
    device: Device = "auto"
    """Torch device: ``auto`` picks CUDA, then MPS, then CPU."""
    checkpoint_interval: Int = Field(default=10, ge=1)
    """Checkpoint (weights, optimizer, step, RNG) every N optimizer steps."""
    snapshot_anchor_interval: Int | None = Field(default=None, ge=1, le=100000)
    """Full fine-tuning: publish every N-th version in full (an anchor) and each version in between as a
    sparse delta, the weights that changed since the version before; readers rebuild the full weights
    and check them bit for bit (docs/snapshots.md). Unset: every version in full. LoRA jobs publish
    the adapter, which is small, and ignore it."""
    threads: Int | None = Field(default=None, ge=1, le=1024)
    """CPU threads per trainer process (torch); default: the process's share of the cores."""
    strategy: Literal["DDP", "FSDP"] = "DDP"
    """How the trainer's ranks hold the model. ``DDP``: each holds all of it, with its gradients and
    optimizer state (DistributedDataParallel). ``FSDP``: each holds 1/N of them (PyTorch's FSDP2,
    ``fully_shard`` on every decoder layer and the root) and gathers a layer's parameters only while
    it runs: for models that do not fit one device. Both make the same update; checkpoints are the
    same files either way, so a job may resume with another strategy or rank count
    (docs/sharding.md)."""
    fsdp: FSDP = Field(default_factory=FSDP)
    """Settings of ``strategy: FSDP``."""
    tracking: Tracking = Field(default_factory=Tracking)
    """Experiment trackers (TensorBoard, MLflow, W&B, trackio) and the tables of sample completions."""

    @model_validator(mode="after")
    def _gpus(self) -> TrainingSwarmSpec:
        if self.gpus_per_node and self.processes_per_node > self.gpus_per_node:
            raise ValueError(
                f"processesPerNode: must be ≤ gpusPerNode ({self.gpus_per_node}), got {self.processes_per_node}"
            )
        podtemplate.check_container(self.pod_template, "trainer")
        return self
