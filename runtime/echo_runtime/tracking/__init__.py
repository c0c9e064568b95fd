"""Experiment trackers: TensorBoard, MLflow, W&B and trackio, TRL's ``report_to`` convention.

``echorl run --report-to tensorboard,mlflow`` (or ``spec.trainingSwarm.tracking.reportTo``) sends
what ``metrics.jsonl`` holds — every trainer record, the coordinator's status once per version, each
held-out evaluation — to the trackers named, against the policy version and the wall-clock, with
tables of sample completions and the run's configuration as parameters. Locally ``echorl run``
reports (it sees the evaluations too); in a cluster the trainer's rank 0 does, with the
coordinator's status beside its own records. See docs/tracking.md.
"""

from __future__ import annotations

import importlib.metadata
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from echo_runtime.spec.swarms import TRACKERS
from echo_runtime.tracking.backends import RunInfo
from echo_runtime.tracking.reporter import Reporter

RUN_ID_ENV = "ECHORL_TRACKING_RUN_ID"
"""Set by the operator on the trainer pod (the EchoJob's uid), so a restarted trainer reports to the
same tracker run."""
POD_DIR = "/tmp/echorl-tracking"
"""Where the trainer pod's file-based trackers write unless ``tracking.dir`` says otherwise."""

__all__ = [
    "POD_DIR",
    "RUN_ID_ENV",
    "TRACKERS",
    "Reporter",
    "RunInfo",
    "parse_report_to",
    "run_config",
    "samples",
]


def parse_report_to(value: str | Sequence[str] | None) -> list[str]:
    """``"tensorboard,mlflow"`` (or a list) → the trackers, in order, each once; ``none`` or empty →
    ``[]``, ``all`` → the four. Anything else is a ValueError naming what is allowed."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [item.strip().lower() for item in items if item.strip()]
    if names in ([], ["none"]):
        return []
    if names == ["all"]:
        return list(TRACKERS)
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or "none" in names or "all" in names:
        bad = ", ".join(unknown) or "none/all mixed with trackers"
        raise ValueError(
            f"report-to: {bad} not allowed; use any of {', '.join(TRACKERS)} (comma-separated), all, or none"
        )
    return list(dict.fromkeys(names))


def version() -> str:
    try:
        return importlib.metadata.version("echorl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def run_config(job: Any) -> dict[str, Any]:
    """The configuration the trackers record as parameters: the job's resolved spec, its name and
    Echo's version (``job`` is a :class:`~echo_runtime.spec.load.ResolvedJob`)."""
    spec: dict[str, Any] = job.spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    spec["trainingSwarm"] = job.training_swarm.model_dump(by_alias=True, mode="json", exclude_none=True)
    spec["syncPolicy"] = job.sync_policy.model_dump(by_alias=True, mode="json", exclude_none=True)
    spec.pop("trainingSwarmRef", None)
    spec.pop("syncPolicyRef", None)
    return {"job": job.name, "echorlVersion": version(), "spec": spec}


def new_run_id(job_name: str) -> str:
    """A tracker run id for a new run of ``job_name``: the job's name and 8 random hex digits."""
    return f"{job_name}-{secrets.token_hex(4)}"


def run_id_file(directory: Path, job_name: str) -> str:
    """The run's tracker run id kept in ``directory/run-id`` (made on the first call), so that
    ``echorl run --resume`` reports to the same tracker runs."""
    path = directory / "run-id"
    if path.exists():
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text
    directory.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id(job_name)
    path.write_text(run_id + "\n", encoding="utf-8")
    return run_id


def pod_run_id(job_name: str, environ: Mapping[str, str] = os.environ) -> str:
    """The trainer pod's tracker run id: :data:`RUN_ID_ENV` (the operator sets it), else a new one."""
    return environ.get(RUN_ID_ENV) or new_run_id(job_name)


def samples(groups: Sequence[Any], count: int) -> list[dict[str, Any]]:
    """Sample completions for a trainer record: the first rollout of each of the first ``count`` groups
    of a batch (:class:`echo_runtime.coordinator.wire.GroupOut`), with its prompt as text (a chat
    prompt: its messages, one ``role: content`` line each)."""
    out = []
    for group in groups[:count]:
        if not group.rollouts:
            continue
        first = group.rollouts[0]
        prompt = group.prompt
        text = prompt if isinstance(prompt, str) else "\n".join(f"{m.role}: {m.content}" for m in prompt)
        out.append(
            {
                "prompt": text,
                "completion": first.completion,
                "reward": first.reward,
                "worker": group.worker_id,
                "staleness": group.staleness,
            }
        )
    return out
