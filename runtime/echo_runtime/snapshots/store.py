"""The snapshot store: the one interface the trainer, the workers, the coordinator and the operator use.

:func:`open_store` turns a manifest's ``storage`` section into a :class:`SnapshotStore` on a local
directory or an S3 bucket; both behave identically because all logic sits above the small
:class:`~echo_runtime.snapshots.blobs.Blobs` interface. Who calls what:

* trainer: :meth:`SnapshotStore.publish` after optimizer steps (raises if the version exists); a
  checkpoint from every rank at once: :meth:`~SnapshotStore.stage_checkpoint` (rank 0),
  :meth:`~SnapshotStore.upload_checkpoint_part` (each rank), :meth:`~SnapshotStore.commit_checkpoint`
  (rank 0), and :meth:`~SnapshotStore.fetch_checkpoint` on every rank to resume
  (:meth:`~SnapshotStore.save_checkpoint` is the one-writer form of the three);
* workers: :meth:`~SnapshotStore.pin` then :meth:`~SnapshotStore.fetch` (verified, cached) or
  :meth:`~SnapshotStore.fetch_latest` (fetch-if-newer);
* coordinator: :meth:`~SnapshotStore.latest_version` to recover ``t_train`` after a restart;
* operator and ``echorl snapshots gc``: :meth:`~SnapshotStore.gc`.

Promises: a reader never observes a half-published version; a version number is never reused or
overwritten; a fetched file is byte-identical to the published one or the fetch fails; retention
never removes the newest ``keep_last`` versions or a version with a live pin.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from echo_runtime.snapshots import blobs, cache, errors, layout, retention, retry, series
from echo_runtime.snapshots.local import LocalBlobs
from echo_runtime.snapshots.manifest import CheckpointManifest, Delta, FileEntry, Manifest, SnapshotManifest
from echo_runtime.spec.policy import Retention
from echo_runtime.spec.swarms import Storage

if TYPE_CHECKING:
    from echo_runtime.snapshots.s3 import Credentials

DEFAULT_PIN_TTL_S = 600.0
DEFAULT_ORPHAN_GRACE_S = 3600.0


@dataclasses.dataclass(frozen=True)
class GcReport:
    """What :meth:`SnapshotStore.gc` kept and removed (or, in a dry run, would remove)."""

    kept: tuple[int, ...]
    deleted: tuple[int, ...]
    pinned: tuple[int, ...]
    """Versions kept only because a live pin holds them."""
    needed: tuple[int, ...]
    """Versions kept only because a kept delta version is rebuilt from them."""
    in_use: tuple[int, ...]
    """Versions kept only because a running job's workers may still use them (``keep_from``)."""
    checkpoints_kept: tuple[int, ...]
    checkpoints_deleted: tuple[int, ...]
    expired_pins: tuple[retention.Pin, ...]
    orphans: tuple[str, ...]
    """Data folders of publishes that never completed (``snapshots/12/data-…``)."""
    freed_bytes: int
    kept_bytes: int
    """What the job's snapshots and checkpoints take in the store after the collection (after a dry
    run: what they would take)."""
    dry_run: bool


class SnapshotStore:
    """Versioned snapshots (and trainer checkpoints) of one job in one store."""

    def __init__(
        self,
        store: blobs.Blobs,
        job: str,
        *,
        prefix: str = "",
        retention: Retention | None = None,
        parallel: int = 4,
    ) -> None:
        self.blobs = store
        self.layout = layout.Layout(prefix, job)
        self.retention = retention or Retention()
        self._snapshots = series.Series(
            store, self.layout.snapshots, "version", SnapshotManifest, parallel=parallel, deltas=True
        )
        self._checkpoints = series.Series(
            store, self.layout.checkpoints, "checkpoint", CheckpointManifest, parallel=parallel
        )

    @property
    def job(self) -> str:
        return self.layout.job

    @property
    def location(self) -> str:
        return self.blobs.location

    def __repr__(self) -> str:
        return f"SnapshotStore({self.location!r}, job={self.job!r})"

    def check(self) -> None:
        """Raise a clear error now if the store cannot be used (instead of at the first publish)."""
        self.blobs.check()

    # ------------------------------------------------------------------------------------------
    # Snapshots

    def publish(
        self,
        version: int,
        files: series.Files,
        *,
        kind: Literal["lora", "full"],
        base_model: str,
        step: int | None = None,
        delta: Delta | None = None,
    ) -> SnapshotManifest:
        """Publish ``files`` as policy ``version``; raise :class:`~errors.VersionExistsError` if the
        version exists or is not newer than the latest one. Returns the manifest written.

        ``delta``: the files are the changes against ``delta.base`` (:mod:`.deltas`), which must be
        published already; readers rebuild the full weights and check them against ``delta.files``."""
        if kind not in ("lora", "full"):
            raise ValueError(f"kind: must be 'lora' or 'full', got {kind!r}")
        if delta is not None:
            if kind != "full":
                raise ValueError("delta: only full-weight snapshots are published as deltas")
            base = self._snapshots.manifest(delta.base)[0]  # raises VersionNotFoundError if it is gone
            if (base.delta.anchor if base.delta is not None else base.version) != delta.anchor:
                raise ValueError(f"delta: version {delta.base} does not start from anchor {delta.anchor}")
        return self._snapshots.publish(
            version,
            files,
            kind=kind,
            base_model=base_model,
            step=version if step is None else step,
            delta=delta,
        )

    def latest_version(self) -> int | None:
        """The newest complete version, or None before the first publish."""
        return self._snapshots.latest()

    def versions(self) -> list[int]:
        """Every complete version in the store, ascending."""
        return self._snapshots.versions()

    def manifest(self, version: int) -> SnapshotManifest:
        return self._snapshots.manifest(version)[0]

    def fetch(
        self,
        version: int,
        cache_dir: str | os.PathLike[str],
        *,
        verify_cached: bool = False,
        keep_cached: int | None = None,
    ) -> Path:
        """The local directory holding ``version``'s verified files (and its ``manifest.json``); a delta
        version is rebuilt there into its full files (:mod:`.deltas`) from the versions before it.

        A version already in ``cache_dir`` costs no request to the store. ``verify_cached`` re-hashes a
        cached copy; ``keep_cached`` then prunes the cache to that many newest versions.
        """
        local = self._cache(cache_dir, self._snapshots)
        path = self._snapshots.fetch_chain(version, local, verify_cached=verify_cached)
        if keep_cached is not None:
            local.prune(keep_cached, protect={version})
        return path

    def fetch_latest(
        self,
        cache_dir: str | os.PathLike[str],
        *,
        newer_than: int | None = None,
        keep_cached: int | None = None,
    ) -> tuple[int, Path] | None:
        """``(version, path)`` of the newest version if it is newer than ``newer_than``, else None."""
        latest = self.latest_version()
        if latest is None or (newer_than is not None and latest <= newer_than):
            return None
        return latest, self.fetch(latest, cache_dir, keep_cached=keep_cached)

    # ------------------------------------------------------------------------------------------
    # Pins

    def pin(self, version: int, reader_id: str, ttl_s: float = DEFAULT_PIN_TTL_S) -> None:
        """Keep ``version`` from garbage collection for ``ttl_s`` seconds; call again to renew."""
        layout.check_name(reader_id, "reader_id")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s: must be > 0, got {ttl_s}")
        ttl = math.ceil(ttl_s)
        key = self.layout.pins.key(version, reader_id, ttl)
        self.blobs.put(key, json.dumps({"version": version, "reader": reader_id, "ttlSeconds": ttl}).encode())
        self._unpin(version, reader_id, except_key=key)  # a renewal with another ttl replaces the old pin

    def unpin(self, version: int, reader_id: str) -> None:
        """Drop ``reader_id``'s pin on ``version`` (a no-op if there is none)."""
        self._unpin(version, layout.check_name(reader_id, "reader_id"), except_key=None)

    def pins(self) -> list[retention.Pin]:
        """Every pin in the store, live or expired, by version then reader."""
        found = []
        for info in self.blobs.list(self.layout.pins.base + "/"):
            parsed = self.layout.pins.parse(info.key)
            if parsed is not None:
                found.append(
                    retention.Pin(version=parsed[0], reader=parsed[1], ttl_s=parsed[2], since=info.modified)
                )
        return sorted(found, key=lambda p: (p.version, p.reader, p.since))

    def _unpin(self, version: int, reader_id: str, except_key: str | None) -> None:
        stale = [
            i.key
            for i in self.blobs.list(self.layout.pins.reader_prefix(version))
            if i.key != except_key and (p := self.layout.pins.parse(i.key)) is not None and p[1] == reader_id
        ]
        if stale:
            self.blobs.delete(stale)

    # ------------------------------------------------------------------------------------------
    # Checkpoints

    def save_checkpoint(
        self, step: int, files: series.Files, *, base_model: str = "", prune: bool = True
    ) -> CheckpointManifest:
        """Save trainer state for ``step`` beside the snapshots; with ``prune``, then keep only the
        newest ``retention.checkpoint_keep_last`` checkpoints."""
        doc = self._checkpoints.publish(step, files, kind="checkpoint", base_model=base_model, step=step)
        if prune:
            self._prune_checkpoints()
        return doc

    # A checkpoint written by several processes (the ranks of a sharded trainer, each its own shard):
    # one stages the step, every one uploads its part, the one commits the entries of all.
    def stage_checkpoint(self, step: int) -> str:
        """Refuse a ``step`` that is not newer than the latest checkpoint; the data folder every writer
        then uploads into (:meth:`upload_checkpoint_part`) before :meth:`commit_checkpoint`."""
        return self._checkpoints.stage(step)

    def upload_checkpoint_part(self, step: int, data: str, files: series.Files) -> list[FileEntry]:
        """Upload one writer's files of checkpoint ``step`` into ``data``; invisible until committed."""
        return self._checkpoints.upload_part(step, data, files)

    def commit_checkpoint(
        self, step: int, data: str, entries: Sequence[FileEntry], *, base_model: str = "", prune: bool = True
    ) -> CheckpointManifest:
        """Make checkpoint ``step`` visible with every writer's ``entries`` (then prune, as
        :meth:`save_checkpoint`)."""
        doc = self._checkpoints.commit(
            step, data, entries, kind="checkpoint", base_model=base_model, step=step
        )
        if prune:
            self._prune_checkpoints()
        return doc

    def _prune_checkpoints(self) -> None:
        self._checkpoints.collect_garbage(
            self.retention.checkpoint_keep_last, (), self.blobs.now(), DEFAULT_ORPHAN_GRACE_S, dry_run=False
        )

    def checkpoints(self) -> list[int]:
        return self._checkpoints.versions()

    def latest_checkpoint(self) -> int | None:
        return self._checkpoints.latest()

    def checkpoint_manifest(self, step: int) -> CheckpointManifest:
        return self._checkpoints.manifest(step)[0]

    def fetch_checkpoint(self, step: int, cache_dir: str | os.PathLike[str]) -> Path:
        return self._checkpoints.fetch(step, self._cache(cache_dir, self._checkpoints))

    def load_latest_checkpoint(self, cache_dir: str | os.PathLike[str]) -> tuple[int, Path] | None:
        """``(step, local directory)`` of the newest checkpoint, verified, or None if there is none."""
        step = self.latest_checkpoint()
        return None if step is None else (step, self.fetch_checkpoint(step, cache_dir))

    # ------------------------------------------------------------------------------------------
    # Retention

    def gc(
        self,
        *,
        keep_last: int | None = None,
        checkpoint_keep_last: int | None = None,
        orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
        dry_run: bool = False,
        now: float | None = None,
        keep_from: int | None = None,
    ) -> GcReport:
        """Remove versions beyond the newest ``keep_last`` that no live pin holds (nor, with
        ``keep_from``, at or after it: the versions a running job's workers may still use), expired
        pins, checkpoints beyond ``checkpoint_keep_last``, and data of publishes that never completed
        (older than ``orphan_grace_s``). Defaults come from :attr:`retention`."""
        now = self.blobs.now() if now is None else now
        pins = self.pins()
        snaps = self._snapshots.collect_garbage(
            self.retention.keep_last if keep_last is None else keep_last,
            pins,
            now,
            orphan_grace_s,
            dry_run,
            keep_from=keep_from,
        )
        ckpts = self._checkpoints.collect_garbage(
            self.retention.checkpoint_keep_last if checkpoint_keep_last is None else checkpoint_keep_last,
            (),
            now,
            orphan_grace_s,
            dry_run,
        )
        expired = snaps.plan.expired_pins
        if expired and not dry_run:
            self.blobs.delete([self.layout.pins.key(p.version, p.reader, p.ttl_s) for p in expired])
        return GcReport(
            kept=snaps.plan.keep,
            deleted=snaps.plan.delete,
            pinned=snaps.plan.pinned,
            needed=snaps.plan.needed,
            in_use=snaps.plan.in_use,
            checkpoints_kept=ckpts.plan.keep,
            checkpoints_deleted=ckpts.plan.delete,
            expired_pins=expired,
            orphans=tuple(self._snapshots.keys.data_dir(o.version, o.data) for o in snaps.orphans)
            + tuple(self._checkpoints.keys.data_dir(o.version, o.data) for o in ckpts.orphans),
            freed_bytes=snaps.freed_bytes + ckpts.freed_bytes,
            kept_bytes=snaps.kept_bytes + ckpts.kept_bytes,
            dry_run=dry_run,
        )

    def _cache(self, cache_dir: str | os.PathLike[str], which: series.Series[Any]) -> cache.Cache:
        return cache.Cache(cache_dir, self.blobs.cache_key, which.keys)


def open_store(
    storage: Storage,
    job: str,
    *,
    credentials: Credentials | tuple[str, str] | None = None,
    retention: Retention | None = None,
    backoff: retry.Backoff | None = None,
    create_bucket: bool = False,
) -> SnapshotStore:
    """The :class:`SnapshotStore` of ``job`` on ``storage`` (an EchoJob's ``spec.storage``).

    Local: ``storage.path`` (relative to the working directory). S3: ``storage.endpoint`` and
    ``storage.bucket``, with ``credentials`` (an :class:`~echo_runtime.snapshots.s3.Credentials` or
    ``(access_key, secret_key)``) or else ``ECHORL_S3_ACCESS_KEY``/``ECHORL_S3_SECRET_KEY`` (or the
    ``AWS_*`` variables) from the environment. No request is made until the store is used, unless
    ``create_bucket`` asks to create a missing bucket.
    """
    layout.check_name(job, "job")
    if storage.type == "Local":
        return SnapshotStore(LocalBlobs(storage.path), job, prefix=storage.prefix, retention=retention)
    from echo_runtime.snapshots import s3  # the minio SDK is imported only for S3 stores

    if storage.endpoint is None or storage.bucket is None:
        raise ValueError("storage: an S3 store needs endpoint and bucket")
    blob_store = s3.connect(
        storage.endpoint,
        storage.bucket,
        prefix=storage.prefix,
        secure=storage.secure,
        region=storage.region,
        credentials=credentials,
        backoff=backoff,
        create_bucket=create_bucket,
    )
    return SnapshotStore(blob_store, job, prefix=storage.prefix, retention=retention)


__all__ = ["GcReport", "Manifest", "SnapshotStore", "errors", "open_store"]
