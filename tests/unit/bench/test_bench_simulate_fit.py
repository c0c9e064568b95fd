"""Fitting the simulator to measured runs: the pure estimators by hand, then the whole pipeline (files →
fit → prediction → relative errors, and the benchmark script) on synthetic runs whose truth is known."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from bench_synthetic_runs import write_run

from echo_runtime.bench.simulate import SimConfig, TrainerConfig, WorkerClass, fit

REPO = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------------------------- pure estimators
def test_mean_and_cv() -> None:
    assert fit.mean_cv([1.0, 3.0]) == (2.0, 0.5)  # population std 1, mean 2
    assert fit.mean_cv([4.0]) == (4.0, 0.0)
    with pytest.raises(ValueError):
        fit.mean_cv([])


def test_round_overhead_ignores_rounds_that_waited_for_a_retry() -> None:
    # 1.02 s and 1.5 s include a 1 s retry wait after an empty lease; the rest are pure overhead.
    assert fit.round_overhead([0.01, 0.03, 1.02, 0.02, 1.5]) == pytest.approx(0.02)
    assert fit.round_overhead([1.2, 2.0]) == 0.0
    assert fit.round_overhead([]) == 0.0


def test_fit_pool_by_hand() -> None:
    pool = fit.PoolMeasure(
        name="cpu",
        replicas=3,
        capacity=2,
        lease_seconds=(2.0, 4.0, 3.0),
        lease_groups=(1, 2, 1),
        load_seconds=(1.0, 2.0),
        round_residuals=(0.1, 0.3, 0.2),
        joined_at=12.5,
    )
    cls = fit.fit_pool(pool)
    # 9 s for 4 groups; per-group times 2, 2, 3: mean 7/3, population std √(2/9) → cv √2/7.
    assert cls.group_seconds == pytest.approx(9.0 / 4.0)
    assert cls.group_cv == pytest.approx((2.0 / 9.0) ** 0.5 / (7.0 / 3.0))
    assert (cls.apply_seconds, cls.overhead_seconds, cls.start_seconds) == (1.5, pytest.approx(0.2), 12.5)
    assert (cls.count, cls.capacity, cls.batch_scaling) == (3, 2, 1.0)
    with pytest.raises(ValueError, match="pool 'cpu': no sampling events"):
        fit.fit_pool(fit.PoolMeasure("cpu", 1, 1, (), (), (), (), None))


def test_fit_trainer_by_hand() -> None:
    steps = [
        fit.StepMeasure(step_seconds=2.0, publish_seconds=0.5, checkpoint_seconds=0.0, ended_at=30.0),
        fit.StepMeasure(step_seconds=4.0, publish_seconds=0.7, checkpoint_seconds=3.0, ended_at=40.0),
    ]
    trainer = fit.fit_trainer(steps, checkpoint_interval=2)
    assert (trainer.step_seconds, trainer.step_cv) == (3.0, pytest.approx(1.0 / 3.0))
    assert trainer.publish_seconds == pytest.approx(0.6)
    assert (trainer.checkpoint_every, trainer.checkpoint_seconds) == (2, 3.0)
    assert trainer.start_seconds == pytest.approx(30.0 - 2.5)


def test_joined_at_is_the_last_sample_before_the_pool_appears() -> None:
    status = [
        {"time": 1.0, "workers": []},
        {"time": 2.0, "workers": [{"pool": "gpu"}]},
        {"time": 3.0, "workers": [{"pool": "gpu"}, {"pool": "cpu"}]},
    ]
    assert fit._joined_at(status, "gpu") == 1.0
    assert fit._joined_at(status, "cpu") == 2.0
    assert fit._joined_at(status, "mac") is None


def test_relative_errors_and_their_summary() -> None:
    errors = fit.relative_errors(
        {"rolloutsPerSecond": 10.0, "trainerBusyFraction": 0.5},
        {"rolloutsPerSecond": 12.0, "trainerBusyFraction": 0.4},
    )
    assert errors == {"rolloutsPerSecond": pytest.approx(0.2), "trainerBusyFraction": pytest.approx(-0.2)}
    records = [
        {"relativeError": errors, "withinTolerance": True},
        {"relativeError": {"rolloutsPerSecond": -0.1, "trainerBusyFraction": None}, "withinTolerance": False},
    ]
    summary = fit.summarise_errors(records)
    assert summary["runs"] == 2 and summary["withinTolerance"] == 1
    assert summary["rolloutsPerSecond"]["meanAbsRelativeError"] == pytest.approx(0.15)
    assert summary["trainerBusyFraction"]["maxAbsRelativeError"] == pytest.approx(0.2)


# ---------------------------------------------------------------------------------------- whole pipeline
TRUTHS: dict[str, SimConfig] = {
    "async-d0": SimConfig(
        worker_classes=(
            WorkerClass("cpu", 2, 1.2, 0.3, apply_seconds=0.8, overhead_seconds=0.05, start_seconds=15.0),
        ),
        trainer=TrainerConfig(step_seconds=1.5, step_cv=0.2, publish_seconds=0.2, start_seconds=17.0),
        max_staleness=0,
        batch_size=4,
        group_size=8,
        max_steps=40,
        seed=11,
    ),
    "async-d2-two-pools": SimConfig(
        worker_classes=(
            WorkerClass("torch", 1, 0.8, 0.2, apply_seconds=0.5, overhead_seconds=0.03, start_seconds=12.0),
            WorkerClass("mlx", 1, 2.5, 0.3, apply_seconds=1.5, overhead_seconds=0.03, start_seconds=18.0),
        ),
        trainer=TrainerConfig(
            step_seconds=1.0,
            step_cv=0.3,
            publish_seconds=0.3,
            checkpoint_every=10,
            checkpoint_seconds=1.0,
            start_seconds=20.0,
        ),
        max_staleness=2,
        batch_size=4,
        group_size=4,
        max_steps=40,
        seed=12,
    ),
    "sequential": SimConfig(
        worker_classes=(
            WorkerClass("cpu", 2, 1.0, 0.25, apply_seconds=0.7, overhead_seconds=0.02, start_seconds=14.0),
        ),
        trainer=TrainerConfig(step_seconds=1.2, step_cv=0.1, publish_seconds=0.2, start_seconds=16.0),
        mode="Sequential",
        max_staleness=0,
        batch_size=4,
        group_size=8,
        max_steps=30,
        seed=13,
    ),
}


# Workers before the lease long-poll polled every second (and logged no leaseSeconds): still fitted.
TRUTHS["sequential-polling"] = TRUTHS["sequential"].replace(lease_wait=0.0)
# A trainer faster than the retry interval: a long-polling worker's wait for the next round looks like
# per-lease overhead unless its leaseSeconds are taken out (the quickstart's shape: step 0.2 s).
# Each worker leases half a round at once (capacity 2), so nearly every round includes such a wait.
TRUTHS["sequential-fast-trainer"] = TRUTHS["sequential"].replace(
    worker_classes=(
        WorkerClass(
            "cpu", 2, 1.0, 0.25, apply_seconds=0.7, overhead_seconds=0.02, start_seconds=14.0, capacity=2
        ),
    ),
    trainer=TrainerConfig(step_seconds=0.3, step_cv=0.1, publish_seconds=0.05, start_seconds=16.0),
)


@pytest.mark.parametrize("name", sorted(TRUTHS))
def test_a_synthetic_run_is_predicted_within_a_few_percent(tmp_path: Path, name: str) -> None:
    truth = TRUTHS[name]
    write_run(tmp_path / name, truth)
    run = fit.read_run(tmp_path / name)
    assert (run.mode, run.max_staleness, run.batch_size, len(run.steps)) == (
        truth.mode,
        truth.max_staleness,
        truth.batch_size,
        truth.max_steps,
    )
    fitted = fit.fit(run)
    for cls, true in zip(fitted.config.worker_classes, truth.worker_classes, strict=True):
        assert cls.group_seconds == pytest.approx(true.group_seconds, rel=0.15)
        assert cls.overhead_seconds == pytest.approx(true.overhead_seconds, abs=0.01)
        assert cls.start_seconds == pytest.approx(true.start_seconds, abs=1.0)
    assert fitted.config.trainer.step_seconds == pytest.approx(truth.trainer.step_seconds, rel=0.15)
    record = fit.validate(run, seeds=4)
    for key, error in record["relativeError"].items():
        assert error is not None and abs(error) < 0.1, (key, record["measured"], record["predicted"])
    assert record["withinTolerance"]


def test_the_benchmark_script_writes_its_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dirs = []
    for name in ("async-d0", "sequential"):
        write_run(tmp_path / name, TRUTHS[name])
        dirs.append(str(tmp_path / name))
    spec = importlib.util.spec_from_file_location(
        "simulate_validation", REPO / "benchmarks" / "simulate_validation.py"
    )
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "report.json"
    assert module.main([*dirs, "--out", str(out), "--seeds", "2"]) == 0
    report = json.loads(out.read_text())
    assert report["summary"]["runs"] == 2 and report["summary"]["withinTolerance"] == 2
    assert {r["run"] for r in report["runs"]} == {"async-d0", "sequential"}
    assert "2/2 run(s) within ±20%" in capsys.readouterr().out


def test_a_directory_that_is_not_a_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(fit.RunError, match=r"no job\.yaml; is this a run directory"):
        fit.read_run(tmp_path)
