"""``echorl validate FILE...``: check manifests and print every problem with its field path."""

from __future__ import annotations

import click

from echo_runtime import spec


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate(files: tuple[str, ...]) -> None:
    """Validate EchoJob / InferenceSwarm / TrainingSwarm / SyncPolicy manifests.

    Prints each problem as PATH: MESSAGE and exits 1 if any file has one. References between
    objects in the same file (syncPolicyRef, trainingSwarmRef, swarmRef) are resolved; references
    to objects not in the file are reported as notes, since they may exist in the cluster.
    """
    failed = False
    for name in files:
        try:
            manifests = spec.load_file(name)
        except spec.ManifestError as exc:
            failed = True
            click.echo(f"{name}: invalid ({len(exc.problems)} problem(s))", err=True)
            for problem in exc.problems:
                doc = f"[document {problem.document}] " if problem.document else ""
                click.echo(f"  {doc}{problem}", err=True)
            continue
        for job in (m for m in manifests if isinstance(m, spec.EchoJob)):
            try:
                spec.resolve(job, manifests)
            except spec.ManifestError as exc:
                for problem in exc.problems:
                    click.echo(f"{name}: note: {job.metadata.name}: {problem} (must exist in the cluster)")
        kinds = ", ".join(f"{m.kind}/{m.metadata.name}" for m in manifests)
        click.echo(f"{name}: valid ({kinds})")
    if failed:
        raise SystemExit(1)
