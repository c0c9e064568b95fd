"""Trainer checkpoints (weights, optimizer, version, RNG) and where a restarted trainer resumes.

A checkpoint is a directory of four files, saved through the snapshot store beside the snapshots
(``<job>/checkpoints/<step>/``, :meth:`echo_runtime.snapshots.SnapshotStore.save_checkpoint`):

* ``trainable.safetensors`` — the trainable parameters by name (the LoRA adapter, or every weight);
* ``optimizer.pt`` — the optimizer's ``state_dict`` (loaded with ``weights_only=True``);
* ``rng.json`` — the python, numpy, torch (and CUDA) RNG states of every rank, in rank order;
* ``trainer.json`` — ``{"format", "version", "finetune", "worldSize", "baseModel"}``.

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

import dataclasses
import json
import random
from pathlib import Path
from typing import Any, Literal

import numpy as np
import safetensors.torch
import torch

from echo_runtime.trainer.policy import TrainablePolicy

FORMAT = 1
WEIGHTS = "trainable.safetensors"
OPTIMIZER = "optimizer.pt"
RNG = "rng.json"
STATE = "trainer.json"


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
class Checkpoint:
    """A checkpoint read back from its directory."""

    version: int
    finetune: str
    world_size: int
    base_model: str
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: list[dict[str, Any]]
    """One RNG state per rank of the run that wrote it."""


def write_checkpoint(
    directory: str | Path,
    policy: TrainablePolicy,
    optimizer: torch.optim.Optimizer,
    version: int,
    rng: list[dict[str, Any]],
    base_model: str = "",
) -> Path:
    """Write the checkpoint files of ``version`` into ``directory`` (created); return it."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(policy.trainable_state(), str(out / WEIGHTS), metadata={"format": "pt"})
    torch.save(optimizer.state_dict(), out / OPTIMIZER)
    (out / RNG).write_text(json.dumps(rng), encoding="utf-8")
    meta = {
        "format": FORMAT,
        "version": version,
        "finetune": policy.finetune,
        "worldSize": len(rng),
        "baseModel": base_model,
    }
    (out / STATE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def read_checkpoint(directory: str | Path) -> Checkpoint:
    """Read a checkpoint directory written by :func:`write_checkpoint`."""
    folder = Path(directory)
    missing = [n for n in (WEIGHTS, OPTIMIZER, RNG, STATE) if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(f"checkpoint {folder} is incomplete: missing {', '.join(missing)}")
    meta = json.loads((folder / STATE).read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"checkpoint {folder} has format {meta.get('format')!r}; this trainer reads {FORMAT}"
        )
    return Checkpoint(
        version=int(meta["version"]),
        finetune=str(meta["finetune"]),
        world_size=int(meta["worldSize"]),
        base_model=str(meta.get("baseModel", "")),
        weights=safetensors.torch.load_file(str(folder / WEIGHTS)),
        optimizer=torch.load(folder / OPTIMIZER, map_location="cpu", weights_only=True),
        rng=json.loads((folder / RNG).read_text(encoding="utf-8")),
    )


def apply_checkpoint(
    checkpoint: Checkpoint, policy: TrainablePolicy, optimizer: torch.optim.Optimizer, *, weights: bool = True
) -> None:
    """Load the checkpoint's optimizer state (and, with ``weights``, its parameters) into the trainer."""
    if checkpoint.finetune != policy.finetune:
        raise ValueError(
            f"checkpoint of version {checkpoint.version} was written for finetune {checkpoint.finetune}, "
            f"this job trains {policy.finetune}; start a new job (or a new storage path) to change it"
        )
    if weights:
        policy.load_trainable_state(checkpoint.weights)
    optimizer.load_state_dict(checkpoint.optimizer)


def rng_for_rank(checkpoint: Checkpoint, rank: int) -> dict[str, Any] | None:
    """The RNG state rank ``rank`` had, or None when the checkpoint came from a smaller world."""
    return checkpoint.rng[rank] if rank < len(checkpoint.rng) else None


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
