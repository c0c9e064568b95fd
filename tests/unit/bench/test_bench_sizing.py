"""The 4B / H100 sizing table (benchmarks/sizing_4b.py): its derivations and its search over pool sizes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]


def load() -> Any:
    spec = importlib.util.spec_from_file_location("sizing_4b", REPO / "benchmarks" / "sizing_4b.py")
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sizing = load()


def test_every_assumption_names_what_it_is_and_its_source() -> None:
    for name, entry in sizing.ASSUMPTIONS.items():
        assert set(entry) == {"value", "what", "source"}, name
        assert entry["what"].strip() and entry["source"].strip(), name


def test_the_trainer_step_is_six_n_flops_per_token_at_the_stated_utilisation() -> None:
    # 512 rollouts of 256 + 1024 tokens, 6 × 4.02e9 FLOPs each, on 989.4 TFLOPS at 40 %: by hand, 39.9 s.
    assert sizing.step_seconds(0.40) == pytest.approx(39.94, abs=0.01)
    assert sizing.step_seconds(0.25) / sizing.step_seconds(0.40) == pytest.approx(1.6)


def test_the_adapter_size_follows_from_the_model_dimensions() -> None:
    hidden, q_out, kv_out, intermediate, layers, rank = 2560, 32 * 128, 8 * 128, 9728, 36, 16
    linear = [
        (hidden, q_out), (hidden, kv_out), (hidden, kv_out), (q_out, hidden),
        (hidden, intermediate), (hidden, intermediate), (intermediate, hidden),
    ]  # fmt: skip
    params = rank * sum(a + b for a, b in linear) * layers
    assert params * 2 / 1e6 == pytest.approx(sizing.ASSUMPTIONS["snapshotMB"]["value"], rel=0.01)
    assert sizing.ASSUMPTIONS["kvBytesPerToken"]["value"] == 2 * layers * kv_out * 2


def test_decoding_is_memory_bound_so_more_sequences_cost_only_their_kv_cache() -> None:
    one = sizing.decode_seconds(1, 1e12, 1.0)
    eight = sizing.decode_seconds(8, 1e12, 1.0)
    # 8 sequences read the weights once per step, not 8 times: far less than 8× the time of one.
    assert one < eight < 2 * one
    assert sizing.decode_seconds(8, 2e12, 1.0) == pytest.approx(eight / 2)
    classes = sizing.worker_classes()
    assert classes["m4pro"]["groupSeconds"] > classes["m4pro-idealbatch"]["groupSeconds"]
    assert classes["rtx5090"]["batchScaling"] < 1  # a lease of 8 groups takes less than 8 × one group


def test_the_search_finds_the_smallest_pool_that_keeps_the_trainer_busy() -> None:
    base = sizing.base_config(0.25, sizing.worker_classes(), steps=15)
    found = sizing.smallest_pool(base, "rtx5090", delta=2, seeds=1, limit=64)
    n = found["workers"]
    assert n is not None and found["busy"] >= 0.9
    assert sizing.busy(base, "rtx5090", n, 2, 1) >= 0.9
    if n > 1:
        assert sizing.busy(base, "rtx5090", n - 1, 2, 1) < 0.9


def test_a_pool_that_cannot_keep_up_within_the_limit_is_reported_as_none() -> None:
    base = sizing.base_config(0.40, sizing.worker_classes(), steps=10)
    found = sizing.smallest_pool(base, "m4pro", delta=1, seeds=1, limit=4)
    assert found["workers"] is None and found["limit"] == 4 and found["busyAtLimit"] < 0.9


def test_the_script_writes_the_table_and_its_assumptions(tmp_path: Path) -> None:
    out = tmp_path / "sizing.json"
    assert sizing.main(["--out", str(out), "--seeds", "1", "--steps", "8", "--deltas", "4"]) == 0
    report = json.loads(out.read_text())
    assert report["assumptions"]["h100PeakFlops"]["source"]
    assert {(r["mfu"], r["class"]) for r in report["rows"]} == {
        (m, c) for m in (0.40, 0.25) for c in ("m4pro", "m4pro-idealbatch", "rtx5090")
    }
    for row in report["rows"]:
        assert set(row["byMaxStaleness"]) == {"4"}
