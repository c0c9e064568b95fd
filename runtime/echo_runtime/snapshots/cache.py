"""A reader's local copy of versions, filled only with verified bytes.

Layout: ``<cache_dir>/<store id>/<the store's key layout>/<version>/`` holding the version's files
under their own names plus its ``manifest.json``, e.g.
``runs/cache/s3-4f1c0a9b2e7d/quickstart/snapshots/17/adapter_model.safetensors``. The store id keeps
two stores that share a cache directory (and a job name) apart.

Invariants:

* an entry directory exists only once every file in it matched its manifest's size and sha256: the
  files are downloaded into a hidden ``.tmp-*`` sibling, verified, and the sibling is renamed into
  place in one step. A reader that finds the entry can load it without talking to the store;
* a file that does not match is reported (a warning on the ``echo_runtime.snapshots`` logger) and
  fetched again, up to ``attempts`` times; then :class:`~errors.CorruptSnapshotError` is raised and
  nothing of the version is left behind;
* before downloading, the free space is checked against the version's size; running out of space
  part-way raises :class:`~errors.CacheFullError` too, never a half-filled entry;
* two processes filling one entry at once both succeed: the first rename wins, the other discards
  its copy and uses the winner's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from echo_runtime.snapshots import blobs, errors, layout
from echo_runtime.snapshots.manifest import FileEntry, Manifest

log = logging.getLogger("echo_runtime.snapshots")

LARGE_FILE = 16 * 1024 * 1024
"""Files above this size are fetched one at a time (each in parallel parts); smaller ones concurrently."""
SPACE_MARGIN = 64 * 1024 * 1024
"""Free space kept in reserve beyond a version's size."""
STALE_TMP_S = 3600.0


def worth_threads(sizes: list[int]) -> bool:
    """Whether moving these small files concurrently beats one after the other.

    A few small files (an adapter's weights, config and README) go faster in the calling thread:
    starting threads and handing the GIL between them costs more than the requests they overlap.
    """
    return len(sizes) >= 4 or (len(sizes) > 1 and sum(sizes) > 4 * 1024 * 1024)


class Cache:
    """The cache directory of one store, for one series (snapshots or checkpoints) of one job."""

    def __init__(self, root: str | os.PathLike[str], store_id: str, series: layout.Series) -> None:
        self.dir = Path(root).expanduser().absolute().joinpath(store_id, *series.base.split("/"))
        self.series = series

    def entry(self, version: int) -> Path:
        return self.dir / str(version)

    def lookup(self, version: int, *, verify: bool = False) -> Path | None:
        """The entry of ``version`` if it is complete; a damaged entry is removed and None returned.

        Sizes are always checked (cheap); ``verify`` also re-hashes every file.
        """
        path = self.entry(version)
        try:
            raw = (path / layout.MANIFEST).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            manifest = Manifest.from_json(raw, str(path / layout.MANIFEST))
            problem = next((p for f in manifest.files if (p := _check_file(path, f, verify))), None)
        except errors.InvalidManifestError as exc:
            problem = str(exc)
        if problem is None:
            return path
        log.warning(
            "cached version %d in %s is damaged (%s); removing it and fetching again", version, path, problem
        )
        self._remove(path)
        return None

    def fill(
        self,
        store: blobs.Blobs,
        manifest: Manifest,
        raw_manifest: bytes,
        *,
        attempts: int = 3,
        parallel: int = 4,
        finish: Callable[[Path], None] | None = None,
    ) -> Path:
        """Download ``manifest``'s files from ``store``, verify them, and make them the entry.
        ``finish`` completes the verified download before it becomes the entry (a delta version is
        rebuilt into full weights there); if it raises, nothing is left behind."""
        if attempts < 1:
            raise ValueError(f"attempts: must be ≥ 1, got {attempts}")
        final = self.entry(manifest.version)
        self.dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.dir).free
        if manifest.total_size + SPACE_MARGIN > free:
            raise errors.CacheFullError(
                f"not enough space in the cache directory {self.dir} for version {manifest.version}: it needs "
                f"{_mib(manifest.total_size)} (plus {_mib(SPACE_MARGIN)} reserve) and {_mib(free)} is free; "
                "free some space, prune old versions from the cache, or point the cache elsewhere"
            )
        tmp = self.dir / f".tmp-{manifest.version}-{uuid.uuid4().hex[:12]}"
        tmp.mkdir()
        try:
            small = [f for f in manifest.files if f.size <= LARGE_FILE]
            large = [f for f in manifest.files if f.size > LARGE_FILE]
            if worth_threads([f.size for f in small]):
                with ThreadPoolExecutor(min(parallel, len(small)), "echorl-fetch") as pool:
                    list(pool.map(lambda f: self._fetch_file(store, manifest, f, tmp, attempts), small))
            else:
                for entry in small:
                    self._fetch_file(store, manifest, entry, tmp, attempts)
            for entry in large:
                self._fetch_file(store, manifest, entry, tmp, attempts)
            if finish is not None:
                finish(tmp)
            (tmp / layout.MANIFEST).write_bytes(raw_manifest)
            for _ in range(2):
                try:
                    os.rename(tmp, final)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise
                    if self.lookup(manifest.version) is not None:  # another reader cached it first
                        break
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise errors.CacheFullError(
                    f"the cache directory {self.dir} ran out of space while fetching version {manifest.version} "
                    f"({_mib(manifest.total_size)}); free some space or point the cache elsewhere"
                ) from None
            raise
        finally:
            if tmp.exists():
                self._remove(tmp)
        return final

    def prune(self, keep_last: int, protect: set[int] | None = None) -> list[int]:
        """Remove all but the newest ``keep_last`` cached versions (and those in ``protect``), plus
        temporary folders abandoned more than an hour ago; return the versions removed."""
        if keep_last < 1:
            raise ValueError(f"keep_last: must be ≥ 1, got {keep_last}")
        try:
            names = list(os.scandir(self.dir))
        except FileNotFoundError:
            return []
        cached = sorted(int(e.name) for e in names if e.name.isdigit() and e.is_dir())
        doomed = [v for v in cached[:-keep_last] if v not in (protect or set())]
        for version in doomed:
            self._remove(self.entry(version))
        for e in names:
            if e.name.startswith(".tmp-") and e.stat().st_mtime + STALE_TMP_S < time.time():
                self._remove(Path(e.path))
        return doomed

    def _fetch_file(
        self, store: blobs.Blobs, manifest: Manifest, entry: FileEntry, tmp: Path, attempts: int
    ) -> None:
        dest = tmp / entry.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        key = self.series.data(manifest.version, manifest.data, entry.name)
        what = ""
        for attempt in range(1, attempts + 1):
            try:
                got = store.download(key, dest, entry.size)
            except blobs.BlobNotFound:
                raise errors.VersionNotFoundError(
                    f"{key} is missing from {store.location}: version {manifest.version} was removed (by "
                    "retention?) while it was being fetched; pin versions that readers still need",
                    manifest.version,
                ) from None
            if got.size == entry.size and got.sha256 == entry.sha256:
                return
            what = (
                f"size {got.size}, expected {entry.size}"
                if got.size != entry.size
                else f"sha256 {got.sha256[:16]}…, expected {entry.sha256[:16]}…"
            )
            log.warning(
                "corrupt object %s in %s (%s), attempt %d of %d%s",
                key,
                store.location,
                what,
                attempt,
                attempts,
                "; fetching it again" if attempt < attempts else "",
            )
        raise errors.CorruptSnapshotError(
            f"version {manifest.version}: {entry.name} in {store.location} does not match its manifest ({what}) "
            f"after {attempts} attempts; the stored object is damaged. Nothing was loaded. Publish a new "
            "version, or delete this one so readers skip it",
            manifest.version,
            entry.name,
        )

    def _remove(self, path: Path) -> None:
        trash = path.with_name(f".tmp-trash-{uuid.uuid4().hex[:8]}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, trash)  # disappears from readers in one step
            shutil.rmtree(trash, ignore_errors=True)


def _check_file(folder: Path, entry: FileEntry, verify: bool) -> str | None:
    path = folder / entry.name
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{entry.name} is missing"
    if size != entry.size:
        return f"{entry.name} has {size} bytes, expected {entry.size}"
    if verify:
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(blobs.COPY_CHUNK):
                digest.update(chunk)
        if digest.hexdigest() != entry.sha256:
            return f"{entry.name} has the wrong sha256"
    return None


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"
