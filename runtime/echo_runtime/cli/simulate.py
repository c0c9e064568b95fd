"""``echorl simulate CONFIG``: size inference pools before buying them (docs/simulate.md).

Runs the discrete-event simulator (:mod:`echo_runtime.bench.simulate`) on a configuration file, over a
grid of Δmax values, pool sizes and buffer sizes, and prints one row per point: rollouts/s, trainer busy
fraction, staleness, dropped work, snapshot egress and per-class utilisation. ``--out`` writes the whole
grid as JSON, ``--plot`` a PNG of busy fraction, throughput and dropped work against Δmax.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import click

from echo_runtime.bench.simulate import config as sim_config
from echo_runtime.bench.simulate import sweep as sim_sweep


def _ints(text: str | None, what: str) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated integers, got {text!r}", param_hint=what
        ) from None
    if not values or min(values) < 0:
        raise click.BadParameter(f"expected non-negative integers, got {text!r}", param_hint=what)
    return values


def _floats(text: str | None, what: str) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {text!r}", param_hint=what) from None
    if not values or min(values) <= 0:
        raise click.BadParameter(f"expected positive numbers, got {text!r}", param_hint=what)
    return values


def pool_variants(
    base: sim_config.SimConfig, scales: list[float] | None, pools: tuple[str, ...]
) -> list[dict[str, int]] | None:
    """The pool-size axis: every ``--scale`` × the product of every ``--pool NAME=LIST``."""
    names = {c.name for c in base.worker_classes}
    sweeps: list[list[tuple[str, int]]] = []
    for item in pools:
        name, sep, values = item.partition("=")
        if not sep or name not in names:
            raise click.BadParameter(
                f"expected NAME=COUNT[,COUNT...] with NAME one of {', '.join(sorted(names))}, got {item!r}",
                param_hint="--pool",
            )
        counts = _ints(values, "--pool")
        assert counts is not None
        sweeps.append([(name, n) for n in counts])
    if not scales and not sweeps:
        return None
    variants = []
    for scale in scales or [1.0]:
        scaled = base.scaled(scale).pool_sizes()
        for combo in itertools.product(*sweeps):
            variants.append({**scaled, **dict(combo)})
    return variants


@click.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--max-staleness", metavar="LIST", help="Δmax values to sweep, e.g. 0,1,2,4,8.")
@click.option("--scale", metavar="LIST", help="Multiply every pool's worker count, e.g. 0.5,1,2.")
@click.option(
    "--pool",
    "pools",
    multiple=True,
    metavar="NAME=LIST",
    help="Sweep one class's worker count, e.g. cpu=0,500,1000 (repeatable: the product is swept).",
)
@click.option("--buffer", metavar="LIST", help="Replay-buffer capacities (groups) to sweep.")
@click.option("--mode", type=click.Choice(sim_config.MODES), help="Override the configuration's mode.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), help="Simulated seconds.")
@click.option("--max-steps", type=click.IntRange(min=1), help="Stop after this many optimizer steps.")
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Repeat each point with this many seeds; the table shows mean ± std.",
)
@click.option("--seed", type=click.IntRange(min=0), help="First seed (default: the configuration's).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the results as JSON.")
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG plot."
)
def simulate(
    config: Path,
    max_staleness: str | None,
    scale: str | None,
    pools: tuple[str, ...],
    buffer: str | None,
    mode: str | None,
    duration: float | None,
    max_steps: int | None,
    seeds: int,
    seed: int | None,
    out: Path | None,
    plot_path: Path | None,
) -> None:
    """Predict rollouts/s, trainer busy fraction, staleness and dropped work for a swarm in CONFIG."""
    try:
        base = sim_config.load_config(config)
        changes: dict[str, object] = {}
        if mode is not None:
            changes["mode"] = mode
        if duration is not None:
            changes["duration_seconds"] = duration
        if max_steps is not None:
            changes["max_steps"] = max_steps
        if seed is not None:
            changes["seed"] = seed
        base = base.replace(**changes)
        deltas = _ints(max_staleness, "--max-staleness")
        buffers = _ints(buffer, "--buffer")
        variants = pool_variants(base, _floats(scale, "--scale"), pools)
        points = sim_sweep.sweep(
            base,
            max_staleness=deltas,
            pools=variants,
            buffer_sizes=list(buffers) if buffers else None,
            seeds=seeds,
        )
    except sim_config.ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"{base.mode} mode, batch {base.batch_size} groups × {base.group_size}, "
        f"{base.duration_seconds:g} s simulated"
        + (f" (≤ {base.max_steps} steps)" if base.max_steps else "")
        + f", {seeds} seed(s) per point"
    )
    click.echo(sim_sweep.table(points))
    violations = sum(r.violations for p in points for r in p.results)
    if violations:  # the simulator runs the coordinator's rule; this would be a bug worth reporting
        raise click.ClickException(f"{violations} consumed group(s) exceeded the staleness bound")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        document = {"config": base.to_mapping(), "points": [p.to_mapping() for p in points]}
        out.write_text(json.dumps(document, indent=2, sort_keys=True))
        click.echo(f"results: {out}")
    if plot_path is not None:
        sim_sweep.plot(points, plot_path, title=f"echorl simulate {config.name}")
        click.echo(f"plot: {plot_path}")
