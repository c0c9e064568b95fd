"""snapshots/deltas.py, the writer's decisions: anchor or delta (the round trip is tested on real stores
in tests/integration/snapshots/test_snapshots_deltas.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from echo_runtime.snapshots import deltas


def test_a_delta_as_large_as_half_the_weights_goes_out_in_full(tmp_path: Path) -> None:
    writer = deltas.Writer(100)
    state = {"w": torch.zeros(1000, dtype=torch.float32)}
    changes = [torch.arange(1000.0) * (i + 1) for i in range(3)]
    changes[2] = changes[1].clone()
    changes[2][:10] += 1  # only 10 elements change from version 2 to 3
    published = []
    for v, tensor in enumerate([state["w"], *changes], start=1):
        folder = tmp_path / str(v)
        folder.mkdir()
        files, delta = writer.export(v, {"w": tensor}, folder)
        published.append((sorted(files), delta))
    assert [d is None for _, d in published] == [True, True, True, False]  # everything changed twice
    files, delta = published[3]
    assert files == [deltas.DELTA_FILE] and delta is not None and (delta.base, delta.anchor) == (3, 3)
    assert (tmp_path / "4" / deltas.DELTA_FILE).stat().st_size < 1000


def test_changes_are_found_by_bits_not_by_value() -> None:
    before = {"b": torch.tensor([0.0, 1.0, float("nan"), 2.0], dtype=torch.bfloat16)}
    after = {"b": torch.tensor([-0.0, 1.0, float("nan"), 2.0], dtype=torch.bfloat16)}
    found = deltas.diff(before, after)
    assert found["b.__idx__"].tolist() == [0]  # -0.0 == 0.0 as values, not as bits; NaN unchanged
    assert torch.equal(deltas.bits(found["b.__val__"]), deltas.bits(after["b"][:1]))
