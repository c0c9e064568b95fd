"""The local directory store and the cache, at the level of files: atomic writes, hidden temporaries,
compare-and-swap, running out of space, and two readers filling one cache entry."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from echo_runtime.snapshots import blobs, errors
from echo_runtime.snapshots.cache import Cache
from echo_runtime.snapshots.local import LocalBlobs
from echo_runtime.snapshots.store import SnapshotStore


def test_create_swap_put(tmp_path: Path) -> None:
    store = LocalBlobs(tmp_path)
    assert store.create("a/b.json", b"one") and not store.create("a/b.json", b"two")
    assert store.get("a/b.json") == b"one"
    _data, tag = store.get_tagged("a/b.json") or (b"", "")
    assert store.swap("a/b.json", b"three", tag) and not store.swap("a/b.json", b"four", tag)
    assert not store.swap("a/new", b"x", "some-tag") and store.swap("a/new", b"x", None)
    store.put("a/b.json", b"five")
    assert store.get("a/b.json") == b"five" and store.get("a/missing") is None
    assert sorted(i.key for i in store.list("a/")) == ["a/b.json", "a/new"]  # no temporaries, no locks
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".tmp-")]


def test_keys_cannot_escape_the_root(tmp_path: Path) -> None:
    store = LocalBlobs(tmp_path / "root")
    for key in ("../x", "a/../../x", "/abs", "a//b", ""):
        with pytest.raises(ValueError, match="invalid object key"):
            store.get(key)


def test_delete_removes_empty_folders_but_not_the_root(tmp_path: Path) -> None:
    store = LocalBlobs(tmp_path)
    store.put("j/snapshots/1/data-a/x", b"1")
    store.put("j/snapshots/2/manifest.json", b"2")
    store.delete(["j/snapshots/1/data-a/x", "j/snapshots/1/data-a/missing"])
    assert not (tmp_path / "j/snapshots/1").exists() and (tmp_path / "j/snapshots/2").is_dir()
    store.delete(["j/snapshots/2/manifest.json"])
    assert tmp_path.is_dir() and not any(tmp_path.iterdir())


def test_concurrent_create_of_one_key(tmp_path: Path) -> None:
    handles = [LocalBlobs(tmp_path) for _ in range(8)]
    barrier, won = threading.Barrier(8), [False] * 8

    def claim(i: int) -> None:
        barrier.wait()
        won[i] = handles[i].create("v/manifest.json", str(i).encode())

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert won.count(True) == 1 and handles[0].get("v/manifest.json") == str(won.index(True)).encode()


def _published(tmp_path: Path) -> SnapshotStore:
    store = SnapshotStore(LocalBlobs(tmp_path / "store"), "job")
    (tmp_path / "w.bin").write_bytes(b"w" * 5000)
    store.publish(1, tmp_path / "w.bin", kind="full", base_model="m")
    return store


def test_running_out_of_space_while_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _published(tmp_path)

    def full_disk(self: LocalBlobs, key: str, dest: Path, size: int) -> blobs.Digest:
        dest.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(LocalBlobs, "download", full_disk)
    with pytest.raises(errors.CacheFullError, match="ran out of space while fetching version 1"):
        store.fetch(1, tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.bin"))


def test_two_readers_fill_one_entry(tmp_path: Path) -> None:
    store = _published(tmp_path)
    results: list[Path] = []
    barrier = threading.Barrier(4)

    def read() -> None:
        barrier.wait()
        results.append(store.fetch(1, tmp_path / "cache"))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and (results[0] / "w.bin").read_bytes() == b"w" * 5000
    assert sorted(p.name for p in results[0].parent.iterdir()) == ["1"]


def test_cache_lookup_verifies_and_prunes(tmp_path: Path) -> None:
    store = _published(tmp_path)
    for version in (2, 3):
        store.publish(version, tmp_path / "w.bin", kind="full", base_model="m")
    paths = [store.fetch(v, tmp_path / "cache") for v in (1, 2, 3)]
    cache = Cache(tmp_path / "cache", store.blobs.cache_key, store.layout.snapshots)
    assert cache.lookup(1, verify=True) == paths[0]
    (paths[0] / "w.bin").write_bytes(b"x" * 5000)  # same size, other bytes
    assert cache.lookup(1) == paths[0]  # a size check does not see it ...
    assert cache.lookup(1, verify=True) is None and not paths[0].exists()  # ... a full check does
    (paths[1] / "manifest.json").write_text("{")
    assert cache.lookup(2) is None
    assert cache.prune(keep_last=1) == [] and sorted(p.name for p in cache.dir.iterdir()) == ["3"]
    (tmp_path / "cache2").mkdir()
    for v in (1, 2, 3):
        store.fetch(v, tmp_path / "cache2", keep_cached=2)
    assert sorted(p.name for p in (tmp_path / "cache2").rglob("snapshots/*")) == ["2", "3"]


def test_the_latest_pointer_only_moves_forward(tmp_path: Path) -> None:
    store = _published(tmp_path)
    series = store._snapshots
    series.advance(5)
    series.advance(3)
    assert store.blobs.get(store.layout.snapshots.latest) == b'{"version": 5}\n'
    barrier = threading.Barrier(6)

    def move(v: int) -> None:
        barrier.wait()
        series.advance(v)

    threads = [threading.Thread(target=move, args=(v,)) for v in (9, 7, 12, 8, 11, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.blobs.get(store.layout.snapshots.latest) == b'{"version": 12}\n'


def test_hidden_files_of_a_directory_are_not_published(tmp_path: Path) -> None:
    store = SnapshotStore(LocalBlobs(tmp_path / "store"), "job")
    src = tmp_path / "src"
    (src / ".cache").mkdir(parents=True)
    (src / "w.bin").write_bytes(b"w")
    (src / ".DS_Store").write_bytes(b"x")
    (src / ".cache" / "junk").write_bytes(b"x")
    assert [f.name for f in store.publish(1, src, kind="lora", base_model="m").files] == ["w.bin"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="nothing to publish"):
        store.publish(2, tmp_path / "empty", kind="lora", base_model="m")
    with pytest.raises(FileNotFoundError, match="not a file"):
        store.publish(2, tmp_path / "missing.bin", kind="lora", base_model="m")
