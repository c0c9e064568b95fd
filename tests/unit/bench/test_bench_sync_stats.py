"""``echorl bench sync``'s pure part: interval math against closed forms and hand-computed values, per-run measures and
aggregation of synthetic runs, configuration parsing and the manifests the grid runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from echo_runtime import spec
from echo_runtime.bench import sync, sync_run


def test_t_quantiles_match_closed_forms_and_tables() -> None:
    # df = 1 is the Cauchy distribution: t = tan(π(0.975 − 1/2)); df = 2 has t = (2u − 1)/√(2u(1 − u)).
    assert sync.t_quantile(1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-9)
    assert sync.t_quantile(2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-9)
    assert sync.t_quantile(30) == pytest.approx(2.042, abs=1e-3)  # tables
    assert sync.t_quantile(120) == pytest.approx(1.980, abs=1e-3)  # tables
    with pytest.raises(ValueError):
        sync.t_quantile(0)


def test_t_interval_by_hand() -> None:
    # mean 2, s = 1, n = 3: half-width t₀.₉₇₅,₂ / √3 with t₀.₉₇₅,₂ = 0.95/√(2·0.975·0.025) = 4.3027
    t2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    low, high = sync.t_interval([1.0, 2.0, 3.0])  # type: ignore[misc]
    assert (low, high) == pytest.approx((2 - t2 / math.sqrt(3), 2 + t2 / math.sqrt(3)))
    assert sync.t_interval([5.0]) is None
    assert sync.t_interval([4.0, 4.0]) == pytest.approx((4.0, 4.0))


def test_bootstrap_is_seeded_and_inside_the_range() -> None:
    values = [1.0, 2.0, 3.0, 10.0]
    a = sync.bootstrap_interval(values, seed=3)
    assert a == sync.bootstrap_interval(values, seed=3)
    assert a is not None and 1.0 <= a[0] < 4.0 < a[1] <= 10.0  # around the mean 4
    assert sync.bootstrap_interval([1.0]) is None
    assert sync.bootstrap_interval([2.0, 2.0]) == pytest.approx((2.0, 2.0))


def test_ratio_of_means() -> None:
    found = sync.ratio_interval([10.0, 10.0], [5.0, 5.0])
    assert found is not None and found[0] == pytest.approx(2.0) and found[1] == pytest.approx((2.0, 2.0))
    spread = sync.ratio_interval([8.0, 10.0, 12.0], [4.0, 5.0, 6.0], seed=1)
    assert spread == sync.ratio_interval([8.0, 10.0, 12.0], [4.0, 5.0, 6.0], seed=1)
    assert spread is not None and spread[1] is not None
    # Extreme resamples: 8/6 and 12/4; the interval holds the ratio 2 and lies inside those.
    assert 8 / 6 <= spread[1][0] < 2.0 < spread[1][1] <= 12 / 4
    assert sync.ratio_interval([], [1.0]) is None
    assert sync.ratio_interval([1.0], [0.0]) is None
    assert sync.ratio_interval([1.0, 2.0], [0.0, 3.0]) == (pytest.approx(1.0), None)  # could divide by 0


def _run(
    mode_staleness: dict[str, int], accs: list[tuple[int, float, float]], step_s: float
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = {
        "policyVersion": accs[-1][0],
        "stalenessHistogram": mode_staleness,
        "droppedStale": 1,
        "weightedStale": 0,
        "maxObservedStaleness": max(int(k) for k in mode_staleness),
        "initialHeldoutAccuracy": accs[0][1],
        "finalHeldoutAccuracy": accs[-1][1],
        "evaluations": [{"policyVersion": v, "heldoutAccuracy": a, "publishedAt": t} for v, a, t in accs],
        "workerTiming": {"cpu-0": {"loadSeconds": 2.0, "wallSeconds": 20.0}},
    }
    records = [
        {"kind": "trainer", "time": 5.0 * (i + 1), "stepSeconds": step_s, "rollouts": 8} for i in range(4)
    ]
    return summary, records


def test_run_measures_by_hand() -> None:
    summary, records = _run({"0": 6, "1": 2}, [(0, 0.0, 0.0), (2, 0.4, 10.0), (4, 0.6, 20.0)], 2.5)
    m = sync.run_measures(summary, records, target=0.5)
    assert m["trainingSeconds"] == 20.0
    assert m["trainerBusyFraction"] == pytest.approx(10.0 / 20.0)
    assert m["rolloutsPerSecond"] == pytest.approx(32 / 20.0)
    assert m["snapshotLoadFraction"] == pytest.approx(0.1)
    assert m["meanStaleness"] == pytest.approx(2 / 8)
    assert (m["timeToTargetSeconds"], m["stepsToTarget"], m["reachedTarget"]) == (20.0, 4, True)
    missed = sync.run_measures(summary, records, target=0.9)
    assert (missed["timeToTargetSeconds"], missed["reachedTarget"]) == (None, False)


def test_intervals_of_fractions_stay_inside_zero_and_one() -> None:
    raw = sync.t_interval([0.25, 0.5])
    assert raw is not None and raw[0] < 0 and raw[1] > 1  # two seeds: t(0.975, 1) = 12.7
    assert sync.describe([0.25, 0.5], within=(0.0, 1.0))["ci95"] == (0.0, 1.0)
    assert sync.describe([0.25, 0.5])["ci95"] == raw
    summary, records = _run({"0": 8}, [(0, 0.0, 0.0), (4, 0.25, 20.0)], 2.5)
    other, _ = _run({"0": 8}, [(0, 0.0, 0.0), (4, 0.5, 20.0)], 2.5)
    runs = [sync.run_measures(s, records, target=0.9) for s in (summary, other)]
    config = sync.aggregate({"Colocated": runs}, 0.9)["configs"]["Colocated"]
    assert config["finalHeldoutAccuracy"]["ci95"] == (0.0, 1.0)
    assert config["trainingSeconds"]["ci95"] is not None  # not a fraction: left as it is


def test_each_configuration_says_whether_its_final_accuracy_is_inside_colocateds_interval() -> None:
    def runs(accuracies: list[float]) -> list[dict[str, Any]]:
        out = []
        for acc in accuracies:
            summary, records = _run({"0": 8}, [(0, 0.0, 0.0), (4, acc, 20.0)], 2.5)
            out.append(sync.run_measures(summary, records, target=0.9))
        return out

    # Colocated 0.40, 0.45, 0.50: mean 0.45, t-interval 0.45 ± 4.303 · 0.05/√3 = [0.326, 0.574].
    results = sync.aggregate(
        {"Colocated": runs([0.40, 0.45, 0.50]), "Async:1": runs([0.5, 0.55, 0.6]),
         "Async:2": runs([0.55, 0.6, 0.65])},
        0.9,
    )  # fmt: skip
    inside = {name: c["finalAccuracyInsideColocatedCI"] for name, c in results["configs"].items()}
    assert inside == {"Colocated": True, "Async:1": True, "Async:2": False}
    assert (
        sync.aggregate({"Async:1": runs([0.5, 0.6])}, 0.9)["configs"]["Async:1"][
            "finalAccuracyInsideColocatedCI"
        ]
        is None
    )  # no Colocated runs to compare with


def test_worker_busy_and_snapshot_traffic_by_hand() -> None:
    summary, records = _run({"0": 8}, [(0, 0.0, 0.0), (4, 0.6, 20.0)], 2.5)
    summary["workerTiming"] = {
        "a": {"loadSeconds": 1.0, "sampleSeconds": 15.0, "wallSeconds": 20.0},
        "b": {"loadSeconds": 1.0, "sampleSeconds": 5.0, "wallSeconds": 20.0},
    }
    m = sync.run_measures(summary, records, target=0.5, traffic={"loads": 6, "bytes": 3_000_000.0})
    assert m["workerBusyFraction"] == pytest.approx(20.0 / 40.0)
    assert (m["snapshotLoads"], m["snapshotMegabytes"]) == (6, pytest.approx(3.0))
    summary["workerTiming"] = {}  # Colocated: no workers, nothing moved
    colocated = sync.run_measures(summary, records, target=0.5)
    assert colocated["workerBusyFraction"] is None
    assert (colocated["snapshotLoads"], colocated["snapshotMegabytes"]) == (0, 0.0)
    table = sync.markdown_table(sync.aggregate({"Colocated": [colocated], "Async:1": [m]}, 0.5))
    assert "| worker busy |" in table and "| MB moved |" in table


def test_snapshot_traffic_reads_loads_and_the_stored_bytes_of_each_version(tmp_path: Path) -> None:
    from echo_runtime.snapshots import open_store

    store_dir, run_dir = tmp_path / "store", tmp_path / "run"
    store = open_store(spec.Storage(type="Local", path=str(store_dir)), "job-a")
    sizes = {1: 1000, 2: 3000, 3: 5000}
    for version, size in sizes.items():
        (tmp_path / "w.bin").write_bytes(b"x" * size)
        store.publish(version, tmp_path / "w.bin", kind="lora", base_model="m")
    (run_dir / "workers").mkdir(parents=True)
    (run_dir / "job.yaml").write_text("kind: EchoJob\nmetadata:\n  name: job-a\n")
    lines = [{"event": "sample", "version": 0}, {"event": "load", "version": 1},
             {"event": "load", "version": 3}]  # fmt: skip
    (run_dir / "workers" / "w0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run_dir / "workers" / "w1.jsonl").write_text(json.dumps({"event": "load", "version": 9}) + "\n")
    traffic = sync_run.snapshot_traffic(run_dir, store_dir)
    # Version 9 is not in the store (collected): it counts as the median of the held ones (3000).
    assert traffic == {"loads": 3, "bytes": float(1000 + 5000 + 3000)}
    assert sync_run.snapshot_traffic(tmp_path / "elsewhere", store_dir) == {"loads": 0, "bytes": 0.0}


def test_aggregate_speedups_and_censoring() -> None:
    fast = [
        sync.run_measures(*_run({"0": 4, "2": 4}, [(0, 0.0, 0.0), (4, 0.6, t)], 1.0), target=0.5)
        for t in (10.0, 12.0, 14.0)
    ]
    slow = [
        sync.run_measures(*_run({"0": 8}, [(0, 0.0, 0.0), (4, acc, t)], 4.0), target=0.5)
        for acc, t in ((0.6, 24.0), (0.6, 24.0), (0.3, 30.0))
    ]
    results = sync.aggregate({"Colocated": slow, "Async:2": fast}, target=0.5)
    colocated, async2 = results["configs"]["Colocated"], results["configs"]["Async:2"]
    assert colocated["reachedTarget"] == 2 and colocated["timeToTargetSeconds"]["n"] == 2
    assert colocated["timeToTargetSeconds"]["mean"] == pytest.approx(24.0)
    t2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # t₀.₉₇₅,₂
    assert async2["timeToTargetSeconds"]["ci95"] == pytest.approx(
        (12 - t2 * 2 / math.sqrt(3), 12 + t2 * 2 / math.sqrt(3))
    )
    assert async2["speedupVsColocated"]["timeToTarget"]["ratio"] == pytest.approx(24.0 / 12.0)
    assert colocated["speedupVsColocated"]["timeToTarget"]["ratio"] == pytest.approx(1.0)
    assert async2["stalenessHistogram"] == {"0": 12, "2": 12}
    band = async2["accuracyBand"]
    assert band["time"][0] == 0.0 and band["time"][-1] == pytest.approx(10.0)
    assert band["mean"][-1] == pytest.approx(0.2)  # at t=10 s only the first seed has published 0.6
    table = sync.markdown_table(results)
    assert "| Async:2 | 3 |" in table and "2/3" in table and "2.00×" in table


def test_offload_bound_and_the_fraction_of_it_each_configuration_reaches() -> None:
    """Colocated: 3 s generating + 1 s training per step, one after the other on the trainer's core, so
    moving generation to an added core can at best make a step max(3, 1) = 3 s: bound 4/3."""

    def colocated(seconds: float) -> dict[str, Any]:
        summary, records = _run({"0": 8}, [(0, 0.0, 0.0), (4, 0.6, 4 * seconds)], 1.0)
        records = [{**r, "time": seconds * (i + 1), "sampleSeconds": 3.0} for i, r in enumerate(records)]
        return sync.run_measures(summary, records, target=0.5)

    def decoupled(seconds: float) -> dict[str, Any]:
        summary, records = _run({"1": 8}, [(0, 0.0, 0.0), (4, 0.6, 4 * seconds)], 1.0)
        summary["workerTiming"] = {"cpu-0": {"loadSeconds": 0.1, "sampleSeconds": 12.4, "wallSeconds": 13.0}}
        records = [{**r, "time": seconds * (i + 1)} for i, r in enumerate(records)]
        return sync.run_measures(summary, records, target=0.5)

    base = [colocated(4.0), colocated(4.0)]
    fast = [decoupled(3.2), decoupled(3.2)]
    assert (base[0]["generateSecondsPerStep"], base[0]["trainSecondsPerStep"], base[0]["secondsPerStep"]) == (
        3.0,
        1.0,
        4.0,
    )
    assert fast[0]["generateSecondsPerStep"] == pytest.approx(12.4 / 4)  # the workers' sampling seconds
    results = sync.aggregate({"Colocated": base, "Async:1": fast}, target=0.5, framing="offload")
    assert results["bound"]["bound"] == pytest.approx(4 / 3)
    async1 = results["configs"]["Async:1"]
    assert async1["speedupVsColocated"]["secondsPerStep"]["ratio"] == pytest.approx(4.0 / 3.2)
    assert async1["offloadBoundFraction"]["ratio"] == pytest.approx((4.0 / 3.2) / (4 / 3))  # 0.9375
    assert base[0]["steadySecondsPerStep"] == pytest.approx(4.0)  # steps at 4, 8, 12, 16 s
    assert fast[0]["steadyTrainerBusyFraction"] == pytest.approx(3 * 1.0 / (3 * 3.2))
    assert async1["steadyOffloadBoundFraction"]["ratio"] == pytest.approx((4.0 / 3.2) / (4 / 3))
    text = sync.bound_text(results)
    assert (
        "**1.33×**" in text
        and "| Async:1 | 3.20 [3.20, 3.20] | 1.25× [1.25, 1.25] | 0.94 [0.94, 0.94] |" in text
        and "| 3.20 [3.20, 3.20] | 1.25× [1.25, 1.25] | 0.94 [0.94, 0.94] | 31.2 [31.2, 31.2] % |" in text
    )
    equal = sync.aggregate({"Colocated": base, "Async:1": fast}, target=0.5, framing="equal")
    assert equal["bound"]["bound"] == 1.0 and equal["configs"]["Async:1"]["offloadBoundFraction"] is None


@pytest.mark.parametrize(
    ("framing", "config", "flags"),
    [
        ("equal", "Colocated", ["--cores", "2"]),
        ("equal", "Async:1", ["--cores", "2"]),
        ("offload", "Colocated", ["--cores", "1", "--pin-cores"]),
        ("offload", "Sequential", ["--cores", "2", "--pin-cores"]),
        ("offload", "Async:1", ["--cores", "2", "--pin-cores"]),
    ],
)
def test_each_framing_gives_each_run_its_cpus(framing: str, config: str, flags: list[str]) -> None:
    options = sync_run.Options(
        job=Path("job.yaml"), out=Path("out"), configs=(), seeds=1, max_steps=None, target_accuracy=None,
        cores=2, framing=framing,
    )  # fmt: skip
    (parsed,) = sync_run.parse_configs(config)
    assert sync_run.run_cores(options, parsed) == flags


def test_parse_configs() -> None:
    configs = sync_run.parse_configs("Colocated, Sequential,Async:0,Async:8")
    assert [c.name for c in configs] == ["Colocated", "Sequential", "Async:0", "Async:8"]
    assert [c.slug for c in configs] == ["colocated", "sequential", "async0", "async8"]
    for bad in ("Async", "async:1", "Async:-1", "", "Colocated,Colocated"):
        with pytest.raises(ValueError):
            sync_run.parse_configs(bad)


@pytest.mark.parametrize("config", ["Colocated", "Sequential", "Async:4"])
def test_manifests_change_only_the_grid_fields(tmp_path: Path, config: str) -> None:
    base = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": "quickstart"},
        "spec": {
            "model": {"path": "echorl:tiny", "warmupSteps": 200},
            "syncPolicy": {"mode": "Async", "maxStaleness": 2, "bufferSize": 8, "refreshThreshold": 1},
        },
    }
    (parsed,) = sync_run.parse_configs(config)
    doc = sync_run.manifest_for(base, parsed, 2, tmp_path / "store", {"task": {"heldoutSize": 8}})
    job = spec.resolve(spec.EchoJob.model_validate(doc))
    assert job.name == f"quickstart-{parsed.slug}-s2"
    assert job.sync_policy.mode == parsed.mode and job.sync_policy.max_staleness == parsed.max_staleness
    assert job.spec.algorithm.seed == 2 and job.spec.model.warmup_steps == 200
    assert job.spec.task.heldout_size == 8
    assert job.spec.storage.path == str(tmp_path / "store")
    assert base["spec"]["syncPolicy"]["mode"] == "Async"  # the base is not modified


def test_colocated_forbids_async_fields() -> None:
    spec.SyncPolicySpec.model_validate({"mode": "Colocated", "maxStaleness": 0})
    with pytest.raises(ValueError, match="bufferSize"):
        spec.SyncPolicySpec.model_validate({"mode": "Colocated", "bufferSize": 4})
    with pytest.raises(ValueError, match="refreshThreshold"):
        spec.SyncPolicySpec.model_validate({"mode": "Colocated", "maxStaleness": 2, "refreshThreshold": 1})
