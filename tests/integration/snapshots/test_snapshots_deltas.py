"""Delta snapshots (snapshots/deltas.py) on both stores: a temp dir and a real MinIO bucket.

Promised: a delta version fetched by any reader (one that holds the version before, or a fresh one that
starts from the anchor) is bit-identical to the weights the trainer had; a delta that does not rebuild
exactly is refused and leaves nothing in the cache; retention keeps a kept version's whole chain.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from echo_runtime.snapshots import deltas, errors, payloads
from echo_runtime.snapshots.store import SnapshotStore

BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(512, 64, generator=g).to(torch.bfloat16)
    return {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": embed,  # tied: shares memory with the embedding, as in SmolLM2
        "model.layers.0.mlp.up_proj.weight": torch.randn(256, 64, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.ones(64, dtype=torch.float32),
        "model.layers.0.self_attn.q_proj.bias": torch.tensor([0.0, -0.0, float("nan"), 1.0]),
    }


def _step(state: dict[str, torch.Tensor], seed: int, fraction: float = 0.02) -> dict[str, torch.Tensor]:
    """A "small optimizer step": a few elements change, as rounding in bf16 leaves most untouched."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state.items():
        t = tensor.clone()
        mask = torch.rand(t.shape, generator=g) < fraction
        t[mask] = (t.float()[mask] + 0.25).to(t.dtype)
        out[name] = t
    out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def _same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    if a.keys() != b.keys():
        return False
    for name in a:
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        width = BITS[x.element_size()]
        if not torch.equal(x.contiguous().reshape(-1).view(width), y.contiguous().reshape(-1).view(width)):
            return False
    return True


def _publish_run(
    store: SnapshotStore, tmp_path: Path, versions: int, interval: int
) -> list[dict[str, torch.Tensor]]:
    writer = deltas.Writer(interval)
    states = [_weights()]
    for v in range(1, versions + 1):
        states.append(_step(states[-1], v))
        folder = tmp_path / f"export-{v}"
        folder.mkdir()
        files, delta = writer.export(v, states[-1], folder)
        store.publish(v, files, kind="full", base_model="tiny", delta=delta)
    return states


def test_every_version_rebuilds_bit_identical_for_any_reader(store: SnapshotStore, tmp_path: Path) -> None:
    states = _publish_run(store, tmp_path, versions=7, interval=3)
    kinds = {v: store.manifest(v).delta for v in range(1, 8)}
    assert [v for v, d in kinds.items() if d is None] == [1, 3, 6]  # the first, then every 3rd: anchors
    assert kinds[5] is not None and (kinds[5].base, kinds[5].anchor) == (4, 3)
    full = store.manifest(6).total_size
    assert all(store.manifest(v).total_size < full / 4 for v in (2, 4, 5, 7))

    following = tmp_path / "following"  # a worker that fetches each version as it comes
    for v in range(1, 8):
        got = payloads.load_state_dict(store.fetch(v, following))
        assert _same_bits(got, payloads.storable(states[v])), f"version {v}"
    fresh = payloads.load_state_dict(store.fetch(5, tmp_path / "fresh"))  # anchor 3, then deltas 4 and 5
    assert _same_bits(fresh, payloads.storable(states[5]))
    assert sorted(p.name for p in (tmp_path / "fresh").rglob("*") if p.is_dir() and p.name.isdigit()) == [
        "3",
        "4",
        "5",
    ]


def test_a_delta_that_does_not_rebuild_exactly_is_refused(store: SnapshotStore, tmp_path: Path) -> None:
    writer = deltas.Writer(10)
    base, after = _weights(), _step(_weights(), 1)
    for v, state in ((1, base), (2, after)):
        folder = tmp_path / f"e{v}"
        folder.mkdir()
        files, delta = writer.export(v, state, folder)
        if delta is not None:  # the trainer's checksum of the full file says something else
            (entry,) = delta.files
            delta = delta.model_copy(update={"files": (entry.model_copy(update={"sha256": "0" * 64}),)})
        store.publish(v, files, kind="full", base_model="tiny", delta=delta)
    cache = tmp_path / "cache"
    store.fetch(1, cache)
    with pytest.raises(errors.CorruptSnapshotError, match="does not match the trainer's"):
        store.fetch(2, cache, verify_cached=True)  # a reader that re-hashes what it builds from its cache
    assert not any(p.name == "2" for p in cache.rglob("*"))  # nothing half-built left behind
    other = tmp_path / "other"
    store.fetch(1, other)
    damaged = next(other.rglob("model.safetensors"))
    with damaged.open("ab") as fh:  # the base in the cache is damaged: fetched again, never built on
        fh.write(b"x")
    rebuilt = store.fetch(2, other)
    assert damaged.stat().st_size == store.manifest(1).file("model.safetensors").size
    assert _same_bits(payloads.load_state_dict(rebuilt), payloads.storable(after))


def test_a_delta_needs_its_base_published_and_from_its_anchor(store: SnapshotStore, tmp_path: Path) -> None:
    _publish_run(store, tmp_path, versions=2, interval=5)  # 1 anchor, 2 delta
    delta = store.manifest(2).delta
    assert delta is not None
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / deltas.DELTA_FILE).write_bytes(b"")
    with pytest.raises(errors.VersionNotFoundError):
        store.publish(9, folder, kind="full", base_model="tiny", delta=delta.model_copy(update={"base": 7}))
    with pytest.raises(ValueError, match="does not start from anchor 2"):
        store.publish(
            3, folder, kind="full", base_model="tiny", delta=delta.model_copy(update={"anchor": 2, "base": 2})
        )
    raw = json.loads((store.blobs.get(store.layout.snapshots.manifest(2)) or b"{}").decode())
    assert (
        raw["format"] == 2
        and json.loads((store.blobs.get(store.layout.snapshots.manifest(1)) or b"{}").decode())["format"] == 1
    )  # older readers keep reading full versions, and refuse deltas


def test_retention_keeps_each_kept_versions_chain(store: SnapshotStore, tmp_path: Path) -> None:
    states = _publish_run(store, tmp_path, versions=8, interval=4)  # anchors 1, 4, 8
    report = store.gc(keep_last=2)  # newest: 7 (delta from anchor 4) and 8 (anchor)
    assert report.kept == (4, 5, 6, 7, 8) and report.needed == (4, 5, 6)
    assert report.deleted == (1, 2, 3)
    got = payloads.load_state_dict(store.fetch(7, tmp_path / "after-gc"))
    assert _same_bits(got, payloads.storable(states[7]))
