"""The four trackers for real: records go in through the reporter, and each tracker's files are read
back with its own library (tests/tracker_files.py) and compared with the records that went in.

The reporter runs in a child process, as in a run: trackio and MLflow read their environment once.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tracker_files

DESTINATIONS = {"MLFLOW_TRACKING_URI", "WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "TRACKIO_DIR"}
"""Where the trackers would write, if the caller's environment said: left out, so they write to the
run's own directory (the telemetry switches of tests/conftest.py stay)."""

T0 = 1_790_000_000.0
WRITE = """
import json, sys
from pathlib import Path
from echo_runtime import tracking
names, directory, records = sys.argv[1].split(","), Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text())
warnings = []
run = tracking.RunInfo(project="echo-tests", name="tiny-run", run_id="tiny-run-0001", dir=directory,
                       config={"job": "tiny-run", "spec": {"algorithm": {"learningRate": 0.0002, "groupSize": 4}}})
reporter = tracking.Reporter(names, run, t0=float(sys.argv[4]), warn=warnings.append)
for record in records:
    reporter.log(record)
reporter.close()
print(json.dumps({"warnings": warnings, "active": reporter.active()}))
"""


def records() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in range(1, 6):
        out.append(
            {"kind": "status", "policyVersion": v - 1, "time": 2.0 * v, "reward": 0.1 * v,
             "rolloutsPerSecond": 1.0 + v, "stalenessHistogram": {"0": v, "1": 2 * v},
             "workers": [{"id": "w-1", "rolloutsPerSecond": 0.5 * v}]}
        )  # fmt: skip
        trainer: dict[str, Any] = {
            "kind": "trainer", "policyVersion": v, "time": 2.0 * v + 1, "unixTime": T0 + 2.0 * v + 1,
            "loss": 0.5 - 0.1 * v, "kl": 0.01 * v, "entropy": 1.5, "stepSeconds": 1.0, "rewardMean": 0.2 * v,
            "logprobMismatch": {"transformers": {"meanAbs": 1e-7 * v}},
        }  # fmt: skip
        if v % 2 == 0:
            trainer["samples"] = [
                {
                    "prompt": f"What is {v} + 1?",
                    "completion": str(v + 1),
                    "reward": 1.0,
                    "worker": "w-1",
                    "staleness": 0,
                }
            ]
        out.append(trainer)
    out.append(
        {"kind": "eval", "policyVersion": 5, "time": 12.0, "heldoutAccuracy": 0.625, "heldoutReward": 0.7,
         "examples": [["What is 2 + 2?", "4", 1.0]]}
    )  # fmt: skip
    return out


def write(tmp_path: Path, names: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    path = tmp_path / "records.json"
    path.write_text(json.dumps(records()))
    clean = {k: v for k, v in os.environ.items() if k not in DESTINATIONS}
    done = subprocess.run(
        [sys.executable, "-c", WRITE, names, str(tmp_path / "tracking"), str(path), repr(T0)],
        env={**clean, **(env or {})}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def expected(kind: str, field: str) -> list[tuple[int, float]]:
    return [(r["policyVersion"], r[field]) for r in records() if r["kind"] == kind]


def same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    """The same versions, and values equal to float32 precision (TensorBoard keeps float32)."""
    return [s for s, _ in got] == [s for s, _ in want] and [v for _, v in got] == pytest.approx(
        [v for _, v in want], rel=1e-6, abs=1e-7
    )


def test_every_tracker_holds_what_went_in(tmp_path: Path) -> None:
    result = write(tmp_path, "tensorboard,mlflow,wandb,trackio")
    assert result == {"warnings": [], "active": ["tensorboard", "mlflow", "wandb", "trackio"]}
    base = tmp_path / "tracking"

    # TensorBoard, through its own event reader.
    logdir = base / "tensorboard" / "tiny-run"
    scalars = tracker_files.tensorboard_scalars(logdir)
    assert same(scalars["train/loss"], expected("trainer", "loss"))
    assert same(scalars["coordinator/reward"], expected("status", "reward"))
    assert scalars["eval/heldoutAccuracy"] == [(5, 0.625)]
    assert [v for _, v in scalars["coordinator/stalenessHistogram/1"]] == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert [s for s, _ in scalars["train/busyFraction"]] == [2, 3, 4, 5]  # stepSeconds 1 every 2 s
    assert [v for _, v in scalars["train/busyFraction"]] == pytest.approx([0.5] * 4)
    texts = tracker_files.tensorboard_texts(logdir)
    assert [s for s, _ in texts["samples"]] == [2, 4]
    assert "What is 4 + 1?" in texts["samples"][1][1] and "| 5 |" in texts["samples"][1][1]
    assert '"learningRate": 0.0002' in texts["config"][0][1]
    assert "What is 2 + 2?" in texts["eval/examples"][0][1]

    # MLflow, through its client on the file store.
    client, run = tracker_files.mlflow_run((base / "mlruns").as_uri(), "echo-tests")
    assert run.info.run_name == "tiny-run" and run.data.tags["echorl.runId"] == "tiny-run-0001"
    assert run.info.status == "FINISHED"
    assert same(tracker_files.mlflow_series(client, run, "train/loss"), expected("trainer", "loss"))
    assert tracker_files.mlflow_series(client, run, "eval/heldoutAccuracy") == [(5, 0.625)]
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.timestamp for m in history) == [int((T0 + 2.0 * v + 1) * 1000) for v in range(1, 6)]
    assert run.data.params["spec.algorithm.learningRate"] == "0.0002"
    artifacts = sorted(a.path for a in client.list_artifacts(run.info.run_id, "samples"))
    assert artifacts == ["samples/v000002.json", "samples/v000004.json"]
    table = json.loads(
        Path(client.download_artifacts(run.info.run_id, "samples/v000004.json", str(tmp_path))).read_text()
    )
    assert table["columns"][:3] == ["policyVersion", "prompt", "completion"]
    assert table["data"] == [[4, "What is 4 + 1?", "5", 1.0, "w-1", 0.0]]

    # W&B offline, its run file parsed.
    (run_dir,) = (base / "wandb" / "wandb").glob("offline-run-*")
    rows = tracker_files.wandb_history(run_dir)
    losses = [(r["policyVersion"], r["train/loss"]) for r in rows if "train/loss" in r]
    assert same(losses, expected("trainer", "loss"))
    assert [(r["policyVersion"], r["eval/heldoutAccuracy"]) for r in rows if "eval/heldoutAccuracy" in r] == [
        (5, 0.625)
    ]
    tables = [r for r in rows if r.get("samples/_type") == "table-file"]
    assert [(r["policyVersion"], r["samples/nrows"]) for r in tables] == [(2, 1), (4, 1)]
    config = tracker_files.wandb_config(run_dir)
    assert config["spec"]["algorithm"]["learningRate"] == 0.0002

    # trackio, through its own storage API.
    got = tracker_files.trackio_logs(base / "trackio", "echo-tests")
    logs = got["logs"]["tiny-run-0001"]
    assert same(
        [(r["step"], r["train/loss"]) for r in logs if "train/loss" in r], expected("trainer", "loss")
    )
    assert [r["step"] for r in logs if "samples" in r] == [2, 4]
    assert got["config"]["tiny-run-0001"]["spec"]["algorithm"]["groupSize"] == 4


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_failing_trackers_are_reported_once_and_the_others_keep_everything(tmp_path: Path) -> None:
    """An MLflow server that is down (a closed loopback port) and a TensorBoard directory that cannot
    be made (its parent is a file): each reported once with its reason; trackio gets every record."""
    (tmp_path / "tracking").mkdir()
    (tmp_path / "tracking" / "tensorboard").write_text("not a directory")
    env = {
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{_closed_port()}",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "2",
    }
    result = write(tmp_path, "tensorboard,mlflow,trackio", env)
    warnings = result["warnings"]
    assert len([w for w in warnings if w.startswith("tracker tensorboard")]) == 1
    assert len([w for w in warnings if w.startswith("tracker mlflow")]) == 1
    assert any("tensorboard" in w and "retrying" in w for w in warnings)
    assert any("mlflow" in w and "127.0.0.1" in w for w in warnings)
    got = tracker_files.trackio_logs(tmp_path / "tracking" / "trackio", "echo-tests")
    logs = got["logs"]["tiny-run-0001"]
    assert [r["step"] for r in logs if "train/loss" in r] == [1, 2, 3, 4, 5]
