"""The small object-store interface both implementations provide, and the hashing copy they share.

:class:`Blobs` is the thin I/O shell under :class:`~echo_runtime.snapshots.store.SnapshotStore`: keys
are ``/``-separated strings, values are bytes or files. The store builds every promise (atomic
publish, verified fetch, retention) from these operations, so the local directory and S3 keep one
layout and one behaviour. What an implementation must guarantee:

* ``create`` is create-only and atomic: of two concurrent calls for one key, exactly one returns
  True, and a reader sees either nothing or the complete bytes;
* ``swap`` is a compare-and-swap on the tag from ``get_tagged`` (``None``: the key must not exist);
* ``put``/``upload`` replace a key atomically (readers see old or new bytes, never a mix);
* ``upload`` and ``download`` hash the bytes they actually move, in the same pass;
* ``list`` walks a folder-like prefix (ending in ``/``) recursively and reports the store's clock;
* errors come out as :mod:`~echo_runtime.snapshots.errors` classes, after retries for transient ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

COPY_CHUNK = 8 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class BlobInfo:
    """One object: its key, size, and last modification time on the store's clock (Unix seconds)."""

    key: str
    size: int
    modified: float


@dataclasses.dataclass(frozen=True)
class Digest:
    """Size and sha256 (hex) of bytes that were moved."""

    size: int
    sha256: str


class BlobNotFound(Exception):
    """The key does not exist (raised by :meth:`Blobs.download`)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class Blobs(Protocol):
    """A key/value object store (a local directory or an S3 bucket)."""

    @property
    def location(self) -> str:
        """Where the store is, in words a user recognises (``/runs/store``, ``s3://bucket/prefix``)."""
        ...

    @property
    def cache_key(self) -> str:
        """A short, file-name-safe id of this store, so one cache directory can serve several stores."""
        ...

    def get(self, key: str) -> bytes | None:
        """The object's bytes, or None if it does not exist."""
        ...

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and an opaque tag for :meth:`swap`, or None if it does not exist."""
        ...

    def exists(self, key: str) -> bool: ...

    def create(self, key: str, data: bytes) -> bool:
        """Write ``data`` only if ``key`` does not exist; True if this call created it."""
        ...

    def swap(self, key: str, data: bytes, tag: str | None) -> bool:
        """Replace ``key`` only if its tag is still ``tag`` (None: only if it does not exist)."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key``, replacing what is there."""
        ...

    def upload(self, key: str, source: Path) -> Digest:
        """Copy the file ``source`` to ``key``; the digest is of the bytes sent."""
        ...

    def download(self, key: str, dest: Path, size: int) -> Digest:
        """Copy ``key`` (expected to be ``size`` bytes) into the file ``dest``.

        The digest is of the bytes written; it differs from the manifest's when the object is corrupt
        or truncated. Raises :class:`BlobNotFound` if the key does not exist.
        """
        ...

    def list(self, prefix: str) -> Iterator[BlobInfo]:
        """Every object under the folder ``prefix`` (ending in ``/``), recursively, in no fixed order."""
        ...

    def delete(self, keys: Sequence[str]) -> None:
        """Remove ``keys``; keys that do not exist are ignored."""
        ...

    def now(self) -> float:
        """The store's current time (Unix seconds), the clock that ``BlobInfo.modified`` uses."""
        ...

    def check(self) -> None:
        """Raise a clear error now if the store cannot be used (unreachable, credentials, bucket)."""
        ...


def copy_hashing(src: BinaryIO, dst: BinaryIO, chunk: int = COPY_CHUNK) -> Digest:
    """Copy ``src`` to ``dst`` to the end, hashing in the same pass."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    size = 0
    while True:
        n = src.readinto(view)  # type: ignore[attr-defined]
        if not n:
            break
        digest.update(view[:n])
        dst.write(view[:n])
        size += n
    return Digest(size, digest.hexdigest())


def check_key(key: str) -> str:
    """Return ``key`` if it is a clean relative key (no empty, ``.`` or ``..`` parts), else raise."""
    parts = key.rstrip("/").split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid object key {key!r}")
    return key
