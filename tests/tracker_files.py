"""Reading back what the experiment trackers wrote, each with its own library's reader where it has one.

* TensorBoard: ``EventAccumulator`` (TensorBoard's own event reader).
* MLflow: ``MlflowClient`` on the file store.
* W&B: an offline run's ``.wandb`` file has no reader in the ``wandb`` package any more (its Go core
  reads it); it is parsed here — W&B's framing (a 7-byte header, then LevelDB-style records in 32 KiB
  blocks) around ``wandb_internal_pb2.Record`` protos, from ``wandb``'s own proto module.
* trackio: ``SQLiteStorage.get_logs`` in a child process, because trackio reads ``TRACKIO_DIR`` once,
  when it is first imported.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

Series = dict[str, list[tuple[int, float]]]


def tensorboard_scalars(logdir: Path) -> Series:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tensorboard_texts(logdir: Path) -> dict[str, list[tuple[int, str]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    out: dict[str, list[tuple[int, str]]] = {}
    for tag in acc.Tags()["tensors"]:
        for event in acc.Tensors(tag):
            value = tensor_util.make_ndarray(event.tensor_proto).reshape(-1)[0]
            out.setdefault(tag, []).append(
                (event.step, value.decode() if isinstance(value, bytes) else str(value))
            )
    return out


def mlflow_run(uri: str, experiment: str) -> tuple[Any, Any]:
    """The client and the only run of ``experiment``."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} in {uri}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, f"expected one run, found {len(runs)}"
    return client, runs[0]


def mlflow_series(client: Any, run: Any, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


_BLOCK = 32768
_HEADER = 7


def wandb_records(run_dir: Path) -> list[Any]:
    """Every record of the offline run in ``run_dir`` (``.../wandb/offline-run-*``), parsed."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    chunks: list[bytes] = []
    partial = b""
    pos = _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        pos += _HEADER
        if length == 0 and kind == 0:
            break
        chunk = data[pos : pos + length]
        pos += length
        if kind == 1:  # full
            chunks.append(chunk)
        elif kind == 2:  # first
            partial = chunk
        elif kind == 3:  # middle
            partial += chunk
        elif kind == 4:  # last
            chunks.append(partial + chunk)
    records = []
    for chunk in chunks:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        records.append(record)
    return records


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The rows ``run.log`` wrote, as dicts."""
    rows = []
    for record in wandb_records(run_dir):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def wandb_config(run_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        updates = (
            record.config.update if kind == "config" else record.run.config.update if kind == "run" else []
        )
        for item in updates:
            config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config


_TRACKIO_READ = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
project = sys.argv[1]
out = {run: SQLiteStorage.get_logs(project, run) for run in SQLiteStorage.get_runs(project)}
out = {"logs": out, "config": {run: SQLiteStorage.get_run_config(project, run) for run in out}}
print(json.dumps(out, default=str))
"""


def trackio_logs(trackio_dir: Path, project: str) -> dict[str, Any]:
    """``{"logs": {run: [row, ...]}, "config": {run: {...}}}`` from trackio's own storage API."""
    done = subprocess.run(
        [sys.executable, "-c", _TRACKIO_READ, project],
        env={**os.environ, "TRACKIO_DIR": str(trackio_dir)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
