"""Data parallelism with torch.distributed: the world from torchrun's environment, DDP, collectives.

``echorl trainer`` is launched once per process by ``torchrun`` (or alone, as a world of one). Promises:

* :func:`init_world` reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (torchrun sets them; absent means a
  world of one and no process group) and joins the process group with ``nccl`` on CUDA and ``gloo``
  otherwise. The device is ``cuda:<LOCAL_RANK>`` when CUDA is used.
* Every rank runs the same optimizer steps on its share of each batch (:func:`echo_runtime.trainer.batch.shard`);
  DDP averages gradients, so the update equals the one-process update on the whole batch up to the order
  of floating-point additions. Only rank 0 talks to the coordinator and the snapshot store: it receives
  each batch and :meth:`World.broadcast` s it, and it alone publishes and checkpoints.
* :class:`TorchCollective` all-reduces the step metrics, so every rank reports the same numbers.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

from echo_runtime.trainer.step import Collective

T = TypeVar("T")
DevicePreference = Literal["auto", "cpu", "cuda", "mps"]


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place in the data-parallel group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "cpu"
    backend: str | None = None
    """The process group's backend (``gloo``, ``nccl``), or None for a world of one."""

    @property
    def is_main(self) -> bool:
        """Rank 0: talks to the coordinator, publishes snapshots, writes checkpoints."""
        return self.rank == 0

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank (pickled); the identity in a world of one."""
        if self.backend is None:
            return obj
        box: list[Any] = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self._comm_device())
        result: T = box[0]
        return result

    def gather(self, obj: T) -> list[T] | None:
        """Every rank's ``obj`` on rank 0, in rank order (None on the other ranks)."""
        if self.backend is None:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def barrier(self) -> None:
        if self.backend is not None:
            dist.barrier()

    def _comm_device(self) -> torch.device | None:
        return torch.device(self.device) if self.backend == "nccl" else None


def resolve_device(preference: DevicePreference, local_rank: int = 0) -> str:
    """The torch device for ``preference``: ``auto`` is CUDA if available, else CPU (DDP has no MPS backend)."""
    if preference == "auto":
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if preference == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("trainingSwarm.device is 'cuda' but torch sees no CUDA device")
        return f"cuda:{local_rank}"
    if preference == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError("trainingSwarm.device is 'mps' but torch sees no MPS device")
    return preference


def init_world(preference: DevicePreference = "auto", timeout_s: float = 1800.0) -> World:
    """Join torchrun's process group (if any) and pick this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(preference, local_rank)
    if world_size == 1:
        return World(device=device)
    if device.startswith("mps"):
        raise RuntimeError("data-parallel training needs CUDA (nccl) or CPU (gloo); MPS has no process group")
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return World(rank=rank, world_size=world_size, local_rank=local_rank, device=device, backend=backend)


def shutdown(world: World) -> None:
    """Leave the process group (a no-op in a world of one)."""
    if world.backend is not None and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, world: World) -> torch.nn.Module:
    """``model`` in DistributedDataParallel when the world has more than one rank, else itself.

    DDP broadcasts rank 0's parameters at construction, so every rank starts from the same weights.
    """
    if world.backend is None:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [world.local_rank] if world.device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=device_ids)


class TorchCollective(Collective):
    """Sums and maxima over the ranks of a :class:`World` (all-reduce)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.world_size = world.world_size
        self.rank = world.rank

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: torch.Tensor) -> torch.Tensor:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: torch.Tensor, op: Any) -> torch.Tensor:
        if self.world.backend is None:
            return values
        device = self.world.device if self.world.backend == "nccl" else "cpu"
        buffer = values.to(device, copy=True)
        dist.all_reduce(buffer, op=op)
        return buffer.to(values.device)


def collective(world: World) -> Collective:
    """The collective for ``world``: all-reduce with a process group, the identity without."""
    return TorchCollective(world) if world.backend is not None else Collective()
