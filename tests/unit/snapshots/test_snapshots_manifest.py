"""The manifest document, the latest pointer, and the key layout."""

from __future__ import annotations

import datetime
import json

import pytest

from echo_runtime.snapshots import errors, layout
from echo_runtime.snapshots.manifest import FORMAT, FileEntry, Manifest, parse_pointer, pointer_bytes

SHA = "ab" * 32


def doc(**changes: object) -> Manifest:
    fields: dict[str, object] = dict(
        version=7,
        kind="lora",
        base_model="echorl:tiny",
        step=7,
        created=datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        data="data-0123456789abcdef",
        files=(
            FileEntry(name="adapter_model.safetensors", size=10, sha256=SHA),
            FileEntry(name="adapter_config.json", size=3, sha256=SHA),
        ),
    )
    fields.update(changes)
    return Manifest.model_validate(fields)


def test_round_trip() -> None:
    m = doc()
    assert Manifest.from_json(m.to_json(), "here") == m
    raw = json.loads(m.to_json())
    assert raw["format"] == 1 and raw["files"][0] == {  # format 2 only for deltas: old readers keep working
        "name": "adapter_model.safetensors",
        "size": 10,
        "sha256": SHA,
    }
    assert m.total_size == 13 and m.file("adapter_config.json").size == 3
    with pytest.raises(KeyError):
        m.file("nope")


def test_unknown_fields_from_a_newer_writer_are_ignored() -> None:
    raw = json.loads(doc().to_json())
    raw["someFutureField"] = 1
    assert Manifest.from_json(json.dumps(raw).encode(), "here") == doc()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(format=FORMAT + 1), "newer than this echorl understands"),
        (lambda r: r.update(kind="weights"), "kind"),
        (lambda r: r.update(version=-1), "version"),
        (lambda r: r.update(files=[]), "files"),
        (lambda r: r["files"][0].update(sha256="xyz"), "sha256"),
        (lambda r: r["files"][0].update(name="../x"), "relative path"),
        (lambda r: r["files"][1].update(name=r["files"][0]["name"]), "must be unique"),
        (lambda r: r.update(data="../../elsewhere"), "data"),
        (lambda r: r.pop("created"), "created"),
    ],
)
def test_invalid_manifests_are_reported_with_where(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    raw = json.loads(doc().to_json())
    mutate(raw)
    with pytest.raises(errors.InvalidManifestError, match=message) as exc:
        Manifest.from_json(json.dumps(raw).encode(), "s3://b/job/snapshots/7/manifest.json")
    assert str(exc.value).startswith("s3://b/job/snapshots/7/manifest.json: ")


def test_not_json() -> None:
    with pytest.raises(errors.InvalidManifestError, match="not valid JSON"):
        Manifest.from_json(b"\xff{", "here")


def test_pointer() -> None:
    assert parse_pointer(pointer_bytes(12), "latest") == 12
    for bad in (b"", b"12", b'{"version": -1}', b'{"version": true}', b'{"version": "3"}', b"[]"):
        with pytest.raises(errors.InvalidManifestError, match="latest: expected"):
            parse_pointer(bad, "latest")


@pytest.mark.parametrize("name", ["a.bin", "nested/dir/model-00001-of-00002.safetensors", "_x", "A-b_c.9"])
def test_good_file_names(name: str) -> None:
    assert layout.check_file_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/abs",
        "a//b",
        "../up",
        "a/../b",
        ".hidden",
        "a/.hidden",
        "a/",
        "sp ace",
        "back\\slash",
        "manifest.json",
        "x" * 256,
    ],
)
def test_bad_file_names(name: str) -> None:
    with pytest.raises(ValueError, match="file name"):
        layout.check_file_name(name)


def test_layout_keys_and_parsing() -> None:
    keys = layout.Layout("team/echo", "quick")
    assert keys.root == "team/echo/quick"
    snaps = keys.snapshots
    assert snaps.manifest(17) == "team/echo/quick/snapshots/17/manifest.json"
    assert snaps.latest == "team/echo/quick/snapshots/latest"
    assert snaps.data(17, "data-ab", "w.bin") == "team/echo/quick/snapshots/17/data-ab/w.bin"
    assert keys.checkpoints.manifest(3) == "team/echo/quick/checkpoints/3/manifest.json"
    assert snaps.parse("team/echo/quick/snapshots/17/data-ab/w.bin") == (17, "data-ab/w.bin")
    for stray in (
        "team/echo/quick/snapshots/latest",
        "team/echo/quick/snapshots/017/manifest.json",
        "team/echo/quick/snapshots/x/manifest.json",
        "other/snapshots/1/manifest.json",
    ):
        assert snaps.parse(stray) is None
    assert layout.Layout("", "quick").snapshots.manifest(0) == "quick/snapshots/0/manifest.json"
    pins = keys.pins
    assert pins.key(4, "w-1.a", 600) == "team/echo/quick/pins/4/w-1.a.ttl600.json"
    assert pins.parse(pins.key(4, "w-1.a", 600)) == (4, "w-1.a", 600)
    assert pins.parse("team/echo/quick/pins/4/w.json") is None
    with pytest.raises(ValueError, match="job: must be"):
        layout.Layout("", "bad/job")


def test_snapshot_and_checkpoint_manifests_keep_their_kinds_apart() -> None:
    from echo_runtime.snapshots.manifest import CheckpointManifest, SnapshotManifest

    raw = doc(kind="full").to_json()
    assert SnapshotManifest.from_json(raw, "here").kind == "full"
    with pytest.raises(errors.InvalidManifestError, match="kind"):
        CheckpointManifest.from_json(raw, "here")
    checkpoint = doc(kind="checkpoint").to_json()
    assert CheckpointManifest.from_json(checkpoint, "here").kind == "checkpoint"
    with pytest.raises(errors.InvalidManifestError, match="kind"):
        SnapshotManifest.from_json(checkpoint, "here")
