"""``echorl export``: a version of a job's store as a Hugging Face model directory (:mod:`echo_runtime.export`)."""

from __future__ import annotations

import sys

import click

from echo_runtime import spec
from echo_runtime.cli.snapshots import open_store_from_options, reporting_errors, store_options


@click.command()
@store_options
@click.option("--version", "version", type=click.IntRange(min=1), default=None, help="Default: the newest.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="A new (or empty) directory.")
@click.option(
    "--base",
    metavar="PATH|echorl:NAME",
    default=None,
    help="The base model the job trained from (default: the --job-file's, with its warm-up if any).",
)
@click.option(
    "--adapter", "adapter_only", is_flag=True, help="LoRA versions: the adapter alone (PEFT's layout)."
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default=None,
    help="Of the written weights (default: the base model's).",
)
@reporting_errors
def export(
    storage: str | None,
    endpoint: str | None,
    job_name: str | None,
    job_file: str | None,
    version: int | None,
    out: str,
    base: str | None,
    adapter_only: bool,
    dtype: str | None,
) -> None:
    """Write a version of a job's store (default: the newest) as a Hugging Face model directory: a LoRA
    merged into its base (or, with --adapter, the adapter alone), full and delta versions rebuilt, with
    the tokenizer and its chat template. Loads with transformers' from_pretrained."""
    from echo_runtime import export as exporting
    from echo_runtime.models import load as model_load
    from echo_runtime.models import resolve

    store = open_store_from_options(storage, endpoint, job_name, job_file)
    if base is not None:
        base_dir = resolve.resolve_model(base)
    elif job_file is not None:
        job = spec.load_job(job_file)
        base_dir = model_load.resolve_spec(job.spec.model, job.spec.task)
    else:
        raise click.UsageError(
            "--base: name the base model the job trained from (a directory or echorl:<name>), or give "
            "--job-file (whose model, warm-up included, is used)"
        )
    try:
        done = exporting.export_version(
            store,
            out,
            base=base_dir,
            version=version,
            adapter_only=adapter_only,
            dtype=dtype,  # type: ignore[arg-type]
            progress=lambda message: click.echo(message, err=True),
        )
    except exporting.ExportError as exc:
        raise click.UsageError(str(exc)) from None
    what = "adapter" if adapter_only else ("merged model" if done.merged else "model")
    click.echo(f"version {done.version} ({done.kind}) → {done.out}: {what}, {done.dtype}")
    sys.stdout.flush()
