"""The four trackers behind one small interface: open, log a point, log parameters, close.

Each imports its library when it opens (the extras ``echorl[tensorboard]``, ``[mlflow]``, ``[wandb]``,
``[trackio]``), so Echo runs without any of them. Where each one writes, unless the user's own
environment says otherwise:

* ``tensorboard`` — event files under ``<dir>/tensorboard/<run name>`` (``tensorboard --logdir``);
  written with TensorBoard's own event writer and protos, no TensorFlow and no torch.
* ``mlflow`` — ``MLFLOW_TRACKING_URI`` if set (a server, a database), else MLflow's file store
  ``<dir>/mlruns`` (MLflow keeps that backend in maintenance mode; Echo opts in for it with
  ``MLFLOW_ALLOW_FILE_STORE``). Experiment = the project; one run per tracking run id, found again by
  its tag when a run resumes.
* ``wandb`` — ``WANDB_MODE`` if set, else online when ``WANDB_API_KEY`` is set and offline otherwise
  (files under ``<dir>/wandb``, uploaded later with ``wandb sync``). The run id is the tracking run
  id, resumed when it exists.
* ``trackio`` — its local database under ``TRACKIO_DIR`` if set, else ``<dir>/trackio``
  (``trackio show --project <project>``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from echo_runtime.tracking.records import Point, Table, params

_log = logging.getLogger(__name__)
EXTRA_HINT = "pip install 'echorl[{name}]'"


class NotInstalled(RuntimeError):
    """The tracker's library is missing: nothing to retry."""


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What every tracker is told about the run."""

    project: str
    name: str
    run_id: str
    """Stable over restarts of the same run (``echorl run --resume``, a trainer pod restarted)."""
    dir: Path
    config: Mapping[str, Any]
    """The run's configuration (the job's spec, Echo's version): parameters / config."""


class Tracker(Protocol):
    name: str

    def open(self, run: RunInfo) -> None: ...

    def log(self, point: Point) -> None: ...

    def close(self) -> None: ...


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise NotInstalled(
            f"the {extra} tracker needs {module!r}, which is not installed ({EXTRA_HINT.format(name=extra)})"
        ) from exc


def _table_markdown(table: Table) -> str:
    def cell(value: Any) -> str:
        text = "" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.rows]
    return "\n".join(lines)


class TensorBoard:
    name = "tensorboard"

    def open(self, run: RunInfo) -> None:
        _require("tensorboard", "tensorboard")
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir = run.dir / "tensorboard" / run.name
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.writer = EventFileWriter(str(self.logdir), flush_secs=10)
        config = json.dumps(dict(run.config), indent=2, sort_keys=True, default=str)
        self._text("config", f"```\n{config}\n```", 0, time.time())

    def _text(self, tag: str, markdown: str, step: int, wall: float) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.text import metadata
        from tensorboard.util import tensor_util

        value = summary_pb2.Summary.Value(
            tag=tag,
            metadata=metadata.create_summary_metadata(display_name=tag, description=""),
            tensor=tensor_util.make_tensor_proto([markdown]),
        )
        self.writer.add_event(
            event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(value=[value]))
        )

    def log(self, point: Point) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in point.scalars.items()]
        if values:
            summary = summary_pb2.Summary(value=values)
            self.writer.add_event(
                event_pb2.Event(wall_time=point.unix_time, step=point.version, summary=summary)
            )
        for table in point.tables:
            self._text(table.name, _table_markdown(table), point.version, point.unix_time)

    def close(self) -> None:
        self.writer.close()


class MLflow:
    name = "mlflow"

    def open(self, run: RunInfo) -> None:
        _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run.dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(run.project)
        experiment_id = (
            experiment.experiment_id if experiment is not None else self.client.create_experiment(run.project)
        )
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`echorl.runId` = '{run.run_id}'", max_results=1
        )
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            created = self.client.create_run(
                experiment_id, run_name=run.name, tags={"echorl.runId": run.run_id}
            )
            self.run_id = created.info.run_id
            self._params(run.config)

    def _params(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        flat = [Param(k[:250], v[:6000]) for k, v in params(config).items()]
        for i in range(0, len(flat), 100):  # MLflow takes at most 100 parameters a call
            self.client.log_batch(self.run_id, params=flat[i : i + 100])

    def log(self, point: Point) -> None:
        from mlflow.entities import Metric

        stamp = int(point.unix_time * 1000)
        metrics = [Metric(k, v, stamp, point.version) for k, v in point.scalars.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        for table in point.tables:
            data = {"columns": list(table.columns), "data": [list(row) for row in table.rows]}
            self.client.log_dict(self.run_id, data, f"{table.name}/v{point.version:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandB:
    name = "wandb"

    def open(self, run: RunInfo) -> None:
        wandb = _require("wandb", "wandb")
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        directory = run.dir / "wandb"
        directory.mkdir(parents=True, exist_ok=True)
        self.wandb = wandb
        self.run = wandb.init(
            project=run.project,
            name=run.name,
            id=_wandb_id(run.run_id),
            resume="allow",
            mode=mode,
            dir=str(directory),
            config=dict(run.config),
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, save_code=False),
        )
        self.run.define_metric("policyVersion")
        self.run.define_metric("*", step_metric="policyVersion")

    def log(self, point: Point) -> None:
        data: dict[str, Any] = {"policyVersion": point.version, "wallSeconds": point.seconds, **point.scalars}
        for table in point.tables:
            data[table.name] = self.wandb.Table(
                columns=list(table.columns), data=[list(r) for r in table.rows]
            )
        self.run.log(data)

    def close(self) -> None:
        self.run.finish()


def _wandb_id(run_id: str) -> str:
    """W&B run ids allow letters, digits, ``-`` and ``_``, at most 128 characters."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in run_id)[:128]


class Trackio:
    name = "trackio"

    def open(self, run: RunInfo) -> None:
        # trackio reads its directory once, when first imported.
        wanted = os.environ.get("TRACKIO_DIR") or str((run.dir / "trackio").resolve())
        imported = sys.modules.get("trackio.utils")
        if imported is not None and Path(imported.TRACKIO_DIR) != Path(wanted):
            raise RuntimeError(
                f"trackio was imported before with its directory {imported.TRACKIO_DIR}, not {wanted}; "
                "set TRACKIO_DIR before the run starts"
            )
        os.environ["TRACKIO_DIR"] = wanted
        trackio = _require("trackio", "trackio")
        self.trackio = trackio
        with _quiet():
            self.run = trackio.init(
                project=run.project,
                name=run.run_id,
                config=dict(run.config),
                resume="allow",
                auto_log_cpu=False,
                auto_log_gpu=False,
            )

    def log(self, point: Point) -> None:
        data: dict[str, Any] = {"wallSeconds": point.seconds, **point.scalars}
        for table in point.tables:
            data[table.name] = self.trackio.Table(
                columns=list(table.columns), data=[list(r) for r in table.rows]
            )
        self.run.log(data, step=point.version)

    def close(self) -> None:
        with _quiet():
            self.run.finish()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """trackio prints a banner to stdout when a run starts and ends, into ``echorl run``'s progress
    output: keep it for the log at debug level. (Process-wide while it lasts: a few milliseconds.)"""
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        yield
    if captured.getvalue().strip():
        _log.debug("trackio: %s", captured.getvalue().strip())


FACTORIES: dict[str, type[Tracker]] = {
    "tensorboard": TensorBoard,
    "mlflow": MLflow,
    "wandb": WandB,
    "trackio": Trackio,
}
