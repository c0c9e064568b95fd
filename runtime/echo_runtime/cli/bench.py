"""``echorl bench``: benchmarks of Echo's parts. ``fidelity`` — how faithfully each inference backend
reports the behaviour log-probs the trainer recomputes, and whether two backends sample the same policy
alike (:mod:`echo_runtime.bench.fidelity_run`). A group, so further benchmarks join as subcommands.
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group()
def bench() -> None:
    """Benchmarks: backend fidelity."""


@bench.command()
@click.option("--model", default="echorl:tiny", show_default=True, help="Model path, hub id or echorl:<size>.")
@click.option(
    "--backends", "backend_list", default="transformers,mlx", show_default=True, metavar="LIST",
    help="Comma-separated backends, each NAME[:DEVICE]: transformers, transformers:cuda, mlx, vllm.",
)
@click.option(
    "--warmup-steps", type=click.IntRange(min=0), default=0, show_default=True,
    help="Warm a built-in model up on the task first (cached), so that rewards vary.",
)
@click.option("--prompts", type=click.IntRange(min=1), default=64, show_default=True, help="Task prompts.")
@click.option("--n", "n", type=click.IntRange(min=1), default=4, show_default=True, help="Samples per prompt.")
@click.option("--task", default="arithmetic", show_default=True, help="Task whose held-out prompts are used.")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=1.0, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option(
    "--snapshot", type=click.Choice(["lora", "none"]), default="lora", show_default=True,
    help="lora: compare at policy version 1, a random adapter the trainer exports; none: the base model.",
)
@click.option(
    "--lora-scale", type=click.FloatRange(min=0, min_open=True), default=0.03, show_default=True,
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
    from echo_runtime.bench import fidelity_run

    try:
        choices = fidelity_run.parse_backends(backend_list)
        options = fidelity_run.Options(
            model=model, warmup_steps=warmup_steps, backends=tuple(choices), prompts=prompts, n=n, task=task, seed=seed,
            temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, snapshot=snapshot, lora_scale=lora_scale,
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
