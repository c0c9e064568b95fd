"""The snapshot store's promises, checked on both implementations: a temp dir and a real MinIO bucket.

Every test runs twice (``local`` and ``s3``). What is promised: atomic publish (readers only see
complete versions, even with a publisher killed half-way), never-reused versions, verified fetch
(corruption detected, reported, refetched, never loaded), a cache that costs no requests, retention
with pins, and bit-exact payloads.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from snapshots_testing import (
    HERE,
    STREAM_SIZES,
    CountingBlobs,
    MiB,
    Target,
    check_payload,
    child_env,
    content,
    wait_for,
    write_payload,
)

from echo_runtime.snapshots import errors, layout, payloads
from echo_runtime.snapshots.store import SnapshotStore

# ---------------------------------------------------------------------------------------------
# Publish and fetch


def test_publish_then_fetch_returns_the_published_bytes(store: SnapshotStore, tmp_path: Path) -> None:
    sizes = [0, 1, 4096, 12 * MiB + 3]  # an empty file, and one large enough for parts
    src = write_payload(tmp_path / "src", 3, sizes)
    assert store.latest_version() is None and store.versions() == []

    doc = store.publish(3, src, kind="full", base_model="echorl:tiny", step=3)

    assert store.latest_version() == 3 and store.versions() == [3]
    assert doc == store.manifest(3)
    assert (doc.version, doc.kind, doc.base_model, doc.step) == (3, "full", "echorl:tiny", 3)
    assert [(f.name, f.size) for f in doc.files] == [(f"part-{i}.bin", s) for i, s in enumerate(sizes)]
    path = store.fetch(3, tmp_path / "cache")
    check_payload(path, 3, sizes)
    assert json.loads((path / "manifest.json").read_bytes()) == json.loads(doc.to_json())


def test_files_as_a_list_or_a_mapping(store: SnapshotStore, tmp_path: Path) -> None:
    src = write_payload(tmp_path / "src", 1, [10, 20])
    store.publish(1, [src / "part-0.bin", src / "part-1.bin"], kind="lora", base_model="m")
    store.publish(2, {"nested/w.bin": src / "part-0.bin"}, kind="lora", base_model="m")
    assert [f.name for f in store.manifest(1).files] == ["part-0.bin", "part-1.bin"]
    assert (store.fetch(2, tmp_path / "cache") / "nested" / "w.bin").read_bytes() == content(1, 0, 10)
    with pytest.raises(ValueError, match="reserved"):
        store.publish(3, {"manifest.json": src / "part-0.bin"}, kind="lora", base_model="m")
    with pytest.raises(ValueError, match="relative path"):
        store.publish(3, {"../escape": src / "part-0.bin"}, kind="lora", base_model="m")
    assert store.versions() == [1, 2]


def test_a_version_is_never_overwritten_or_reused(store: SnapshotStore, tmp_path: Path) -> None:
    src = write_payload(tmp_path / "src", 1, [100])
    store.publish(5, src, kind="lora", base_model="m")
    with pytest.raises(errors.VersionExistsError, match="already exists") as exc:
        store.publish(5, src, kind="lora", base_model="m")
    assert exc.value.version == 5
    with pytest.raises(errors.VersionExistsError, match="not newer than the latest published version 5"):
        store.publish(4, src, kind="lora", base_model="m")
    store.publish(6, src, kind="lora", base_model="m")
    store.gc(keep_last=1)
    assert store.versions() == [6]
    with pytest.raises(errors.VersionExistsError, match="never reused"):
        store.publish(5, src, kind="lora", base_model="m")  # removed by retention, still never reused


def test_two_publishers_never_both_claim_a_version(target: Target, tmp_path: Path) -> None:
    stores = [target.open() for _ in range(4)]
    outcomes: dict[int, list[object]] = {}
    for version in range(1, 6):
        barrier = threading.Barrier(len(stores))
        results: list[object] = [None] * len(stores)

        def publish(
            i: int,
            version: int = version,
            barrier: threading.Barrier = barrier,
            results: list[object] = results,
        ) -> None:
            src = write_payload(tmp_path / f"p{i}-v{version}", 1000 * i + version, [2000, 3000])
            barrier.wait()
            try:
                results[i] = stores[i].publish(version, src, kind="full", base_model=f"publisher-{i}")
            except errors.VersionExistsError as exc:
                results[i] = exc

        threads = [threading.Thread(target=publish, args=(i,)) for i in range(len(stores))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        outcomes[version] = results

    for version, results in outcomes.items():
        winners = [i for i, r in enumerate(results) if not isinstance(r, Exception)]
        assert len(winners) == 1, f"version {version}: {results}"
        (winner,) = winners
        assert stores[0].manifest(version).base_model == f"publisher-{winner}"
        path = stores[1].fetch(version, tmp_path / "cache")
        check_payload(path, 1000 * winner + version, [2000, 3000])
    # Losers removed their files; only each winner's data folder is left.
    data_dirs = {
        k.key.split("/")[-2]
        for k in stores[0].blobs.list(stores[0].layout.snapshots.base + "/")
        if "/data-" in k.key
    }
    assert len(data_dirs) == len(outcomes)


def test_create_only_write_has_exactly_one_winner(target: Target) -> None:
    handles = [target.blobs() for _ in range(6)]
    key = layout.join(target.prefix, "race", "claim.json")
    for round_ in range(10):
        barrier = threading.Barrier(len(handles))
        won: list[bool] = [False] * len(handles)

        def claim(
            i: int, barrier: threading.Barrier = barrier, won: list[bool] = won, r: int = round_
        ) -> None:
            barrier.wait()
            won[i] = handles[i].create(f"{key}.{r}", f"writer {i}".encode())

        threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(handles))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert won.count(True) == 1, won
        assert handles[0].get(f"{key}.{round_}") == f"writer {won.index(True)}".encode()


# ---------------------------------------------------------------------------------------------
# Readers during publishes and crashes


def test_readers_only_ever_see_complete_versions(target: Target, tmp_path: Path) -> None:
    sizes = [5000, 6 * MiB + 1, 300]
    publisher, versions_to_publish = target.open(), 8
    seen: list[int] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def read(reader: int) -> None:
        store, cache = target.open(), tmp_path / f"cache-{reader}"
        try:
            while not done.is_set():
                for version in [
                    *([v] if (v := store.latest_version()) is not None else []),
                    *store.versions(),
                ]:
                    check_payload(store.fetch(version, cache), version, sizes)
                    seen.append(version)
        except BaseException as exc:
            failures.append(exc)

    readers = [threading.Thread(target=read, args=(r,)) for r in range(3)]
    for t in readers:
        t.start()
    try:
        for version in range(1, versions_to_publish + 1):
            publisher.publish(
                version,
                write_payload(tmp_path / f"src{version}", version, sizes),
                kind="full",
                base_model="m",
            )
    finally:
        time.sleep(0.2)
        done.set()
        for t in readers:
            t.join()
    assert not failures, failures
    assert publisher.latest_version() == versions_to_publish
    assert set(seen) <= set(range(1, versions_to_publish + 1)) and seen


def _start_child(target: Target, mode: str, src: Path, marker: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "snapshots_testing.py"), target.to_json(), mode, str(src), str(marker)],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_publish_killed_half_way_leaves_no_version(target: Target, tmp_path: Path) -> None:
    sizes = [4000, 7 * MiB, 2000]
    src, marker = write_payload(tmp_path / "src", 1, sizes), tmp_path / "uploading"
    child = _start_child(target, "stall", src, marker)
    try:
        wait_for(marker, timeout=60)  # one file is in the store, the others are not
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    store = target.open()
    leftovers = [i.key for i in store.blobs.list(store.layout.snapshots.base + "/")]
    assert leftovers and all("/data-" in k for k in leftovers)  # files, but no manifest, no pointer
    assert store.latest_version() is None and store.versions() == []
    with pytest.raises(errors.VersionNotFoundError):
        store.fetch(1, tmp_path / "cache")

    store.publish(1, src, kind="full", base_model="test")  # the same number is still free
    check_payload(store.fetch(1, tmp_path / "cache"), 1, sizes)
    assert store.gc(orphan_grace_s=3600).orphans == ()  # still within the grace period
    report = store.gc(orphan_grace_s=60, now=store.blobs.now() + 61)  # S3's clock has 1 s resolution
    assert len(report.orphans) == 1 and report.orphans[0].startswith(store.layout.snapshots.version_dir(1))
    remaining = {i.key for i in store.blobs.list(store.layout.snapshots.base + "/")}
    assert remaining.isdisjoint(leftovers)
    check_payload(store.fetch(1, tmp_path / "cache2"), 1, sizes)


def test_publisher_killed_at_a_random_moment(target: Target, tmp_path: Path) -> None:
    rng = random.Random(os.environ.get("PYTEST_XDIST_WORKER", "0") + str(time.time_ns()))
    marker = tmp_path / "started"
    child = _start_child(target, "stream", tmp_path / "src", marker)
    try:
        wait_for(marker, timeout=60)
        time.sleep(rng.uniform(0.3, 1.5))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    store = target.open()
    versions = store.versions()
    assert versions == list(range(1, len(versions) + 1))
    for version in versions:
        check_payload(store.fetch(version, tmp_path / "cache"), version, STREAM_SIZES)
    latest = store.latest_version()
    assert latest == (versions[-1] if versions else None)
    nxt = (latest or 0) + 1
    store.publish(nxt, write_payload(tmp_path / "next", nxt, [10]), kind="full", base_model="test")
    assert store.latest_version() == nxt


def test_latest_survives_a_pointer_that_lags(store: SnapshotStore, tmp_path: Path) -> None:
    """A publisher killed between the manifest and the pointer: the version is complete and counts."""
    src = write_payload(tmp_path / "src", 1, [10])
    store.publish(1, src, kind="lora", base_model="m")
    store.publish(2, src, kind="lora", base_model="m")
    store.blobs.put(store.layout.snapshots.latest, b'{"version": 1}\n')
    assert store.latest_version() == 2
    store.blobs.put(store.layout.snapshots.latest, b"garbage")
    assert store.latest_version() == 2
    store.gc()  # gc repairs the pointer
    assert store.blobs.get(store.layout.snapshots.latest) == b'{"version": 2}\n'
    store.publish(3, src, kind="lora", base_model="m")
    assert store.blobs.get(store.layout.snapshots.latest) == b'{"version": 3}\n'


# ---------------------------------------------------------------------------------------------
# Verified fetch and the cache


def _data_key(store: SnapshotStore, version: int, name: str) -> str:
    doc = store.manifest(version)
    return store.layout.snapshots.data(version, doc.data, name)


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
@pytest.mark.parametrize("size", [3000, 11 * MiB])
def test_a_corrupt_object_is_detected_and_never_loaded(
    store: SnapshotStore, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str, size: int
) -> None:
    src = write_payload(tmp_path / "src", 1, [100, size])
    store.publish(1, src, kind="full", base_model="m")
    good = content(1, 1, size)
    bad = {
        "flip": good[: size // 2] + bytes([good[size // 2] ^ 1]) + good[size // 2 + 1 :],
        "truncate": good[: size - 7],
        "extend": good + b"x",
    }[damage]
    (tmp_path / "bad").write_bytes(bad)
    store.blobs.upload(_data_key(store, 1, "part-1.bin"), tmp_path / "bad")

    caplog.set_level(logging.WARNING, "echo_runtime.snapshots")
    with pytest.raises(errors.CorruptSnapshotError, match=r"part-1\.bin") as exc:
        store.fetch(1, tmp_path / "cache")
    assert (exc.value.version, exc.value.file) == (1, "part-1.bin")
    assert sum("corrupt object" in r.message for r in caplog.records) == 3  # reported at every attempt
    assert not any((tmp_path / "cache").rglob("part-*.bin"))  # nothing half-loaded is left behind

    store.blobs.upload(_data_key(store, 1, "part-1.bin"), src / "part-1.bin")  # repaired
    check_payload(store.fetch(1, tmp_path / "cache"), 1, [100, size])


def test_a_transient_corruption_is_fetched_again(
    store: SnapshotStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = write_payload(tmp_path / "src", 1, [5000])
    store.publish(1, src, kind="full", base_model="m")
    real_download = store.blobs.download
    calls = []

    def flaky_download(key: str, dest: Path, size: int):  # type: ignore[no-untyped-def]
        calls.append(key)
        digest = real_download(key, dest, size)
        if len(calls) == 1:  # the first transfer arrives damaged
            dest.write_bytes(b"\0" * size)
            return type(digest)(size, "0" * 64)
        return digest

    store.blobs.download = flaky_download  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, "echo_runtime.snapshots")
    check_payload(store.fetch(1, tmp_path / "cache"), 1, [5000])
    assert len(calls) == 2
    assert any("corrupt object" in r.message and "fetching it again" in r.message for r in caplog.records)


def test_a_cached_version_costs_no_request(target: Target, tmp_path: Path) -> None:
    src = write_payload(tmp_path / "src", 1, [1000, 6 * MiB])
    target.open().publish(1, src, kind="full", base_model="m")
    counting = CountingBlobs(target.blobs())
    store = SnapshotStore(counting, "job", prefix=target.prefix)  # type: ignore[arg-type]
    first = store.fetch(1, tmp_path / "cache")
    assert counting.calls["download"] == 2
    counting.calls.clear()
    again = store.fetch(1, tmp_path / "cache")
    assert again == first and sum(counting.calls.values()) == 0

    # A damaged cache entry (a file truncated on disk) is noticed and fetched again.
    (first / "part-1.bin").write_bytes(b"short")
    check_payload(store.fetch(1, tmp_path / "cache"), 1, [1000, 6 * MiB])
    assert counting.calls["download"] == 2


def test_fetch_latest_only_when_newer(store: SnapshotStore, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert store.fetch_latest(cache) is None
    store.publish(1, write_payload(tmp_path / "s1", 1, [10]), kind="lora", base_model="m")
    got = store.fetch_latest(cache)
    assert got is not None and got[0] == 1
    assert store.fetch_latest(cache, newer_than=1) is None
    store.publish(2, write_payload(tmp_path / "s2", 2, [10]), kind="lora", base_model="m")
    got = store.fetch_latest(cache, newer_than=1, keep_cached=1)
    assert got is not None and got[0] == 2
    check_payload(got[1], 2, [10])
    assert sorted(p.name for p in got[1].parent.iterdir()) == ["2"]  # pruned to the newest one


def test_fetch_of_a_missing_version_says_what_exists(store: SnapshotStore, tmp_path: Path) -> None:
    store.publish(1, write_payload(tmp_path / "s1", 1, [10]), kind="lora", base_model="m")
    with pytest.raises(errors.VersionNotFoundError, match=r"version 7 is not in .*available: 1"):
        store.fetch(7, tmp_path / "cache")


def test_a_full_cache_is_reported_before_downloading(
    store: SnapshotStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.publish(1, write_payload(tmp_path / "s1", 1, [10_000]), kind="lora", base_model="m")
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=1000))
    with pytest.raises(errors.CacheFullError, match=r"not enough space in the cache directory .* needs"):
        store.fetch(1, tmp_path / "cache")


# ---------------------------------------------------------------------------------------------
# Retention


def test_retention_keeps_the_newest_and_the_pinned(store: SnapshotStore, tmp_path: Path) -> None:
    src = write_payload(tmp_path / "src", 1, [100])
    for version in range(1, 8):
        store.publish(version, src, kind="lora", base_model="m")
    store.pin(2, "worker-a", ttl_s=3600)
    store.pin(3, "worker-b", ttl_s=1)  # this reader died: its pin runs out
    store.pin(3, "worker-c", ttl_s=3600)
    store.unpin(3, "worker-c")  # this one is done with it
    now = store.blobs.now()

    dry = store.gc(keep_last=2, dry_run=True, now=now + 10)
    assert (dry.kept, dry.deleted, dry.pinned) == ((2, 6, 7), (1, 3, 4, 5), (2,))
    assert store.versions() == list(range(1, 8))  # a dry run removes nothing

    manifests = sum(len(store.blobs.get(store.layout.snapshots.manifest(v)) or b"") for v in (1, 3, 4, 5))
    report = store.gc(keep_last=2, now=now + 10)
    assert (report.kept, report.deleted, report.pinned) == ((2, 6, 7), (1, 3, 4, 5), (2,))
    assert [(p.version, p.reader) for p in report.expired_pins] == [(3, "worker-b")]
    assert report.freed_bytes == 4 * 100 + manifests
    assert store.versions() == [2, 6, 7]
    assert [(p.version, p.reader) for p in store.pins()] == [(2, "worker-a")]
    assert (store.fetch(2, tmp_path / "cache") / "part-0.bin").read_bytes() == content(1, 0, 100)

    # Once the last pin expires, the pinned version goes too; the newest keep_last always stay.
    later = store.gc(keep_last=2, now=now + 7200)
    assert (later.kept, later.deleted) == ((6, 7), (2,))
    assert store.versions() == [6, 7] and store.latest_version() == 7


def test_pin_renewal_replaces_the_old_pin(store: SnapshotStore) -> None:
    store.pin(4, "worker-a", ttl_s=30)
    store.pin(4, "worker-a", ttl_s=600)
    assert [(p.version, p.reader, p.ttl_s) for p in store.pins()] == [(4, "worker-a", 600)]
    with pytest.raises(ValueError, match="reader_id"):
        store.pin(4, "bad/reader", ttl_s=10)


def test_checkpoints_live_beside_snapshots_with_their_own_retention(
    store: SnapshotStore, tmp_path: Path
) -> None:
    assert store.load_latest_checkpoint(tmp_path / "cache") is None
    state = tmp_path / "state"
    state.mkdir()
    for step in (10, 20, 30):
        (state / "optimizer.pt").write_bytes(content(step, 0, 1000))
        (state / "trainer.json").write_text(json.dumps({"step": step}))
        store.save_checkpoint(step, state, base_model="m")
    assert store.checkpoints() == [20, 30]  # checkpoint_keep_last defaults to 2
    assert store.versions() == []  # separate from the snapshots
    loaded = store.load_latest_checkpoint(tmp_path / "cache")
    assert loaded is not None and loaded[0] == 30
    assert (loaded[1] / "optimizer.pt").read_bytes() == content(30, 0, 1000)
    assert store.checkpoint_manifest(30).kind == "checkpoint"
    with pytest.raises(errors.VersionExistsError, match="checkpoint 30 already exists"):
        store.save_checkpoint(30, state)
    report = store.gc(checkpoint_keep_last=1)
    assert report.checkpoints_deleted == (20,) and store.checkpoints() == [30]


def test_a_checkpoint_written_in_parts_is_invisible_until_committed_whole(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """The ranks of a sharded trainer each upload their part into the folder one staged; the commit of
    every part's entries makes the checkpoint visible at once, and a killed rank's parts stay orphans."""
    parts = []
    for rank in (0, 1):
        part = tmp_path / f"rank{rank}"
        part.mkdir()
        (part / f"__{rank}_0.distcp").write_bytes(content(rank, 0, 3000))
        parts.append(part)
    data = store.stage_checkpoint(5)
    entries = [
        e
        for rank, part in enumerate(parts)
        for e in store.upload_checkpoint_part(
            5, data, {f"state/__{rank}_0.distcp": part / f"__{rank}_0.distcp"}
        )
    ]
    assert store.checkpoints() == [] and store.latest_checkpoint() is None  # uploaded, not committed
    store.commit_checkpoint(5, data, entries, base_model="m")
    assert store.checkpoints() == [5]
    fetched = store.fetch_checkpoint(5, tmp_path / "cache")
    for rank in (0, 1):
        assert (fetched / "state" / f"__{rank}_0.distcp").read_bytes() == content(rank, 0, 3000)
    # Two parts naming the same file are refused; a step not newer than the latest is refused at stage.
    again = store.stage_checkpoint(6)
    twice = store.upload_checkpoint_part(6, again, {"state/__0_0.distcp": parts[0] / "__0_0.distcp"})
    with pytest.raises(ValueError, match=r"two writers uploaded state/__0_0\.distcp"):
        store.commit_checkpoint(6, again, twice + twice)
    assert store.checkpoints() == [5]
    with pytest.raises(errors.VersionExistsError, match="checkpoint 5 already exists"):
        store.stage_checkpoint(5)
    with pytest.raises(ValueError, match="not a data folder"):
        store.upload_checkpoint_part(7, "../x", parts[0])


# ---------------------------------------------------------------------------------------------
# Payloads


def test_full_state_dict_round_trip_is_bit_exact(store: SnapshotStore, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    state = {
        "embed.weight": torch.randn(300, 64, generator=gen),
        "layers.0.w": torch.randn(64, 64, generator=gen).to(torch.bfloat16),
        "layers.0.h": torch.randn(64, 128, generator=gen).to(torch.float16),
        "layers.0.ids": torch.randint(-(2**62), 2**62, (50,), generator=gen),
        "layers.0.mask": torch.rand(7, generator=gen) > 0.5,
        "scale": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "nan": torch.tensor([float("nan"), float("inf"), -0.0]),
    }
    state["lm_head.weight"] = state["embed.weight"]  # tied weights
    files = payloads.save_state_dict(state, tmp_path / "weights", max_shard_bytes=40_000)
    assert len(files) > 3 and (tmp_path / "weights" / payloads.FULL_INDEX) in files
    store.publish(1, tmp_path / "weights", kind="full", base_model="m")

    loaded = payloads.load_state_dict(store.fetch(1, tmp_path / "cache"))
    assert loaded.keys() == state.keys()
    for name, tensor in state.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape, name
        assert _bytes(loaded[name]) == _bytes(tensor), name  # bitwise: NaNs and -0.0 included


def _bytes(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.contiguous().reshape(-1).view(torch.uint8).tolist())


def test_peft_adapter_round_trip_is_bit_exact(store: SnapshotStore, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = peft.get_peft_model(
        transformers.Qwen3ForCausalLM(config),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    payloads.save_peft_adapter(model, tmp_path / "adapter")
    assert payloads.detect_kind(tmp_path / "adapter") == "lora"
    store.publish(1, tmp_path / "adapter", kind="lora", base_model="echorl:tiny")

    fetched = store.fetch(1, tmp_path / "cache")
    adapter = payloads.load_lora_adapter(fetched)
    expected = peft.get_peft_model_state_dict(model)
    assert adapter.tensors.keys() == expected.keys()
    assert all(torch.equal(adapter.tensors[k], expected[k]) for k in expected)
    assert adapter.config["r"] == 4

    # And peft itself loads the fetched folder onto a fresh base model with identical weights.
    torch.manual_seed(1)
    reloaded = peft.PeftModel.from_pretrained(transformers.Qwen3ForCausalLM(config), str(fetched))
    again = peft.get_peft_model_state_dict(reloaded)
    assert all(torch.equal(again[k], expected[k]) for k in expected)
