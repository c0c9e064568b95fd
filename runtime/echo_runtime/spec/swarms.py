"""Storage and the two swarms: where snapshots live, who generates rollouts, who trains.

An ``InferenceSwarm`` is one pool of workers of one backend (a GPU pool with vLLM, a CPU pool with
transformers, a pool of Macs with mlx joining from outside the cluster). A ``TrainingSwarm`` is the
torch.distributed group that runs the trainer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from echo_runtime.spec.base import SpecModel
from echo_runtime.spec.scheduling import Placement


class Storage(SpecModel):
    """The snapshot store: a local directory (the embedded default) or an S3/MinIO bucket."""

    type: Literal["Local", "S3"] = "Local"
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
    secure: bool = True
    """S3: use HTTPS."""
    region: str | None = None
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
                raise ValueError(f"{missing[0]}: required when type is S3")
        return self


Backend = Literal["transformers", "mlx", "vllm"]
Device = Literal["auto", "cpu", "cuda", "mps"]


class InferenceSwarmSpec(Placement):
    """One pool of inference workers of one backend."""

    backend: Backend = "transformers"
    """``transformers`` (torch: CPU, CUDA, MPS), ``mlx`` (Apple Silicon; slow on Linux CPU) or
    ``vllm`` (CUDA only)."""
    replicas: int | None = Field(default=None, ge=0, le=100_000)
    """Worker count. Optional so an autoscaler or ``kubectl scale`` may own it (default 1)."""
    device: Device = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Inference dtype; defaults to the model's dtype."""
    external: bool = False
    """Workers join from outside the cluster with a join token; no pods are created."""
    capacity: int = Field(default=1, ge=1, le=1024)
    """Tasks (groups) one worker holds leases on at once."""
    threads: int | None = Field(default=None, ge=1, le=1024)
    """CPU threads per worker (torch/mlx); default: the process's share of the cores."""

    @model_validator(mode="after")
    def _backend_device(self) -> InferenceSwarmSpec:
        if self.backend == "vllm" and self.device in ("cpu", "mps"):
            raise ValueError(f"device: the vllm backend needs CUDA, got {self.device!r}")
        if self.backend == "mlx" and self.device == "cuda":
            raise ValueError("device: the mlx backend runs on Apple Silicon or CPU, not 'cuda'")
        if self.external and self.replicas not in (None, 0):
            raise ValueError("replicas: external pools create no pods; leave replicas unset")
        return self


class InferencePool(InferenceSwarmSpec):
    """An inference pool of an EchoJob: inline fields, or ``swarmRef`` to a separate InferenceSwarm."""

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


class TrainingSwarmSpec(Placement):
    """The trainer's torch.distributed group; rank 0 publishes snapshots."""

    nodes: int = Field(default=1, ge=1, le=4096)
    processes_per_node: int = Field(default=1, ge=1, le=64)
    """torchrun ``--nproc-per-node``; one per GPU on GPU nodes."""
    gpus_per_node: int = Field(default=0, ge=0, le=64)
    device: Device = "auto"
    checkpoint_interval: int = Field(default=10, ge=1)
    """Checkpoint (weights, optimizer, step, RNG) every N optimizer steps."""
    threads: int | None = Field(default=None, ge=1, le=1024)

    @model_validator(mode="after")
    def _gpus(self) -> TrainingSwarmSpec:
        if self.gpus_per_node and self.processes_per_node > self.gpus_per_node:
            raise ValueError(
                f"processesPerNode: must be ≤ gpusPerNode ({self.gpus_per_node}), got {self.processes_per_node}"
            )
        return self
