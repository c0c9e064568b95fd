"""The versioned snapshot store: where the trainer publishes policy versions and every worker loads them.

One interface (:class:`SnapshotStore`, from :func:`open_store`), two implementations underneath: a
local directory (:mod:`~echo_runtime.snapshots.local`, the embedded default) and S3 through the
``minio`` SDK (:mod:`~echo_runtime.snapshots.s3`; MinIO, AWS S3, other S3-compatible stores). Both
use the layout in :mod:`~echo_runtime.snapshots.layout`::

    <prefix>/<job>/snapshots/<version>/manifest.json   (+ the files, + <prefix>/<job>/snapshots/latest)

Modules: ``store`` (the interface and :func:`open_store`), ``series`` (the publish protocol),
``manifest`` and ``layout`` (the documents and keys), ``cache`` (verified fetch), ``retention`` (pure
gc decisions), ``blobs`` (the small object-store interface) with ``local`` and ``s3``/``s3config``
under it, ``payloads`` (peft adapters and sharded safetensors), ``retry`` (backoff), ``errors``
(what can go wrong, in words a user can act on).
"""

from echo_runtime.snapshots import errors
from echo_runtime.snapshots.errors import (
    BucketNotFoundError,
    CacheFullError,
    CorruptSnapshotError,
    InvalidManifestError,
    SnapshotError,
    StoreAuthError,
    StoreUnavailableError,
    VersionExistsError,
    VersionNotFoundError,
)
from echo_runtime.snapshots.manifest import CheckpointManifest, FileEntry, Kind, Manifest, SnapshotManifest
from echo_runtime.snapshots.retention import Pin
from echo_runtime.snapshots.retry import Backoff
from echo_runtime.snapshots.store import GcReport, SnapshotStore, open_store

__all__ = [
    "Backoff",
    "BucketNotFoundError",
    "CacheFullError",
    "CheckpointManifest",
    "CorruptSnapshotError",
    "FileEntry",
    "GcReport",
    "InvalidManifestError",
    "Kind",
    "Manifest",
    "Pin",
    "SnapshotError",
    "SnapshotManifest",
    "SnapshotStore",
    "StoreAuthError",
    "StoreUnavailableError",
    "VersionExistsError",
    "VersionNotFoundError",
    "errors",
    "open_store",
]
