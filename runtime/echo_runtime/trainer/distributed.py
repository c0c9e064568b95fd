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
* ``strategy: FSDP`` (:func:`wrap`) shards instead of replicating: PyTorch's FSDP2 (``fully_shard``) on
  every decoder layer (the classes the model names in ``_no_split_modules``) and then on the root, over
  a one-dimensional device mesh of all ranks. The parameters become DTensors sharded on their first
  dimension; each layer's are all-gathered for its forward and backward, and its gradients
  reduce-scattered (averaged, as DDP's all-reduce is). So the update equals DDP's, and the single
  process's, on the same batch. Every rank then takes part in every forward of the trained module,
  and reading a full parameter (:func:`full_tensor`) is a collective too.
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
Strategy = Literal["DDP", "FSDP"]
"""How the ranks hold the model: replicated (DDP) or sharded (FSDP2)."""


@dataclasses.dataclass(frozen=True)
class FSDP:
    """FSDP2's settings (``strategy="FSDP"``)."""

    mixed_precision: bool = False
    """On CUDA, compute the forward and backward in bfloat16 and reduce gradients in float32 (the sharded
    parameters and the optimizer stay in the model's dtype). On CPU the model's dtype is used throughout."""
    offload: bool = False
    """On CUDA, keep the sharded parameters, their gradients and the optimizer state in host memory and
    copy each layer's to the GPU when it runs. Nothing to offload on CPU: ignored there."""
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward (gathered again for its backward)."""


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


def shutdown(world: World, together: bool = True) -> None:
    """Leave the process group (and the group of one a sharded trainer alone made, :func:`shard`).

    ``together`` (a normal end): wait at a barrier for every rank first, so no rank tears its gloo
    connections down while a peer is still using the group (rank 0 still writing its files) — seen as a
    rank aborting at exit ("terminate called without an active exception"). After a failure, leave at
    once: a peer that died would hold the barrier for the group's whole timeout.
    """
    if dist.is_initialized():
        if together and world.world_size > 1:
            dist.barrier()
        dist.destroy_process_group()


def wrap(
    model: torch.nn.Module, world: World, strategy: Strategy = "DDP", fsdp: FSDP | None = None
) -> torch.nn.Module:
    """The module that trains ``model`` with ``strategy``.

    ``DDP``: ``model`` in DistributedDataParallel when the world has more than one rank, else ``model``
    itself; DDP broadcasts rank 0's parameters at construction, so every rank starts from the same
    weights. ``FSDP``: ``model`` itself, sharded in place (:func:`shard`), even in a world of one.
    Build the optimizer after this: sharding replaces the parameters.
    """
    if strategy == "FSDP":
        return shard(model, world, fsdp or FSDP())
    if world.backend is None:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [world.local_rank] if world.device.startswith("cuda") else None
    return DistributedDataParallel(model, device_ids=device_ids)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class the model (or the one peft wraps) names in
    ``_no_split_modules``, as Hugging Face models do (``Qwen3DecoderLayer``, ``LlamaDecoderLayer``)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"strategy FSDP: {type(model).__name__} names no decoder layer class in _no_split_modules, "
            "so Echo cannot tell which modules to shard one by one; use strategy DDP for it"
        )
    return layers


def shard(model: torch.nn.Module, world: World, options: FSDP) -> torch.nn.Module:
    """``fully_shard`` each decoder layer, then the root, over all ranks (in place; returns ``model``).

    With a process group the mesh spans its ranks; a world of one gets a group of one of its own
    (``gloo`` on CPU, ``nccl`` on CUDA), so a sharded trainer runs the same code alone. Mixed precision
    (bfloat16 compute, float32 gradient reduction) and offloading apply on CUDA only.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if world.backend is None and not dist.is_initialized():
        _alone(world)
    cuda = world.device.startswith("cuda")
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world.world_size,))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": options.reshard_after_forward}
    if cuda and options.mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cuda and options.offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _alone(world: World) -> None:
    """A process group of one (FSDP needs one even alone), on a free port of the loopback interface."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = "nccl" if world.device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """The whole of ``value``: a DTensor gathered from every rank (a collective), a tensor as it is."""
    gather = getattr(value, "full_tensor", None)
    return gather() if gather is not None else value


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
