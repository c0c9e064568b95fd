"""One numbered series of a store: publish, list, fetch and collect garbage.

The snapshots (numbered by policy version) and the trainer checkpoints (numbered by step) are two
series with the same rules, so the rules live here once.

Publish protocol (the order is the atomicity argument):

1. refuse a number that is not newer than the ``latest`` pointer (numbers are never reused, not
   even after retention removed them, because retention never removes the newest);
2. upload every file under a fresh ``data-<hex>`` folder of the version, hashing the bytes sent;
3. create ``manifest.json`` with a create-only write. This single write makes the version visible;
   if it fails because the manifest exists, another publisher owns the number, and this publish
   deletes its own files and raises :class:`~errors.VersionExistsError`;
4. move the ``latest`` pointer forward with compare-and-swap (never backwards).

A publisher killed before step 3 leaves only an orphan data folder: no reader can see it, it does
not block a retry of the same number, and :meth:`Series.collect_garbage` removes it after a grace
period. Killed between 3 and 4, the version is complete and visible; :meth:`Series.latest` notices a
pointer that lags and falls back to listing the manifests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Generic, TypeVar

from echo_runtime.snapshots import blobs, cache, errors, layout, manifest, retention
from echo_runtime.snapshots.manifest import FileEntry, Manifest

M = TypeVar("M", bound=Manifest)

log = logging.getLogger("echo_runtime.snapshots")

PathLike = str | os.PathLike[str]
Files = PathLike | Sequence[PathLike] | Mapping[str, PathLike]
"""A directory (every file in it, recursively, except hidden ones such as ``.DS_Store``), a list of
files (by base name), or a mapping name → file."""


def collect(files: Files) -> list[tuple[str, Path]]:
    """Normalise :data:`Files` to sorted ``(name in the snapshot, local file)`` pairs, checking names."""
    if isinstance(files, Mapping):
        pairs = [(str(name), Path(path)) for name, path in files.items()]
    elif isinstance(files, str | os.PathLike):
        root = Path(files)
        if root.is_dir():
            rels = ((p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file())
            pairs = [(rel, p) for rel, p in rels if not any(part.startswith(".") for part in rel.split("/"))]
        else:
            pairs = [(root.name, root)]
    else:
        pairs = [(Path(p).name, Path(p)) for p in files]
    if not pairs:
        raise ValueError(f"nothing to publish: no files in {files!r}")
    names = [n for n, _ in pairs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"two files would have the same name in the snapshot: {', '.join(dupes)}")
    for name, path in pairs:
        layout.check_file_name(name)
        if not path.is_file():
            raise FileNotFoundError(f"cannot publish {path}: not a file")
    return sorted(pairs)


@dataclasses.dataclass(frozen=True)
class SeriesGc:
    """What :meth:`Series.collect_garbage` decided (and, unless a dry run, did)."""

    plan: retention.Plan
    orphans: tuple[retention.DataDir, ...]
    freed_bytes: int
    kept_bytes: int = 0
    """What the series holds after the collection (the objects it listed, less those it removed)."""


class Series(Generic[M]):
    """Snapshots or checkpoints of one job in one store; ``doc`` is the type of their manifests."""

    def __init__(
        self,
        store: blobs.Blobs,
        keys: layout.Series,
        noun: str,
        doc: type[M],
        *,
        parallel: int = 4,
        deltas: bool = False,
    ) -> None:
        self.store = store
        self.deltas = deltas
        """Whether versions may be deltas (snapshots): retention then keeps each kept version's chain."""
        self.doc = doc
        self.keys = keys
        self.noun = noun
        """How errors name an element: ``version`` or ``checkpoint``."""
        self.parallel = parallel

    # ------------------------------------------------------------------------------------------
    # Writing

    def publish(
        self,
        version: int,
        files: Files,
        *,
        kind: manifest.Kind,
        base_model: str,
        step: int,
        delta: manifest.Delta | None = None,
    ) -> M:
        """Upload ``files`` and make them ``version`` (the module's protocol, steps 1–4)."""
        items = collect(files)
        data, seen = self._stage(version)
        entries = self.upload_part(version, data, items)
        return self.commit(
            version, data, entries, kind=kind, base_model=base_model, step=step, delta=delta, _seen=seen
        )

    def stage(self, version: int) -> str:
        """Step 1: refuse a ``version`` that is not newer than the latest; return a fresh data folder
        for its files. Several writers (the ranks of a sharded trainer) may then :meth:`upload_part`
        into it before one of them :meth:`commit` s the whole."""
        return self._stage(version)[0]

    def _stage(self, version: int) -> tuple[str, tuple[bytes, str]]:
        if version < 0:
            raise ValueError(f"{self.noun}: must be ≥ 0, got {version}")
        pointer = self.store.get_tagged(self.keys.latest)
        latest = self._parse_pointer(None if pointer is None else pointer[0])
        if latest is not None and version <= latest:
            if self.store.exists(self.keys.manifest(version)):
                raise errors.VersionExistsError(
                    f"{self.noun} {version} already exists in {self.store.location}; a published {self.noun} "
                    "is never overwritten, publish the next number instead",
                    version,
                )
            raise errors.VersionExistsError(
                f"{self.noun} {version} is not newer than the latest published {self.noun} {latest} in "
                f"{self.store.location}; numbers are never reused",
                version,
            )
        return f"{layout.DATA_PREFIX}{uuid.uuid4().hex[:16]}", pointer or _ABSENT

    def upload_part(self, version: int, data: str, files: Files | list[tuple[str, Path]]) -> list[FileEntry]:
        """Step 2 for one writer: upload ``files`` into ``data`` (from :meth:`stage`); returns their
        entries for :meth:`commit`. A failed upload removes what it sent (best effort; whatever stays is
        an orphan that garbage collection removes)."""
        if not data.startswith(layout.DATA_PREFIX) or "/" in data:
            raise ValueError(f"{self.noun} {version}: {data!r} is not a data folder name from stage()")
        items = files if isinstance(files, list) else collect(files)
        keys = [self.keys.data(version, data, name) for name, _ in items]
        try:
            return self._upload(items, keys)
        except BaseException:
            with contextlib.suppress(Exception):
                self.store.delete(keys)
            raise

    def commit(
        self,
        version: int,
        data: str,
        entries: Sequence[FileEntry],
        *,
        kind: manifest.Kind,
        base_model: str,
        step: int,
        delta: manifest.Delta | None = None,
        _seen: tuple[bytes, str] | None = None,
    ) -> M:
        """Steps 3–4: write the manifest of everything uploaded into ``data`` (every writer's entries)
        with a create-only write, then move the ``latest`` pointer. Until this succeeds no reader sees
        any of the files."""
        names = [entry.name for entry in entries]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"{self.noun} {version}: two writers uploaded {', '.join(dupes)}")
        keys = [self.keys.data(version, data, name) for name in names]
        try:
            doc = self.doc.model_validate(
                {
                    "version": version,
                    "kind": kind,
                    "base_model": base_model,
                    "step": step,
                    "created": manifest.now(),
                    "data": data,
                    "files": sorted(entries, key=lambda entry: entry.name),
                    "delta": delta,
                    "format": 1 if delta is None else manifest.DELTA_FORMAT,
                }
            )
        except BaseException:
            with contextlib.suppress(Exception):  # best effort; gc removes what is left
                self.store.delete(keys)
            raise
        # If this write fails in an unknown way the manifest may exist, so the files stay either way.
        if not self.store.create(self.keys.manifest(version), doc.to_json()):
            with contextlib.suppress(Exception):
                self.store.delete(keys)
            raise errors.VersionExistsError(
                f"{self.noun} {version} was published by another publisher to {self.store.location} while "
                "this one was uploading; it keeps the other publisher's files",
                version,
            )
        self.advance(version, _seen)
        return doc

    def advance(self, version: int, seen: tuple[bytes, str] | None = None) -> None:
        """Move the ``latest`` pointer to ``version`` unless it already names a newer one.

        ``seen`` is the pointer as read earlier (``_ABSENT``: it did not exist), which saves a request
        when nobody moved it since; None reads it first.
        """
        for attempt in range(20):
            current = self.store.get_tagged(self.keys.latest) if attempt or seen is None else seen
            current = None if current is _ABSENT else current
            if current is not None:
                try:
                    if manifest.parse_pointer(current[0], self.keys.latest) >= version:
                        return
                except errors.InvalidManifestError:
                    pass  # a damaged pointer is replaced
            if self.store.swap(
                self.keys.latest, manifest.pointer_bytes(version), None if current is None else current[1]
            ):
                return
        log.warning(
            "could not move %s to %d (contended); readers fall back to listing", self.keys.latest, version
        )

    def _upload(self, items: list[tuple[str, Path]], keys: list[str]) -> list[FileEntry]:
        def one(i: int) -> FileEntry:
            got = self.store.upload(keys[i], items[i][1])
            return FileEntry(name=items[i][0], size=got.size, sha256=got.sha256)

        small = [i for i, (_, p) in enumerate(items) if p.stat().st_size <= cache.LARGE_FILE]
        large = [i for i in range(len(items)) if i not in small]
        done: dict[int, FileEntry] = {}
        if len(small) > 1:  # small uploads wait on the server (it syncs to disk): overlap them
            with ThreadPoolExecutor(min(self.parallel, len(small)), "echorl-put") as pool:
                done.update(zip(small, pool.map(one, small), strict=True))
        else:
            done.update((i, one(i)) for i in small)
        done.update((i, one(i)) for i in large)  # each already moves in parallel parts
        return [done[i] for i in range(len(items))]

    # ------------------------------------------------------------------------------------------
    # Reading

    def _pointer(self) -> int | None:
        return self._parse_pointer(self.store.get(self.keys.latest))

    def _parse_pointer(self, raw: bytes | None) -> int | None:
        if raw is None:
            return None
        try:
            return manifest.parse_pointer(raw, f"{self.store.location}: {self.keys.latest}")
        except errors.InvalidManifestError as exc:
            log.warning("%s; listing manifests instead", exc)
            return max(self.versions(), default=None)

    def latest(self) -> int | None:
        """The newest complete number, or None if there is none."""
        pointer = self._pointer()
        if pointer is None or self.store.exists(self.keys.manifest(pointer + 1)):
            return max(self.versions(), default=None)  # no pointer, or it lags behind a published version
        return pointer

    def versions(self) -> list[int]:
        """Every complete number (those with a manifest), ascending."""
        found = set()
        for info in self.store.list(self.keys.base + "/"):
            parsed = self.keys.parse(info.key)
            if parsed is not None and parsed[1] == layout.MANIFEST:
                found.add(parsed[0])
        return sorted(found)

    def manifest(self, version: int) -> tuple[M, bytes]:
        raw = self.store.get(self.keys.manifest(version))
        if raw is None:
            known = self.versions()
            hint = f"available: {_span(known)}" if known else "there are none"
            raise errors.VersionNotFoundError(
                f"{self.noun} {version} is not in {self.store.location} ({hint})", version
            )
        doc = self.doc.from_json(raw, f"{self.store.location}: {self.keys.manifest(version)}")
        if doc.version != version:
            raise errors.InvalidManifestError(
                f"{self.store.location}: {self.keys.manifest(version)} describes {self.noun} {doc.version}"
            )
        return doc, raw

    def fetch(self, version: int, local: cache.Cache, *, verify_cached: bool = False) -> Path:
        hit = local.lookup(version, verify=verify_cached)
        if hit is not None:
            return hit
        doc, raw = self.manifest(version)
        return local.fill(self.store, doc, raw, parallel=self.parallel)

    def fetch_chain(self, version: int, local: cache.Cache, *, verify_cached: bool = False) -> Path:
        """:meth:`fetch` for a series whose versions may be deltas (:mod:`.deltas`): walk back to the
        newest version already cached (or the anchor), then rebuild each version after it in order, each
        from the one before, into its own verified cache entry. ``verify_cached`` also re-hashes the
        rebuilt files (:func:`.deltas.materialise`)."""
        from echo_runtime.snapshots import deltas

        hit = local.lookup(version, verify=verify_cached)
        if hit is not None:
            return hit
        chain: list[tuple[M, bytes]] = []
        current = version
        while True:
            doc, raw = self.manifest(current)
            chain.append((doc, raw))
            if doc.delta is None:
                break
            current = doc.delta.base
            if local.lookup(current) is not None:
                break
        path = local.entry(current)
        for doc, raw in reversed(chain):
            finish = (
                None
                if doc.delta is None
                else functools.partial(deltas.materialise, path, delta=doc.delta, verify=verify_cached)
            )
            path = local.fill(self.store, doc, raw, parallel=self.parallel, finish=finish)
        return path

    def anchor_of(self, version: int) -> int:
        """The oldest version reading ``version`` needs (itself, unless it is a delta)."""
        delta = self.manifest(version)[0].delta
        return version if delta is None else delta.anchor

    # ------------------------------------------------------------------------------------------
    # Garbage

    def collect_garbage(
        self,
        keep_last: int,
        pins: Sequence[retention.Pin],
        now: float,
        grace_s: float,
        dry_run: bool,
        keep_from: int | None = None,
    ) -> SeriesGc:
        objects = list(self.store.list(self.keys.base + "/"))
        by_version: dict[int, list[blobs.BlobInfo]] = {}
        for info in objects:
            parsed = self.keys.parse(info.key)
            if parsed is not None:
                by_version.setdefault(parsed[0], []).append(info)
        published = {
            v for v, infos in by_version.items() if any(i.key == self.keys.manifest(v) for i in infos)
        }
        plan = retention.plan(published, keep_last, pins, now, keep_from=keep_from)
        if self.deltas and plan.delete:  # a kept delta version keeps its chain back to its anchor
            needs = {v: self.anchor_of(v) for v in plan.keep}
            plan = retention.plan(published, keep_last, pins, now, needs=needs, keep_from=keep_from)
        folders: dict[tuple[int, str], float] = {}
        for version, infos in by_version.items():
            for info in infos:
                rest = info.key[len(self.keys.version_dir(version)) :]
                data, sep, _ = rest.partition("/")
                if sep and data.startswith(layout.DATA_PREFIX):
                    folders[version, data] = max(folders.get((version, data), 0.0), info.modified)
        owners: dict[int, str] = {}
        for version in plan.keep:
            mine = [d for (v, d) in folders if v == version]
            owners[version] = mine[0] if len(mine) == 1 else self.manifest(version)[0].data
        orphans = retention.orphans(
            (retention.DataDir(v, d, m) for (v, d), m in folders.items() if v not in plan.delete),
            owners,
            now,
            grace_s,
        )
        doomed = [i for v in plan.delete for i in by_version[v]]
        doomed += [
            i
            for d in orphans
            for i in by_version[d.version]
            if i.key.startswith(self.keys.data_dir(d.version, d.data))
        ]
        if not dry_run and plan.keep:
            self.advance(plan.keep[-1])  # repairs a pointer left behind by a publisher that died
        if not dry_run and doomed:
            # Manifests first: a version disappears in one step, before any of its files do.
            self.store.delete([self.keys.manifest(v) for v in plan.delete])
            self.store.delete([i.key for i in doomed])
        freed = sum(i.size for i in doomed)
        return SeriesGc(
            plan=plan, orphans=orphans, freed_bytes=freed, kept_bytes=sum(i.size for i in objects) - freed
        )


_ABSENT: tuple[bytes, str] = (b"", "<absent>")
"""Marks "the pointer did not exist when read" for :meth:`Series.advance`."""


def _span(versions: list[int]) -> str:
    if len(versions) <= 6:
        return ", ".join(map(str, versions))
    return f"{', '.join(map(str, versions[:2]))}, …, {', '.join(map(str, versions[-3:]))}"
