"""The ``echorl`` command line: one click group, one module per subcommand family.

Each subcommand lives in its own module under ``echo_runtime.cli`` and is registered here, so the
parts of the project (models, snapshots, coordinator, ...) own their own command-line surface.
Commands that later work fills in say so and exit non-zero: none of them pretends to work.
"""

from __future__ import annotations

import click

from echo_runtime.cli import validate as validate_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="echorl")
def main() -> None:
    """Echo: RL post-training with decoupled inference and training swarms."""


main.add_command(validate_cmd.validate)


def _not_available(name: str, summary: str) -> click.Command:
    @click.command(
        name=name, help=f"{summary} (not available yet).", context_settings={"ignore_unknown_options": True}
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        raise click.ClickException(f"`echorl {name}` is not available yet in this version of echorl.")

    return command


for _name, _summary in [
    ("run", "Run an EchoJob locally: coordinator, workers and trainer as processes"),
    ("worker", "Run an inference worker that joins a coordinator"),
    ("trainer", "Run the GRPO trainer"),
    ("coordinator", "Run the coordinator service of one job"),
    ("bench", "Benchmarks: sync modes, backend fidelity"),
]:
    main.add_command(_not_available(_name, _summary))
