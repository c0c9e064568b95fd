"""The errors the snapshot store raises: each says what went wrong, where, and what to do about it.

Every error is a :class:`SnapshotError`, so a caller that only wants to report a failure catches one
class. The subclasses are the cases a user or a caller acts on differently:

* configuration (:class:`StoreAuthError`, :class:`BucketNotFoundError`): fix the manifest or the
  credentials; retrying does not help;
* reachability (:class:`StoreUnavailableError`): raised only after retries with backoff;
* content (:class:`VersionExistsError`, :class:`VersionNotFoundError`, :class:`CorruptSnapshotError`,
  :class:`InvalidManifestError`): the store is reachable but holds something other than expected;
* local (:class:`CacheFullError`): the machine running a reader has no room for the download.
"""

from __future__ import annotations


class SnapshotError(Exception):
    """Base of every error of :mod:`echo_runtime.snapshots`; ``str()`` is a complete message."""


class VersionExistsError(SnapshotError):
    """A publish named a version that exists already or is not newer than the latest one.

    Versions are never overwritten or reused: a reader that loaded version ``v`` once must get the
    same bytes every time.
    """

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


class VersionNotFoundError(SnapshotError, LookupError):
    """The version (or checkpoint) is not in the store: never published, or removed by retention."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


class CorruptSnapshotError(SnapshotError):
    """A fetched file did not match its manifest (size or sha256) on every attempt.

    Nothing of the version was placed in the cache; the caller never sees the bad bytes.
    """

    def __init__(self, message: str, version: int, file: str) -> None:
        super().__init__(message)
        self.version = version
        self.file = file


class InvalidManifestError(SnapshotError):
    """A ``manifest.json`` or ``latest`` pointer in the store cannot be parsed."""


class StoreUnavailableError(SnapshotError):
    """The store's endpoint could not be reached, even after retries with backoff."""


class StoreAuthError(SnapshotError):
    """The S3 endpoint rejected the credentials (wrong key, wrong secret, or no permission)."""


class BucketNotFoundError(SnapshotError):
    """The bucket named by ``storage.bucket`` does not exist on the endpoint."""


class CacheFullError(SnapshotError, OSError):
    """The local cache directory has no room for a download."""
