"""``echorl validate [--local] FILE...``: check manifests and print every problem with its field path.

By default a file is checked as the API server checks it with Echo's CRDs installed: the models' rules
plus the cluster-only ones (S3 storage, an explicit model path, a job name of at most 40 characters,
no pool named ``trainer`` or ``coordinator``, no ``Colocated`` mode). ``--local`` checks a file as
``echorl run`` reads it instead. Documents of other kinds (a Secret, an HPA) are skipped and listed.
"""

from __future__ import annotations

import click

from echo_runtime import spec


@click.command()
@click.option(
    "--local",
    is_flag=True,
    help="Check the file for `echorl run` (Local storage, Colocated mode, the default model allowed) "
    "instead of for a cluster.",
)
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate(files: tuple[str, ...], local: bool) -> None:
    """Validate EchoJob / InferenceSwarm / TrainingSwarm / SyncPolicy manifests.

    Prints each problem as PATH: MESSAGE and exits 1 if any file has one. Without --local the rules
    are the cluster's, the same the API server applies through the CRDs; with --local, those of
    `echorl run`. Documents of other kinds are skipped and listed. References between objects in the
    same file (syncPolicyRef, trainingSwarmRef, swarmRef) are resolved; references to objects not in
    the file are reported as notes, since they may exist in the cluster.
    """
    failed = False
    for name in files:
        try:
            read = spec.read_file(name, cluster=not local)
        except spec.ManifestError as exc:
            failed = True
            click.echo(f"{name}: invalid ({len(exc.findings)} problem(s))", err=True)
            for finding in exc.findings:
                doc = f"[document {finding.document}] " if finding.document else ""
                click.echo(f"  {doc}{finding}", err=True)
            continue
        manifests = read.manifests
        if local:  # `echorl run` runs the task in this environment: a plugin must be installed here
            from echo_runtime.tasks import registry

            unknown = []
            for job in (m for m in manifests if isinstance(m, spec.EchoJob)):
                try:
                    registry.check(job.spec.task.name, job.spec.task.options, plugins_here=True)
                except ValueError as exc:
                    unknown.append(f"  {job.metadata.name}: spec.task.name: {exc}")
            if unknown:
                failed = True
                click.echo(f"{name}: invalid for echorl run ({len(unknown)} problem(s))", err=True)
                click.echo("\n".join(unknown), err=True)
                continue
        for job in (m for m in manifests if isinstance(m, spec.EchoJob)):
            try:
                spec.resolve(job, manifests)
            except spec.ManifestError as exc:
                for finding in exc.findings:
                    click.echo(f"{name}: note: {job.metadata.name}: {finding} (must exist in the cluster)")
        kinds = ", ".join(f"{m.kind}/{m.metadata.name}" for m in manifests) or "no Echo objects"
        skipped = f"; skipped {', '.join(read.skipped)}" if read.skipped else ""
        click.echo(f"{name}: valid{' for echorl run' if local else ''} ({kinds}{skipped})")
    if failed:
        raise SystemExit(1)
