"""``echorl trainer --job job.yaml --coordinator URL --token T [--resume]``: run the GRPO trainer of one job.

Launch it once for a single process, or under torchrun for data parallelism (every rank runs the same
command; rank 0 talks to the coordinator and the snapshot store)::

    torchrun --nproc-per-node 2 -m echo_runtime.cli.trainer --job job.yaml --coordinator URL

The token may come from ``ECHORL_TRAINER_TOKEN`` instead of ``--token`` (keeps it out of ``ps``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import click

from echo_runtime import spec


@click.command()
@click.option(
    "--job",
    "job_path",
    required=True,
    type=click.Path(dir_okay=False, exists=True),
    help="The EchoJob manifest (with any objects it references).",
)
@click.option("--name", default=None, help="Which EchoJob, if the file holds several.")
@click.option(
    "--coordinator", "url", required=True, help="The coordinator's URL, e.g. http://127.0.0.1:8700."
)
@click.option(
    "--token",
    envvar="ECHORL_TRAINER_TOKEN",
    required=True,
    show_envvar=True,
    help="The trainer's join token.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue from the newest published version and checkpoint in the snapshot store.",
)
@click.option(
    "--metrics-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append one JSON record per optimizer step (kind: trainer) to this file.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where fetched snapshots and checkpoints are kept (default: a temporary directory).",
)
@click.option(
    "--max-steps",
    type=click.IntRange(min=0),
    default=None,
    help="Stop at this policy version instead of spec.algorithm.maxSteps.",
)
@click.option(
    "--batch-timeout",
    type=click.FloatRange(min=0.1),
    default=None,
    help="Fail if no batch arrives within this many seconds (default: wait indefinitely).",
)
@click.option(
    "--report-to",
    default=None,
    metavar="TRACKERS",
    help="Experiment trackers rank 0 reports to: any of tensorboard, mlflow, wandb, trackio "
    "(comma-separated), all, or none (default: spec.trainingSwarm.tracking.reportTo).",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
def trainer(
    job_path: str,
    name: str | None,
    url: str,
    token: str,
    resume: bool,
    metrics_file: Path | None,
    cache_dir: Path | None,
    max_steps: int | None,
    batch_timeout: float | None,
    report_to: str | None,
    log_level: str,
) -> None:
    """Run the GRPO trainer: pull batches, take optimizer steps, publish a snapshot after each one."""
    # In a pod the trainer is PID 1, which the kernel shields from every signal it has no handler
    # for: without one, `kubectl delete pod` would wait out the whole grace period. A trainer stopped
    # before maxSteps has not finished: exit 143 (as a shell reports SIGTERM), so its Job counts it
    # failed and the next trainer resumes from the store.
    signal.signal(signal.SIGTERM, _stop)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))  # not every request
    from echo_runtime.runner import allocator

    logging.getLogger("echo_runtime.trainer").info("memory allocator: %s", allocator.in_use())
    try:
        job = spec.load_job(job_path, name)
    except spec.ManifestError as exc:
        raise click.ClickException(str(exc)) from exc
    from echo_runtime import tracking

    try:
        trackers = tracking.parse_report_to(
            report_to if report_to is not None else job.training_swarm.tracking.report_to
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--report-to") from exc

    import torch

    from echo_runtime.coordinator import client as coordinator_client
    from echo_runtime.snapshots import SnapshotError, open_store
    from echo_runtime.trainer import distributed, loop

    swarm = job.training_swarm
    if swarm.threads is not None:
        torch.set_num_threads(swarm.threads)
    # The model is resolved (a built-in one built, a packaged one unpacked) before the process group
    # exists: transformers then writes a model on rank 0 only, and each pod of a multi-node trainer
    # builds into its own cache, so rank 1 would find an empty directory.
    from echo_runtime.models import load as model_load

    model_dir = model_load.resolve_spec(job.spec.model, job.spec.task)
    world = distributed.init_world(swarm.device)
    coordinator = coordinator_client.TrainerClient(url, token) if world.is_main else None
    # Every rank: each uploads and reads its own part of a checkpoint. Only rank 0 publishes versions.
    store = open_store(job.spec.storage, job.name, retention=job.sync_policy.retention)
    reporter = _reporter(job, trackers, url, token) if world.is_main and trackers else None
    options = loop.LoopOptions(
        resume=resume,
        cache_dir=cache_dir,
        metrics_path=metrics_file,
        max_steps=max_steps,
        batch_timeout_s=batch_timeout,
        on_record=reporter.log if reporter is not None else None,
    )
    finished = False
    try:
        result = loop.run(
            job, coordinator=coordinator, store=store, world=world, options=options, model_dir=model_dir
        )
        finished = True
    except (loop.ResumeRefused, coordinator_client.CoordinatorError, SnapshotError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if reporter is not None:
            reporter.close()
        if coordinator is not None:
            coordinator.close()
        distributed.shutdown(world, together=finished)
    if world.is_main:
        click.echo(
            f"trainer: version {result.start_version} → {result.version} "
            f"({result.version - result.start_version} optimizer step(s), rank 0 of {world.world_size}, pid {os.getpid()})"
        )


def _reporter(job: spec.ResolvedJob, trackers: list[str], url: str, token: str) -> Any:
    """Rank 0's experiment trackers: its own records, and after each the coordinator's status (from a
    client of their own, asked from the trackers' thread, so a slow coordinator never holds a step)."""
    import time

    from echo_runtime import tracking
    from echo_runtime.coordinator import client as coordinator_client

    settings = job.training_swarm.tracking
    t0 = time.time()
    status_client = coordinator_client.TrainerClient(
        url, token, timeout=5.0, retry=coordinator_client.RetryPolicy(attempts=1, deadline=5.0)
    )

    def status() -> dict[str, Any]:
        doc = status_client.status().model_dump(by_alias=True, mode="json")
        return {**doc, "kind": "status", "time": time.time() - t0}

    run = tracking.RunInfo(
        project=settings.project,
        name=settings.run_name or job.name,
        run_id=tracking.pod_run_id(job.name),
        dir=Path(settings.dir or tracking.POD_DIR),
        config=tracking.run_config(job),
    )
    logging.getLogger("echorl.trainer").info("reporting to %s (run %s)", ", ".join(trackers), run.run_id)
    return tracking.Reporter(trackers, run, t0=t0, poll=status)


def _stop(signum: int, frame: FrameType | None) -> None:
    logging.getLogger("echorl.trainer").warning("signal %d: stopping before maxSteps", signum)
    sys.exit(128 + signum)


if __name__ == "__main__":  # torchrun -m echo_runtime.cli.trainer ...
    trainer()
