"""The local-directory store, the embedded default: keys are files under a root directory.

Atomicity comes from the filesystem (POSIX, one machine or a shared filesystem with POSIX
semantics):

* every write goes to a hidden temporary file in the target's directory, is fsynced, and is then
  published with ``os.link`` (create-only: fails if the target exists, so two publishers can never
  both claim a version) or ``os.replace`` (atomic overwrite); the directory is fsynced after;
* the ``latest`` pointer's compare-and-swap holds an ``fcntl`` lock on a hidden lock file beside it;
* hidden names (``.tmp-*``, ``.*.lock``) are invisible to :meth:`LocalBlobs.list`; snapshot file names
  may not start with a dot (``layout.check_file_name``), so nothing real is ever hidden.

Modification times come from the filesystem, and ``now()`` is this machine's clock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from echo_runtime.snapshots import blobs, errors


class LocalBlobs:
    """A :class:`~echo_runtime.snapshots.blobs.Blobs` on a directory tree."""

    def __init__(self, root: str | os.PathLike[str], *, durable: bool = True) -> None:
        self.root = Path(root).expanduser().absolute()
        self.durable = durable
        """fsync files and directories, so a power cut cannot leave a manifest without its data."""

    @property
    def location(self) -> str:
        return str(self.root)

    @property
    def cache_key(self) -> str:
        return "local-" + hashlib.sha256(str(self.root).encode()).hexdigest()[:12]

    def __repr__(self) -> str:
        return f"LocalBlobs({str(self.root)!r})"

    # ------------------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self.root.joinpath(*blobs.check_key(key).rstrip("/").split("/"))

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        try:
            with self._path(key).open("rb") as fh:
                return fh.read(), _tag(os.fstat(fh.fileno()))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._write_tmp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        self._sync_dir(path.parent)
        return True

    def swap(self, key: str, data: bytes, tag: str | None) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.with_name(f".{path.name}.lock")
        with lock.open("a") as lock_fh:
            fcntl.flock(lock_fh, fcntl.LOCK_EX)
            try:
                current = _tag(path.stat())
            except FileNotFoundError:
                current = None
            if current != tag:
                return False
            self._replace(path, data)
            return True

    def put(self, key: str, data: bytes) -> None:
        self._replace(self._path(key), data)

    def upload(self, key: str, source: Path) -> blobs.Digest:
        path = self._path(key)
        tmp, dst = self._new_tmp(path)
        try:
            with source.open("rb") as src, dst:
                digest = blobs.copy_hashing(src, dst)
                self._sync(dst)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._sync_dir(path.parent)
        return digest

    def download(self, key: str, dest: Path, size: int) -> blobs.Digest:
        try:
            src_fh = self._path(key).open("rb")
        except (FileNotFoundError, NotADirectoryError):
            raise blobs.BlobNotFound(key) from None
        with src_fh, dest.open("wb") as dst:
            return blobs.copy_hashing(src_fh, dst)

    def list(self, prefix: str) -> Iterator[blobs.BlobInfo]:
        top = self._path(prefix)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith("."):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:  # removed while we walked
                    continue
                yield blobs.BlobInfo(f"{rel}/{name}", st.st_size, st.st_mtime)

    def delete(self, keys: Sequence[str]) -> None:
        parents: set[Path] = set()
        for key in keys:
            path = self._path(key)
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                path.unlink()
                lock = path.with_name(f".{path.name}.lock")
                lock.unlink(missing_ok=True)
            parents.add(path.parent)
        # Remove folders left empty, deepest first, never the root itself.
        for folder in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            while folder != self.root and self.root in folder.parents:
                try:
                    folder.rmdir()
                except OSError:
                    break
                folder = folder.parent

    def now(self) -> float:
        return time.time()

    def check(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise errors.SnapshotError(f"storage.path {self.root} exists and is not a directory")

    # ------------------------------------------------------------------------------------------
    def _new_tmp(self, path: Path) -> tuple[Path, BinaryIO]:
        """A new hidden temporary file beside ``path``, open for writing."""
        for attempt in range(3):  # a concurrent gc may remove an empty folder between mkdir and open
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".tmp-{uuid.uuid4().hex}-{path.name}")
            try:
                return tmp, open(tmp, "xb")
            except FileNotFoundError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _write_tmp(self, path: Path, data: bytes) -> Path:
        tmp, fh = self._new_tmp(path)
        try:
            with fh:
                fh.write(data)
                self._sync(fh)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def _replace(self, path: Path, data: bytes) -> None:
        tmp = self._write_tmp(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._sync_dir(path.parent)

    def _sync(self, fh: BinaryIO) -> None:
        if self.durable:
            fh.flush()
            os.fsync(fh.fileno())

    def _sync_dir(self, folder: Path) -> None:
        if not self.durable:
            return
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        except OSError as exc:  # some filesystems refuse fsync on directories
            if exc.errno not in (errno.EINVAL, errno.EBADF):
                raise
        finally:
            os.close(fd)


def _tag(st: os.stat_result) -> str:
    return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"
