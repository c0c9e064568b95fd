"""``echorl bench``: benchmarks of Echo's parts. ``fidelity`` — how faithfully each inference backend
reports the behaviour log-probs the trainer recomputes, and whether two backends sample the same policy
alike (:mod:`echo_runtime.bench.fidelity_run`). ``sync`` — Colocated vs Sequential vs Async at several
Δmax, over seeds, on one task, model and CPU budget (:mod:`echo_runtime.bench.sync_run`).
"""

from __future__ import annotations

import json
from pathlib import Path

import click


def _need_scipy() -> None:
    """The benchmarks' statistics are scipy's, an optional dependency (the ``bench`` extra)."""
    try:
        import scipy.stats  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(
            "echorl bench needs scipy for its statistics: pip install 'echorl[bench]'"
        ) from exc


@click.group()
def bench() -> None:
    """Benchmarks: backend fidelity, sync modes."""


@bench.command()
@click.option(
    "--model", default="echorl:tiny", show_default=True, help="Model path, hub id or echorl:<size>."
)
@click.option(
    "--backends",
    "backend_list",
    default="transformers,mlx",
    show_default=True,
    metavar="LIST",
    help="Comma-separated backends, each NAME[:DEVICE]: transformers, transformers:cuda, mlx, vllm.",
)
@click.option(
    "--warmup-steps",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Warm a built-in model up on the task first (cached), so that rewards vary.",
)
@click.option("--prompts", type=click.IntRange(min=1), default=64, show_default=True, help="Task prompts.")
@click.option(
    "--n", "n", type=click.IntRange(min=1), default=4, show_default=True, help="Samples per prompt."
)
@click.option("--task", default="arithmetic", show_default=True, help="Task whose held-out prompts are used.")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=1.0, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option(
    "--snapshot",
    type=click.Choice(["lora", "none"]),
    default="lora",
    show_default=True,
    help="lora: compare at policy version 1, a random adapter the trainer exports; none: the base model.",
)
@click.option(
    "--lora-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=0.03,
    show_default=True,
    help="Standard deviation of the random LoRA weights of version 1.",
)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="CPU threads.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the report as JSON.")
def fidelity(
    model: str,
    warmup_steps: int,
    backend_list: str,
    prompts: int,
    n: int,
    task: str,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    snapshot: str,
    lora_scale: float,
    threads: int,
    seed: int,
    out: Path | None,
) -> None:
    """Behaviour vs. recomputed log-probs per backend, and two-sample tests between backends."""
    _need_scipy()
    from echo_runtime.bench import fidelity_run

    try:
        choices = fidelity_run.parse_backends(backend_list)
        options = fidelity_run.Options(
            model=model,
            warmup_steps=warmup_steps,
            backends=tuple(choices),
            prompts=prompts,
            n=n,
            task=task,
            seed=seed,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            snapshot=snapshot,
            lora_scale=lora_scale,
            threads=threads,
        )
        report = fidelity_run.run(options, log=lambda line: click.echo(line, err=True))
    except (ValueError, RuntimeError, ImportError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(fidelity_run.table(report))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, sort_keys=True))
        click.echo(f"report: {out}")


QUICK_OVERRIDES = {
    "task": {"heldoutSize": 32, "evalEvery": 2},
    "algorithm": {"batchSize": 4, "groupSize": 4},
}
"""The ``--quick`` preset's smaller task (with Colocated, Sequential, Async:2 × 2 seeds × 6 steps)."""


@bench.command()
@click.option(
    "--job",
    "job_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=Path("examples/quickstart.yaml"),
    show_default=True,
    help="The manifest every run starts from.",
)
@click.option(
    "--configs",
    default=None,
    metavar="LIST",
    help="Comma-separated: Colocated, Sequential, Async:<Δmax>. "
    "[default: Colocated,Sequential,Async:0,Async:1,Async:2,Async:4,Async:8]",
)
@click.option(
    "--seeds", type=click.IntRange(min=1), default=None, help="Seeds per configuration. [default: 3]"
)
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    default=None,
    help="Optimizer steps per run (default: the manifest's).",
)
@click.option(
    "--target-accuracy",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="Held-out accuracy whose time-to-target is reported.",
)
@click.option(
    "--cores", type=click.IntRange(min=1), default=None, help="CPU cores every run gets (default: all)."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("runs/bench-sync"),
    show_default=True,
)
@click.option(
    "--quick", is_flag=True, help="Colocated, Sequential, Async:2 × 2 seeds × 6 steps on a smaller task."
)
@click.option(
    "--resume-grid", is_flag=True, help="Skip runs that finished before (their summary.json exists)."
)
@click.option(
    "--run-timeout", type=click.IntRange(min=1), default=3600, show_default=True, help="Seconds per run."
)
@click.option(
    "--framing",
    type=click.Choice(["equal", "offload"]),
    default="equal",
    show_default=True,
    help="equal: every run shares the same --cores. offload: Colocated gets only the trainer's share of "
    "the cores, the decoupled runs add the rest for workers; every process pinned; the speedup is "
    "reported against its bound (G+T)/max(G,T).",
)
def sync(
    job_path: Path,
    configs: str | None,
    seeds: int | None,
    max_steps: int | None,
    target_accuracy: float,
    cores: int | None,
    out: Path,
    quick: bool,
    resume_grid: bool,
    run_timeout: int,
    framing: str,
) -> None:
    """Colocated vs Sequential vs Async(Δmax) × seeds: time-to-target, throughput, staleness, with 95% CIs.

    Runs one `echorl run` at a time; writes results.json, results.md and PNG plots into --out.
    """
    _need_scipy()
    from echo_runtime.bench import sync_run

    default_configs = sync_run.QUICK_CONFIGS if quick else sync_run.FULL_CONFIGS
    try:
        options = sync_run.Options(
            job=job_path,
            out=out,
            configs=tuple(sync_run.parse_configs(configs or ",".join(default_configs))),
            seeds=seeds if seeds is not None else (2 if quick else 3),
            max_steps=max_steps if max_steps is not None else (6 if quick else None),
            target_accuracy=target_accuracy,
            cores=cores,
            resume_grid=resume_grid,
            overrides=QUICK_OVERRIDES if quick else {},
            run_timeout_s=float(run_timeout),
            framing=framing,
        )
        results = sync_run.run_grid(options, log=lambda line: click.echo(line, err=True))
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo((out / "results.md").read_text())
    if results["failures"]:
        raise click.ClickException(f"{len(results['failures'])} run(s) failed; see {out / 'results.md'}")
    click.echo(f"results, table and plots in {out}")
