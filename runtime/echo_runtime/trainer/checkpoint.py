"""Trainer checkpoints (weights, optimizer, version, RNG) and where a restarted trainer resumes.

A checkpoint is saved through the snapshot store beside the snapshots (``<job>/checkpoints/<step>/``)
with ``torch.distributed.checkpoint`` (DCP), **shard by shard**: every rank writes and uploads only
what it holds (its shards under FSDP; under DDP, DCP gives each replicated tensor to one rank), and
rank 0 commits the checkpoint once every rank's part is uploaded, in one create-only manifest write
(:meth:`echo_runtime.snapshots.SnapshotStore.commit_checkpoint`): a checkpoint is whole or invisible.
Its files:

* ``state/__<rank>_0.distcp`` and ``state/metadata.dcp`` — DCP's files (its ``.metadata`` renamed, as a
  store's file names are never hidden): the trainable parameters as ``weights/<name>`` and the
  optimizer's state tensors as ``optimizer/<name>/<key>``, each recorded with its global shape;
* ``rng.json`` — the python, numpy, torch (and CUDA) RNG states of every rank, in rank order;
* ``trainer.json`` — ``{"format", "version", "finetune", "worldSize", "baseModel", "paramGroups"}``
  (the optimizer's hyperparameters, parameters by name).

Because DCP records global shapes and every rank's pieces, **any number of ranks resumes** from any
checkpoint, sharded or not (:func:`load_state`): each rank reads only the pieces of the tensors it
holds, so no rank ever holds the whole model and its optimizer state at once. Nothing in a checkpoint
is unpickled beyond DCP's metadata classes (:class:`_Reader`), and tensors load with ``weights_only``.

The step of a checkpoint *is* the policy version after that many optimizer steps.

**Resuming** (:func:`resume_point`, pure). Snapshots are published after every step but checkpoints
only every N, so after a crash the store may hold versions newer than the newest checkpoint. Those
versions were announced and workers may be sampling from them, so they can be neither repeated (a
version number is never reused) nor skipped. The trainer therefore continues from the newest *published*
version ``m``: its weights come from snapshot ``m`` (a snapshot holds all trainable weights), its
optimizer moments and RNG from the newest checkpoint ``k ≤ m``. When ``m == k`` — a crash right after a
checkpoint, or a clean stop, which always checkpoints — the resumed state is exact; otherwise only
the optimizer's moments are ``m − k`` steps old. The next version published is ``m + 1`` either way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import pickle
import random
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from echo_runtime.trainer.policy import TrainablePolicy

FORMAT = 2
STATE_DIR = "state"
DCP_METADATA = f"{STATE_DIR}/metadata.dcp"
RNG = "rng.json"
STATE = "trainer.json"
_WEIGHTS = "weights/"
_OPTIMIZER = "optimizer/"
_SHARD_FILE = re.compile(r"^__[0-9]+_[0-9]+\.distcp$")


# ------------------------------------------------------------------------------------------- RNG
def capture_rng() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch, CUDA) as JSON-able data."""
    py = random.getstate()
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set this process's RNGs from :func:`capture_rng` data."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------------- files
@dataclasses.dataclass(frozen=True)
class Meta:
    """A checkpoint's ``trainer.json`` and ``rng.json``."""

    version: int
    finetune: str
    world_size: int
    base_model: str
    param_groups: list[dict[str, Any]]
    rng: list[dict[str, Any]]
    """One RNG state per rank of the run that wrote it."""


def state_tensors(policy: TrainablePolicy, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """What DCP saves: the trainable parameters and the optimizer's state tensors by name, as this rank
    holds them (DTensor shards when sharded), not copied."""
    names = {id(p): name for name, p in policy.named_trainable()}
    out: dict[str, torch.Tensor] = {_WEIGHTS + name: p.detach() for name, p in policy.named_trainable()}
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                if not isinstance(value, torch.Tensor):
                    raise TypeError(
                        f"optimizer state {names[id(param)]}/{key} is a {type(value).__name__}, not a tensor: "
                        "a checkpoint holds tensors only"
                    )
                out[f"{_OPTIMIZER}{names[id(param)]}/{key}"] = value
    return out


def param_groups(policy: TrainablePolicy, optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The optimizer's hyperparameters per group, its parameters by name (JSON)."""
    names = {id(p): name for name, p in policy.named_trainable()}
    groups = []
    for group in optimizer.param_groups:
        entry = {key: list(value) if isinstance(value, tuple) else value for key, value in group.items()}
        entry["params"] = [names[id(p)] for p in group["params"]]
        for key, value in entry.items():
            if not isinstance(value, (bool, int, float, str, list, type(None))):
                raise TypeError(
                    f"optimizer setting {key} is a {type(value).__name__}: not saved in a checkpoint"
                )
        groups.append(entry)
    return groups


def write_part(
    directory: str | Path, policy: TrainablePolicy, optimizer: torch.optim.Optimizer
) -> dict[str, Path]:
    """Write this rank's part of a checkpoint (DCP; a collective when there is a process group: every
    rank calls) into ``directory``, a folder of this rank's own; return its files by their names in the
    checkpoint. Rank 0's part includes DCP's metadata."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    writer = FileSystemWriter(out, single_file_per_rank=True, thread_count=1)
    with _alone_is_fine():
        save(state_tensors(policy, optimizer), storage_writer=writer, no_dist=not dist.is_initialized())
    files = {f"{STATE_DIR}/{path.name}": path for path in sorted(out.glob("__*.distcp"))}
    if (out / ".metadata").is_file():
        files[DCP_METADATA] = out / ".metadata"
    return files


def write_meta(
    directory: str | Path,
    policy: TrainablePolicy,
    optimizer: torch.optim.Optimizer,
    version: int,
    rng: list[dict[str, Any]],
    base_model: str = "",
) -> dict[str, Path]:
    """Write ``trainer.json`` and ``rng.json`` (rank 0, with every rank's RNG) into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / RNG).write_text(json.dumps(rng), encoding="utf-8")
    meta = {
        "format": FORMAT,
        "version": version,
        "finetune": policy.finetune,
        "worldSize": len(rng),
        "baseModel": base_model,
        "paramGroups": param_groups(policy, optimizer),
    }
    (out / STATE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return {STATE: out / STATE, RNG: out / RNG}


def write_checkpoint(
    directory: str | Path,
    policy: TrainablePolicy,
    optimizer: torch.optim.Optimizer,
    version: int,
    rng: list[dict[str, Any]],
    base_model: str = "",
) -> Path:
    """A whole checkpoint in one folder, from one process (a world of one): its part and its meta."""
    out = Path(directory)
    part = write_part(out / "part", policy, optimizer)
    (out / STATE_DIR).mkdir(parents=True, exist_ok=True)
    for name, path in part.items():
        path.rename(out / name)
    (out / "part").rmdir()
    write_meta(out, policy, optimizer, version, rng, base_model)
    return out


def read_meta(directory: str | Path) -> Meta:
    """A checkpoint folder's ``trainer.json`` and ``rng.json``, checked."""
    folder = Path(directory)
    missing = [n for n in (STATE, RNG, DCP_METADATA) if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {folder} is incomplete: missing {', '.join(missing)}")
    meta = json.loads((folder / STATE).read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"checkpoint {folder} has format {meta.get('format')!r}; this trainer reads format {FORMAT} "
            "(torch.distributed.checkpoint, written since Echo shards checkpoints). Its snapshots are "
            "unaffected: start a new job from the last one, or resume with the Echo that wrote it"
        )
    return Meta(
        version=int(meta["version"]),
        finetune=str(meta["finetune"]),
        world_size=int(meta["worldSize"]),
        base_model=str(meta.get("baseModel", "")),
        param_groups=list(meta["paramGroups"]),
        rng=json.loads((folder / RNG).read_text(encoding="utf-8")),
    )


def check_finetune(meta: Meta, policy: TrainablePolicy) -> None:
    """Refuse a checkpoint written for the other finetune mode (LoRA vs Full), naming both."""
    if meta.finetune != policy.finetune:
        raise ValueError(
            f"checkpoint of version {meta.version} was written for finetune {meta.finetune}, "
            f"this job trains {policy.finetune}; start a new job (or a new storage path) to change it"
        )


def load_state(
    directory: str | Path, policy: TrainablePolicy, optimizer: torch.optim.Optimizer, *, weights: bool = True
) -> Meta:
    """Load a checkpoint's optimizer state (and, with ``weights``, its parameters) into this rank's
    tensors, whatever the number of ranks that wrote it: DCP reads each rank's pieces of the global
    tensors (a collective when there is a process group: every rank calls, each with the whole
    checkpoint folder at hand). Returns its meta."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_loader import load

    folder = Path(directory)
    meta = read_meta(folder)
    check_finetune(meta, policy)
    reader = _Reader(folder / STATE_DIR)
    saved = reader.read_metadata().state_dict_metadata
    params = dict(policy.named_trainable())
    found = {key[len(_WEIGHTS) :] for key in saved if key.startswith(_WEIGHTS)}
    missing, unexpected = sorted(set(params) - found), sorted(found - set(params))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint of version {meta.version} does not fit this policy ({policy.finetune}): missing "
            f"{missing[:3]}, unexpected {unexpected[:3]} — was it written for another model or finetune mode?"
        )
    targets: dict[str, torch.Tensor] = {}
    moments: list[tuple[torch.nn.Parameter, str, torch.Tensor]] = []
    for name, param in params.items():
        size = tuple(getattr(saved[_WEIGHTS + name], "size", ()))
        if size != tuple(param.shape):
            raise ValueError(f"checkpoint tensor {name} has shape {size}, expected {tuple(param.shape)}")
        if weights:
            targets[_WEIGHTS + name] = param.detach()
        prefix = f"{_OPTIMIZER}{name}/"
        for key in sorted(k for k in saved if k.startswith(prefix)):
            item = saved[key]
            dtype = item.properties.dtype  # type: ignore[union-attr]
            # Moments shaped like their parameter are held like it (sharded); scalars (the step) whole.
            like = tuple(item.size) == tuple(param.shape)  # type: ignore[union-attr]
            value = (
                torch.zeros_like(param.detach(), dtype=dtype) if like else torch.zeros(item.size, dtype=dtype)
            )  # type: ignore[union-attr]
            targets[key] = value
            moments.append((param, key[len(prefix) :], value))
    with _alone_is_fine():
        load(targets, storage_reader=reader, no_dist=not dist.is_initialized())
    _load_param_groups(meta, policy, optimizer)
    for param, key, value in moments:
        optimizer.state[param][key] = value
    return meta


def _load_param_groups(meta: Meta, policy: TrainablePolicy, optimizer: torch.optim.Optimizer) -> None:
    names = {id(p): name for name, p in policy.named_trainable()}
    ours = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
    theirs = [list(group["params"]) for group in meta.param_groups]
    if ours != theirs:
        raise ValueError(
            f"checkpoint of version {meta.version} groups the optimizer's parameters differently from this "
            "trainer; was it written for another model?"
        )
    for group, saved in zip(optimizer.param_groups, meta.param_groups, strict=True):
        for key, value in saved.items():
            if key != "params":
                group[key] = tuple(value) if isinstance(group.get(key), tuple) else value


@contextlib.contextmanager
def _alone_is_fine() -> Iterator[None]:
    """DCP warns when it runs without a process group; a world of one does so on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class _Reader:
    """DCP's file reader for a checkpoint's ``state`` folder, reading its metadata from
    ``metadata.dcp`` with an unpickler that admits DCP's metadata classes only (a checkpoint is data,
    never code), and refusing shard file names outside the folder."""

    def __new__(cls, path: Path) -> Any:
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.metadata import StorageMeta

        class Reader(FileSystemReader):
            def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
                metadata = _SafeUnpickler(io.BytesIO((path / "metadata.dcp").read_bytes())).load()
                for info in (metadata.storage_data or {}).values():
                    if not _SHARD_FILE.match(str(info.relative_path)):
                        raise ValueError(
                            f"checkpoint {path}: DCP metadata names a file {info.relative_path!r}"
                        )
                if getattr(metadata, "storage_meta", None) is None:
                    metadata.storage_meta = StorageMeta()
                metadata.storage_meta.load_id = self.load_id
                return metadata

        return Reader(path)


_SAFE = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
        "ChunkStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"Path", "PosixPath", "WindowsPath"},
}  # fmt: skip
"""What DCP's metadata pickles (classes of plain data; ``_get_layout`` maps a name to a layout)."""


def _enum_member(cls: Any, name: str) -> Any:
    """``getattr`` as some Pythons pickle an enum member (Debian's 3.11 does), for the enums of
    :data:`_SAFE` and their members only."""
    import enum

    if (
        isinstance(cls, type)
        and issubclass(cls, enum.Enum)
        and cls.__name__ in _SAFE.get(cls.__module__, ())
        and name in cls.__members__
    ):
        return cls[name]
    raise pickle.UnpicklingError(f"checkpoint metadata asks for {cls!r}.{name}, which Echo never writes")


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        allowed = name in _SAFE.get(module, ()) or (
            module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise pickle.UnpicklingError(
                f"checkpoint metadata refers to {module}.{name}, which Echo never writes"
            )
        return super().find_class(module, name)


def rng_for_rank(meta: Meta, rank: int) -> dict[str, Any] | None:
    """The RNG state rank ``rank`` had, or None when the checkpoint came from a smaller world."""
    return meta.rng[rank] if rank < len(meta.rng) else None


# ------------------------------------------------------------------------------------------- resuming
@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a (re)started trainer continues."""

    version: int
    """``t``: the next step turns it into ``t + 1``, the next version published."""
    weights: Literal["base", "checkpoint", "snapshot"]
    """Where the trainable weights come from."""
    checkpoint: int | None
    """The checkpoint whose optimizer state and RNG are loaded (None: fresh)."""


def resume_point(latest_checkpoint: int | None, latest_snapshot: int | None) -> ResumePoint:
    """Where to continue, given the newest checkpoint step and the newest published version (pure)."""
    if latest_snapshot is None or (latest_checkpoint is not None and latest_snapshot <= latest_checkpoint):
        if latest_checkpoint is None:
            return ResumePoint(version=0, weights="base", checkpoint=None)
        return ResumePoint(version=latest_checkpoint, weights="checkpoint", checkpoint=latest_checkpoint)
    if latest_snapshot == 0:
        return ResumePoint(version=0, weights="base", checkpoint=latest_checkpoint)
    return ResumePoint(version=latest_snapshot, weights="snapshot", checkpoint=latest_checkpoint)
