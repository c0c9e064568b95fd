"""``echorl run job.yaml``: the embedded default — the whole job as local processes."""

from __future__ import annotations

import json
from pathlib import Path

import click

from echo_runtime import spec


@click.command()
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where metrics, plots and logs go (default: runs/<job name>).",
)
@click.option("--resume", is_flag=True, help="Continue a previous run of this job from its last checkpoint.")
@click.option(
    "--fresh", is_flag=True, help="Delete a previous run of this job (and its local snapshots) first."
)
@click.option(
    "--max-steps", type=click.IntRange(min=1), default=None, help="Override spec.algorithm.maxSteps."
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=None,
    help="Override spec.algorithm.seed (prompt order, sampling, LoRA initialisation).",
)
@click.option(
    "--target-accuracy",
    type=click.FloatRange(0, 1),
    default=None,
    help="Report the wall-clock and steps to reach this held-out accuracy.",
)
@click.option(
    "--cores", type=click.IntRange(min=1), default=None, help="CPU cores to divide among the processes."
)
@click.option(
    "--pin-cores",
    is_flag=True,
    help="Pin each process to its own CPUs (trainer, workers; the evaluator to the CPUs the trainer does "
    "not use), not only size its threads: the offload framing of `echorl bench sync`.",
)
@click.option(
    "--report-to",
    default=None,
    metavar="TRACKERS",
    help="Experiment trackers to report to: any of tensorboard, mlflow, wandb, trackio "
    "(comma-separated), all, or none (default: spec.trainingSwarm.tracking.reportTo). "
    "Files go under <run dir>/tracking unless tracking.dir says otherwise.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar (logs only).")
def run(
    job_file: Path,
    run_dir: Path | None,
    resume: bool,
    fresh: bool,
    max_steps: int | None,
    seed: int | None,
    target_accuracy: float | None,
    cores: int | None,
    pin_cores: bool,
    report_to: str | None,
    no_progress: bool,
) -> None:
    """Run an EchoJob locally: coordinator, inference workers, trainer and evaluator as processes.

    Prints live progress (policy version, reward, held-out accuracy, rollouts/s, staleness, ETA);
    writes runs/<job>/metrics.jsonl, summary.json and PNG plots; Ctrl-C stops every process.
    """
    from echo_runtime import tracking
    from echo_runtime.runner import local, session

    if resume and fresh:
        raise click.UsageError("--resume and --fresh exclude each other")
    try:
        trackers = tracking.parse_report_to(report_to) if report_to is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--report-to") from exc
    options = local.RunOptions(
        run_dir=run_dir,
        resume=resume,
        fresh=fresh,
        max_steps=max_steps,
        seed=seed,
        target_accuracy=target_accuracy,
        progress=not no_progress,
        cores=cores,
        pin_cores=pin_cores,
        report_to=trackers,
    )
    try:
        summary = session.run(job_file, options, echo=click.echo)
    except spec.ManifestError as exc:
        raise click.ClickException(str(exc)) from exc
    except local.RunError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt as exc:  # Ctrl-C → 130; SIGTERM (session.Terminated) → 143
        raise SystemExit(128 + int(getattr(exc, "signum", 2))) from None
    keys = (
        "policyVersion",
        "initialHeldoutAccuracy",
        "finalHeldoutAccuracy",
        "bestHeldoutAccuracy",
        "wallClockSeconds",
        "maxObservedStaleness",
        "droppedStale",
        "filteredGroups",
        "rolloutsPerSecond",
        "trainerBusyFraction",
    )
    click.echo(json.dumps({k: summary.get(k) for k in keys}, indent=2))
    for message in summary.get("warnings") or []:
        click.echo(f"warning: {message}", err=True)
    click.echo(f"summary, metrics and plots in {run_dir or Path('runs') / summary['job']}")
