"""Delta snapshots: a fully fine-tuned version published as the few weights that changed since the last.

Successive versions of a fully fine-tuned model differ in few elements: with bf16 weights and a small
learning rate most updates round away, so most elements are bit-identical step to step. A trainer with
``trainingSwarm.snapshotAnchorInterval: N`` publishes every N-th version in full (an *anchor*) and each
version in between as a *delta* against the version before it:

* the delta file (:data:`DELTA_FILE`, safetensors) holds, for every tensor with a changed element, the
  flat indices of the changed elements (``<name>.__idx__``, int32, or int64 for tensors of 2³¹
  elements or more) and their new values
  (``<name>.__val__``, the tensor's own dtype). "Changed" compares bit patterns, never values, so
  ``-0.0``/``+0.0`` and NaN payloads round-trip exactly;
* the manifest's :class:`~echo_runtime.snapshots.manifest.Delta` names the version it applies to
  (``base``), the anchor the chain starts from, and the name, size and sha256 of every file the *full*
  snapshot consists of (``model.safetensors``, or the shards and their index).

A reader materialises a delta version into its cache entry: it copies the base version's full files
from its own (verified) cache entry, writes the changed elements in place (memory-mapped: the cost is
one file copy plus the changed bytes), and checks every file against the manifest before the
entry becomes visible: sizes always, sha256 when the reader re-hashes what it takes from its cache
(:func:`materialise`). So what a worker loads is bit-identical to what the trainer would have written
in full (the benchmark, ``benchmarks/deltas.py``, and the tests compare it bit for bit). A delta version is kept by retention only with its whole chain back to
its anchor (:func:`echo_runtime.snapshots.retention.plan`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from echo_runtime.snapshots import errors, payloads
from echo_runtime.snapshots.manifest import Delta, FileEntry

DELTA_FILE = "weights.delta"
"""The changed elements, in safetensors format. Not named ``*.safetensors`` on purpose: loaders that
glob a folder for ``*.safetensors`` (vLLM) must never mistake it for a weight shard."""
_IDX, _VAL = ".__idx__", ".__val__"
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NP_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of the same width (a view: no copy, no rounding)."""
    flat = tensor.detach().reshape(-1)
    if tensor.dtype == torch.bool:
        return flat.view(torch.uint8)
    return flat.view(_BITS[tensor.element_size()])


def diff(
    previous: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The delta tensors that turn ``previous`` into ``current`` (both on the CPU, same names, shapes and
    dtypes; a ValueError says what differs, and the caller then publishes an anchor instead)."""
    if previous.keys() != current.keys():
        changed = sorted(set(previous) ^ set(current))[:5]
        raise ValueError(f"the state dicts hold different tensors ({', '.join(changed)})")
    out: dict[str, torch.Tensor] = {}
    for name, now in current.items():
        before = previous[name]
        if before.dtype != now.dtype or before.shape != now.shape:
            raise ValueError(
                f"{name}: {before.dtype}{tuple(before.shape)} became {now.dtype}{tuple(now.shape)}"
            )
        new_bits = bits(now.contiguous())
        where = torch.nonzero(bits(before.contiguous()) != new_bits).reshape(-1)
        if where.numel():
            out[name + _IDX] = where.to(torch.int32 if now.numel() < 2**31 else torch.int64)
            out[name + _VAL] = now.detach().reshape(-1)[where].contiguous()
    return out


def save(delta: Mapping[str, torch.Tensor], path: Path) -> Path:
    """Write ``delta`` (from :func:`diff`) to ``path``; an empty delta is a valid file too."""
    safetensors.torch.save_file(dict(delta), str(path), metadata={"format": "echorl-delta"})
    return path


def full_entries(
    state_dict: Mapping[str, torch.Tensor], max_shard_bytes: int = payloads.DEFAULT_SHARD_BYTES
) -> tuple[FileEntry, ...]:
    """Name, size and sha256 of each file :func:`payloads.save_state_dict` would write for
    ``state_dict``, computed in memory (nothing is written)."""
    entries = []
    for name, data in payloads.serialise_state_dict(state_dict, max_shard_bytes=max_shard_bytes):
        entries.append(FileEntry(name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest()))
    return tuple(entries)


def materialise(base: Path, folder: Path, *, delta: Delta, verify: bool = False) -> None:
    """Make ``folder`` (which holds the verified :data:`DELTA_FILE`) a full snapshot: copy the base
    version's full files from ``base`` (a cache entry), apply the changes in place, and check every
    file against ``delta.files``: its size always, its sha256 with ``verify``. Raise
    :class:`~errors.CorruptSnapshotError` if one does not match.

    Without ``verify`` the result is as trustworthy as its inputs: the base entry was verified when it
    entered the cache (and is trusted from there like any cached version), the delta was verified as it
    was downloaded, and applying it is exact. ``verify`` is for a reader that re-hashes what it takes
    from its cache (``fetch(..., verify_cached=True)``): it then also proves the rebuilt bytes are the
    trainer's, at the cost of hashing the whole model."""
    names = [f.name for f in delta.files]
    for name in names:
        source = base / name
        if not source.is_file():
            raise errors.CorruptSnapshotError(
                f"version {delta.base} (the base of a delta) has no {name} in {base}", delta.base, name
            )
        shutil.copyfile(source, folder / name)
    changes = safetensors.torch.load_file(str(folder / DELTA_FILE))
    located = _locate(folder, names)
    for key in sorted(changes):
        if not key.endswith(_IDX):
            continue
        tensor = key[: -len(_IDX)]
        if tensor not in located:
            raise errors.CorruptSnapshotError(
                f"the delta changes {tensor!r}, which the base version {delta.base} does not have",
                delta.base,
                DELTA_FILE,
            )
        file, start, width, count = located[tensor]
        index = changes[key].numpy()
        values = changes[tensor + _VAL]
        if (index.size and (index.min() < 0 or index.max() >= count)) or values.element_size() != width:
            raise errors.CorruptSnapshotError(
                f"the delta's change to {tensor!r} does not fit the tensor", delta.base, DELTA_FILE
            )
        view = np.memmap(folder / file, dtype=_NP_BITS[width], mode="r+", offset=start, shape=(count,))
        view[index] = bits(values).numpy().view(_NP_BITS[width])
        del view  # unmapped; the pages go to the file like any write (no msync: the cache never fsyncs)
    for entry in delta.files:
        size = (folder / entry.name).stat().st_size
        if size != entry.size:
            raise errors.CorruptSnapshotError(
                f"{entry.name} rebuilt from version {delta.base} has {size} bytes, the trainer's {entry.size}",
                delta.base,
                entry.name,
            )
        if not verify:
            continue
        got = _sha256(folder / entry.name)
        if got != entry.sha256:
            raise errors.CorruptSnapshotError(
                f"{entry.name} rebuilt from version {delta.base} and the delta does not match the trainer's "
                f"(sha256 {got[:16]}…, expected {entry.sha256[:16]}…); nothing was loaded",
                delta.base,
                entry.name,
            )


def _size(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _locate(folder: Path, names: list[str]) -> dict[str, tuple[str, int, int, int]]:
    """tensor name → (file, byte offset of its data, element width, element count) in the safetensors
    files ``names`` of ``folder`` (the index file, if any, is skipped)."""
    found: dict[str, tuple[str, int, int, int]] = {}
    for name in names:
        if name == payloads.FULL_INDEX:
            continue
        with (folder / name).open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for tensor, info in header.items():
            if tensor == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            count = int(np.prod(info["shape"], dtype=np.int64)) if info["shape"] else 1
            width = (end - begin) // count if count else 1
            found[tensor] = (name, 8 + length + begin, width, count)
    return found


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


class Writer:
    """The publishing side: remembers the last published weights and writes each version as an anchor
    or as a delta against the one before.

    A version is an anchor when it is a multiple of ``anchor_interval``, when it is the first this
    writer exports (a restarted trainer has no previous weights in memory), when it does not follow the
    last version exported, when the tensors changed names, shapes or dtypes, or when the delta would
    be more than half the full size (float32 weights under Adam change almost everywhere each step). It keeps one CPU copy
    of the weights (the model's size in memory).
    """

    def __init__(self, anchor_interval: int, *, max_shard_bytes: int = payloads.DEFAULT_SHARD_BYTES) -> None:
        if anchor_interval < 1:
            raise ValueError(f"anchor_interval: must be ≥ 1, got {anchor_interval}")
        self.anchor_interval = anchor_interval
        self.max_shard_bytes = max_shard_bytes
        self._previous: dict[str, torch.Tensor] | None = None
        self._base = self._anchor = -1

    def export(
        self, version: int, state_dict: Mapping[str, torch.Tensor], folder: Path
    ) -> tuple[dict[str, Path], Delta | None]:
        """Write ``version``'s files into ``folder``; return them and the manifest's delta (None: full)."""
        current = {n: t.clone() for n, t in payloads.storable(state_dict).items()}
        previous, self._previous = self._previous, current
        if previous is not None and version % self.anchor_interval and version == self._base + 1:
            try:
                changes = diff(previous, current)
            except ValueError:
                changes = None
            if changes is not None and _size(changes) <= _size(current) // 2:  # else a full copy is cheaper
                delta = Delta(
                    base=self._base, anchor=self._anchor, files=full_entries(current, self.max_shard_bytes)
                )
                self._base = version
                return {DELTA_FILE: save(changes, folder / DELTA_FILE)}, delta
        written = payloads.save_state_dict(current, folder, max_shard_bytes=self.max_shard_bytes)
        self._base = self._anchor = version
        return {p.name: p for p in written}, None
