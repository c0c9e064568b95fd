"""Validate ``echorl simulate`` against measured local runs: fit, predict, report the relative errors.

For each run directory written by ``echorl run`` (``runs/<job>/``: job.yaml, run.json, metrics.jsonl,
workers/*.jsonl, summary.json), :mod:`echo_runtime.bench.simulate.fit`

1. fits the simulator's inputs from the run: per pool the seconds per generated group (mean, CV), the
   per-lease overhead and the snapshot-load time; the trainer's step, publish and checkpoint times; when
   the pools and the trainer started; the run's tail after its last step;
2. simulates the same job (mode, Δmax, batch, group and buffer sizes, pools) for the same number of
   optimizer steps, with several seeds;
3. compares the predicted ``trainerBusyFraction`` and ``rolloutsPerSecond`` (the runner's own estimator)
   with the measured ones from ``summary.json``: ``relative error = (predicted − measured) / measured``.

The issue's bar: within 20% for at least three local configurations (e.g. Async Δmax 0, Async Δmax 2,
Sequential). Runs should last long enough that start-up is not most of the wall-clock (≥ 20 steps).

    python benchmarks/simulate_validation.py runs/async runs/sequential runs/async-d0 \\
        --out benchmarks/results/simulate_validation.json

Exit status: 0 when every run is within the tolerance, 1 otherwise (the JSON is written either way).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

from echo_runtime.bench.simulate import fit  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "simulate_validation.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories of `echorl run`"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON report (default {RESULTS})")
    parser.add_argument("--seeds", type=int, default=10, help="simulations per run (default 10)")
    parser.add_argument("--tolerance", type=float, default=0.2, help="allowed |relative error| (default 0.2)")
    args = parser.parse_args(argv)

    records = []
    for directory in args.runs:
        try:
            run = fit.read_run(directory)
        except fit.RunError as exc:
            parser.error(str(exc))
        record = fit.validate(run, seeds=args.seeds, tolerance=args.tolerance)
        record["path"] = str(directory)
        records.append(record)
        errors = record["relativeError"]
        label = f"{directory.parent.name}/{directory.name}"  # e.g. a bench sync grid's async2/seed1
        print(
            f"{label[-24:]:24s} {run.mode:10s} Δmax {run.max_staleness}  steps {len(run.steps):4d}  "
            + "  ".join(
                f"{key} measured {record['measured'][key]:.4g} predicted {record['predicted']['mean'][key]:.4g} "
                f"({100 * errors[key]:+.1f}%)"
                for key in fit.TARGETS
                if errors[key] is not None
            )
            + ("" if record["withinTolerance"] else "  OUTSIDE TOLERANCE")
        )
    summary = fit.summarise_errors(records)
    report = {"tolerance": args.tolerance, "seeds": args.seeds, "summary": summary, "runs": records}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True))
    print(
        f"{summary['withinTolerance']}/{summary['runs']} run(s) within ±{100 * args.tolerance:.0f}%; report: {args.out}"
    )
    return 0 if summary["withinTolerance"] == summary["runs"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
