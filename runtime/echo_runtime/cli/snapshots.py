"""``echorl snapshots ls|show|gc``: look into a job's snapshot store and collect its garbage.

The store is named the way a user has it at hand: ``--job-file job.yaml`` (the EchoJob's name,
storage and retention), or ``--storage`` with a local path or ``s3://bucket[/prefix]`` (plus
``--endpoint``) and ``--job``. Flags given explicitly win over the job file. S3 credentials come from
``ECHORL_S3_ACCESS_KEY`` / ``ECHORL_S3_SECRET_KEY`` (or the ``AWS_*`` variables).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
import pydantic

from echo_runtime import spec
from echo_runtime.snapshots import errors, store
from echo_runtime.snapshots.manifest import Manifest

F = TypeVar("F", bound=Callable[..., Any])


def store_options(fn: F) -> F:
    options = [
        click.option(
            "--storage",
            metavar="PATH|s3://BUCKET[/PREFIX]",
            help="The store: a local directory, or an S3 bucket and key prefix.",
        ),
        click.option(
            "--endpoint",
            metavar="URL",
            help="S3 endpoint, http(s)://host:port (default: $ECHORL_S3_ENDPOINT or $AWS_ENDPOINT_URL).",
        ),
        click.option(
            "--job", "job_name", metavar="NAME", help="The job's name (metadata.name of the EchoJob)."
        ),
        click.option(
            "--job-file",
            type=click.Path(dir_okay=False, exists=True),
            help="An EchoJob manifest; its name, storage and retention are used.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def open_store_from_options(
    storage: str | None, endpoint: str | None, job_name: str | None, job_file: str | None
) -> store.SnapshotStore:
    retention = None
    target: spec.Storage | None = None
    if job_file is not None:
        try:
            resolved = spec.load_job(job_file)
        except spec.ManifestError as exc:
            raise click.UsageError(str(exc)) from None
        job_name = job_name or resolved.name
        target = resolved.spec.storage
        retention = resolved.sync_policy.retention
    if storage is not None:
        target = _parse_storage(storage, endpoint)
    if target is None:
        raise click.UsageError(
            "name the store: --storage PATH|s3://BUCKET[/PREFIX] (with --job), or --job-file"
        )
    if job_name is None:
        raise click.UsageError("name the job: --job NAME (or --job-file)")
    try:
        return store.open_store(target, job_name, retention=retention)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _parse_storage(value: str, endpoint: str | None) -> spec.Storage:
    try:
        if not value.startswith("s3://"):
            return spec.Storage(type="Local", path=value)
        bucket, _, prefix = value[len("s3://") :].partition("/")
        endpoint = endpoint or os.environ.get("ECHORL_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
        if not endpoint:
            raise click.UsageError(
                f"--storage {value}: give the S3 endpoint with --endpoint http(s)://host:port"
            )
        return spec.Storage(
            type="S3",
            endpoint=endpoint,
            bucket=bucket,
            prefix=prefix.strip("/"),
            secure=not endpoint.startswith("http://"),
        )
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise click.UsageError(f"--storage {value}: {problems}") from None


def reporting_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except errors.SnapshotError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper  # type: ignore[return-value]


@click.group()
def snapshots() -> None:
    """Inspect a job's snapshot store and remove what retention no longer keeps."""


@snapshots.command("ls")
@store_options
@click.option("--checkpoints", is_flag=True, help="List trainer checkpoints instead of snapshots.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (one object per version) instead of a table."
)
@reporting_errors
def ls(
    storage: str | None,
    endpoint: str | None,
    job_name: str | None,
    job_file: str | None,
    checkpoints: bool,
    as_json: bool,
) -> None:
    """List the versions (or checkpoints) of a job, newest last."""
    st = open_store_from_options(storage, endpoint, job_name, job_file)
    numbers = st.checkpoints() if checkpoints else st.versions()
    docs = [st.checkpoint_manifest(n) if checkpoints else st.manifest(n) for n in numbers]
    pins: dict[int, list[str]] = {}
    if not checkpoints:
        now = st.blobs.now()
        for pin in st.pins():
            if pin.live(now):
                pins.setdefault(pin.version, []).append(pin.reader)
    if as_json:
        for doc in docs:
            click.echo(json.dumps({**doc.model_dump(mode="json"), "pinnedBy": pins.get(doc.version, [])}))
        return
    what = "checkpoints" if checkpoints else "snapshots"
    if not docs:
        click.echo(f"no {what} of job {st.job!r} in {st.location}")
        return
    rows = [
        ("CHECKPOINT" if checkpoints else "VERSION", "KIND", "STEP", "FILES", "SIZE", "CREATED", "PINNED BY")
    ]
    rows += [
        (
            str(d.version),
            d.kind,
            str(d.step),
            str(len(d.files)),
            _size(d.total_size),
            _when(d.created),
            ",".join(pins.get(d.version, [])) or "-",
        )
        for d in docs
    ]
    _table(rows)
    click.echo(
        f"{len(docs)} {what[:-1]}(s) of job {st.job!r} in {st.location}; "
        f"latest: {st.latest_checkpoint() if checkpoints else st.latest_version()}"
    )


@snapshots.command()
@store_options
@click.argument("version", default="latest")
@click.option("--checkpoint", is_flag=True, help="VERSION names a trainer checkpoint (step).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@reporting_errors
def show(
    storage: str | None,
    endpoint: str | None,
    job_name: str | None,
    job_file: str | None,
    version: str,
    checkpoint: bool,
    as_json: bool,
) -> None:
    """Show one version's manifest: kind, base model, files with sizes and sha256, pins."""
    st = open_store_from_options(storage, endpoint, job_name, job_file)
    number = _number(st, version, checkpoint)
    doc: Manifest = st.checkpoint_manifest(number) if checkpoint else st.manifest(number)
    if as_json:
        click.echo(json.dumps(doc.model_dump(mode="json"), indent=2))
        return
    click.echo(
        f"{'checkpoint' if checkpoint else 'version'} {doc.version} of job {st.job!r} in {st.location}"
    )
    for label, value in [
        ("kind", doc.kind),
        ("base model", doc.base_model),
        ("step", doc.step),
        ("created", _when(doc.created)),
        ("size", _size(doc.total_size)),
        ("data", doc.data),
    ]:
        click.echo(f"  {label + ':':<12}{value}")
    if doc.delta is not None:
        full = sum(f.size for f in doc.delta.files)
        click.echo(
            f"  {'delta:':<12}changes against version {doc.delta.base} (anchor {doc.delta.anchor}); "
            f"full weights {_size(full)}"
        )
    if not checkpoint:
        now = st.blobs.now()
        held = [p for p in st.pins() if p.version == number]
        for pin in held:
            left = pin.expires_at - now
            state = f"expires in {left:.0f} s" if left > 0 else "expired"
            click.echo(f"  {'pinned by:':<12}{pin.reader} ({state})")
    _table([("FILE", "SIZE", "SHA256")] + [(f.name, _size(f.size), f.sha256) for f in doc.files], indent="  ")


@snapshots.command()
@store_options
@click.option(
    "--keep-last", type=click.IntRange(min=1), help="Newest versions kept (default: the job's retention, 4)."
)
@click.option(
    "--checkpoint-keep-last",
    type=click.IntRange(min=1),
    help="Newest checkpoints kept (default: the job's retention, 2).",
)
@click.option(
    "--orphan-grace",
    type=click.FloatRange(min=0),
    default=store.DEFAULT_ORPHAN_GRACE_S,
    show_default=True,
    help="Seconds before files of an unfinished publish count as abandoned.",
)
@click.option("--dry-run", is_flag=True, help="Only print what would be removed.")
@reporting_errors
def gc(
    storage: str | None,
    endpoint: str | None,
    job_name: str | None,
    job_file: str | None,
    keep_last: int | None,
    checkpoint_keep_last: int | None,
    orphan_grace: float,
    dry_run: bool,
) -> None:
    """Remove versions beyond the newest K that no live pin holds, expired pins, old checkpoints, and
    files of publishes that never finished."""
    st = open_store_from_options(storage, endpoint, job_name, job_file)
    report = st.gc(
        keep_last=keep_last,
        checkpoint_keep_last=checkpoint_keep_last,
        orphan_grace_s=orphan_grace,
        dry_run=dry_run,
    )
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{st.location}, job {st.job!r}:")
    click.echo(
        f"  versions kept: {_list(report.kept)}"
        + (f" (pinned: {_list(report.pinned)})" if report.pinned else "")
        + (f" (needed by delta versions: {_list(report.needed)})" if report.needed else "")
    )
    click.echo(f"  versions {verb}: {_list(report.deleted)}")
    click.echo(
        f"  checkpoints kept: {_list(report.checkpoints_kept)}; {verb}: {_list(report.checkpoints_deleted)}"
    )
    click.echo(
        f"  expired pins {verb}: {len(report.expired_pins)}; abandoned uploads {verb}: {len(report.orphans)}"
    )
    click.echo(
        f"  space {'to free' if dry_run else 'freed'}: {_size(report.freed_bytes)}; "
        f"{'would remain' if dry_run else 'remains'}: {_size(report.kept_bytes)}"
    )


def _number(st: store.SnapshotStore, value: str, checkpoint: bool) -> int:
    if value == "latest":
        latest = st.latest_checkpoint() if checkpoint else st.latest_version()
        if latest is None:
            raise click.ClickException(
                f"no {'checkpoints' if checkpoint else 'snapshots'} of job {st.job!r} in {st.location}"
            )
        return latest
    if not value.isdigit():
        raise click.BadParameter(
            f"expected a version number or 'latest', got {value!r}", param_hint="VERSION"
        )
    return int(value)


def _table(rows: Sequence[tuple[str, ...]], indent: str = "") -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def _when(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _list(values: tuple[int, ...]) -> str:
    return ", ".join(map(str, values)) or "none"
