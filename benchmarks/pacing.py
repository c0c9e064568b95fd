"""What pacing saves: dropped groups and steps/s with and without it, side by side, same seed.

    python benchmarks/pacing.py [--configs Async:0,Async:1,Async:2,Async:4,Async:8] [--max-steps 400]
                                [--quickstart-steps 1200] [--seed 0] [--repeats 1] [--unpaced-first]
                                [--out benchmarks/results/pacing]

Runs the README's quickstart job (``examples/quickstart.yaml``: Async Δmax 2, its full ``maxSteps``)
and the ``echorl bench sync`` grid's Async configurations (the same job at ``--max-steps``), each twice
in a row — the coordinator pacing leases (the default) and not (``ECHORL_PACING=0``, which is
``echorl coordinator --no-pacing``: every task tagged ``t_train − Δmax``, leasing bounded by the buffer
alone, as before pacing) — alternating which goes first, so that both see the same machine. Reports, per
configuration and setting:

* **drops**: groups dropped as too stale / groups generated (valid submissions), over the whole run and
  in the steady state (from the first status sample at 10 % of the steps to the last);
* **steps/s**: optimizer steps / training wall-clock (run start to the last step), and its ratio
  paced / unpaced;
* the rollouts generated per optimizer step, and the max staleness consumed (never above Δmax).

Writes ``<out>/results.json`` and prints a table. Speed is a ratio of two runs measured back to back on
the same machine; on a shared machine repeat it (``--repeats``) and read the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from echo_runtime.bench import sync_run
from echo_runtime.runner import metrics

REPO = Path(__file__).resolve().parents[1]


def run_one(
    base: dict[str, Any], config: sync_run.Config, pacing: bool, steps: int, seed: int, out: Path
) -> Path:
    label = f"{config.slug}-{steps}-{'paced' if pacing else 'unpaced'}"
    run_dir = out / label
    doc = sync_run.manifest_for(base, config, seed, (out / "store").resolve(), {})
    doc["metadata"]["name"] = f"pacing-{label}"[:63]
    manifest = out / f"{label}.yaml"
    manifest.write_text(yaml.safe_dump(doc, sort_keys=False))
    argv = [sys.executable, "-m", "echo_runtime.cli", "run", str(manifest), "--fresh", "--no-progress",
            "--run-dir", str(run_dir), "--max-steps", str(steps)]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ECHORL_PACING": "1" if pacing else "0"}
    started = time.monotonic()
    with (out / f"{label}.log").open("w") as log:
        code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, check=False).returncode
    if code != 0:
        raise SystemExit(f"{label}: echorl run exited with {code}; see {out / f'{label}.log'}")
    print(f"  {label}: {time.monotonic() - started:.0f}s", flush=True)
    return run_dir


def measure(run_dir: Path, steps: int) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    records = metrics.read_records(run_dir / "metrics.jsonl")
    status = [r for r in records if r.get("kind") == "status"]
    trainer = [r for r in records if r.get("kind") == "trainer"]
    training = max(float(r["time"]) for r in trainer)
    steady = [r for r in status if int(r.get("policyVersion", 0)) >= steps // 10]
    first, last = steady[0], steady[-1]
    generated = int(last.get("generatedGroups", 0)) - int(first.get("generatedGroups", 0))
    dropped = int(last.get("droppedStale", 0)) - int(first.get("droppedStale", 0))
    assert all(r.get("pacing") is not None for r in status), f"{run_dir}: a coordinator without pacing flags"
    return {
        "steps": summary["policyVersion"],
        "trainingSeconds": training,
        "stepsPerSecond": summary["policyVersion"] / training,
        "generatedGroups": summary["generatedGroups"],
        "droppedStale": summary["droppedStale"],
        "droppedFraction": summary["droppedFraction"],
        "steadyDroppedFraction": dropped / generated if generated else None,
        "generatedPerStep": summary["generatedGroups"] / max(1, summary["policyVersion"]),
        "maxObservedStaleness": summary["maxObservedStaleness"],
        "finalHeldoutAccuracy": summary.get("finalHeldoutAccuracy"),
        "pacing": bool(status[-1].get("pacing")),
        "runDir": str(run_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, default=REPO / "examples" / "quickstart.yaml")
    parser.add_argument(
        "--configs",
        default="Async:0,Async:1,Async:2,Async:4,Async:8",
        help="'' runs the quickstart pair only",
    )
    parser.add_argument("--max-steps", type=int, default=400, help="steps of the grid's configurations")
    parser.add_argument("--quickstart-steps", type=int, default=1200, help="0 skips the quickstart pair")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--unpaced-first", action="store_true", help="start the alternation with the unpaced run"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "pacing")
    args = parser.parse_args(argv)
    base, _ = sync_run.load_job_document(args.job)
    plan = [(c, args.max_steps) for c in sync_run.parse_configs(args.configs)] if args.configs else []
    if args.quickstart_steps:
        plan.insert(
            0,
            (
                sync_run.Config("Async", int(base["spec"]["syncPolicy"]["maxStaleness"])),
                args.quickstart_steps,
            ),
        )
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for index, (config, steps) in enumerate(plan):
            order = (True, False) if (index + repeat + args.unpaced_first) % 2 == 0 else (False, True)
            print(f"{config.name} at {steps} steps (repeat {repeat}):", flush=True)
            got = {p: measure(run_one(base, config, p, steps, args.seed, args.out), steps) for p in order}
            rows.append(
                {
                    "config": config.name,
                    "steps": steps,
                    "repeat": repeat,
                    "paced": got[True],
                    "unpaced": got[False],
                    "stepsPerSecondRatio": got[True]["stepsPerSecond"] / got[False]["stepsPerSecond"],
                }
            )
    results = {"seed": args.seed, "machine": sync_run.machine(), "rows": rows}
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"\n{'configuration':>14} {'steps':>5} | {'drops, steady (paced / unpaced)':>32} | "
          f"{'steps/s (paced / unpaced = ratio)':>36}")  # fmt: skip
    for row in rows:
        p, u = row["paced"], row["unpaced"]
        print(
            f"{row['config']:>14} {row['steps']:>5} | {p['steadyDroppedFraction']:>14.1%} / "
            f"{u['steadyDroppedFraction']:<15.1%} | {p['stepsPerSecond']:>9.3f} / {u['stepsPerSecond']:<9.3f} "
            f"= {row['stepsPerSecondRatio']:.2f}"
        )
    print(f"results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
