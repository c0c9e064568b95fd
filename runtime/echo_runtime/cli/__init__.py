"""The ``echorl`` command line: one click group, one module per subcommand family.

Each subcommand lives in its own module under ``echo_runtime.cli`` and is registered here, so the
parts of the project (models, snapshots, coordinator, ...) own their own command-line surface.
Importing this module imports no ML framework: each command imports what it needs when it runs.
"""

from __future__ import annotations

import click

from echo_runtime.cli import bench as bench_cmd
from echo_runtime.cli import coordinator as coordinator_cmd
from echo_runtime.cli import export as export_cmd
from echo_runtime.cli import model as model_cmd
from echo_runtime.cli import operator_cmd
from echo_runtime.cli import run as run_cmd
from echo_runtime.cli import scorer as scorer_cmd
from echo_runtime.cli import simulate as simulate_cmd
from echo_runtime.cli import snapshots as snapshots_cmd
from echo_runtime.cli import trainer as trainer_cmd
from echo_runtime.cli import validate as validate_cmd
from echo_runtime.cli import worker as worker_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="echorl")
def main() -> None:
    """Echo: RL post-training with decoupled inference and training swarms."""


main.add_command(validate_cmd.validate)
main.add_command(model_cmd.model)
main.add_command(snapshots_cmd.snapshots)
main.add_command(export_cmd.export)
main.add_command(coordinator_cmd.coordinator)
main.add_command(worker_cmd.worker)
main.add_command(trainer_cmd.trainer)
main.add_command(scorer_cmd.scorer)
main.add_command(run_cmd.run)
main.add_command(operator_cmd.operator)
main.add_command(bench_cmd.bench)
main.add_command(simulate_cmd.simulate)
