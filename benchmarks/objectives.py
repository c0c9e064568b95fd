"""The objective presets side by side on a real model: held-out accuracy against wall-clock, with CIs.

Runs ``echorl run`` (Async, one run at a time) of one manifest — by default ``examples/smollm2.yaml``,
SmolLM2-135M on the addition task whose base accuracy is about 0.31 — once per preset and seed, changing
nothing but ``spec.algorithm.preset`` (each preset at its paper's values, no tuning), the seed and the
store. Every run gets the same steps; the comparison is at a common wall-clock budget, the earliest
time at which every run had published its last evaluated version, so no preset is credited for steps
another had no time to take.

Per preset it reports held-out accuracy (greedy, the evaluator's) at the budget, mean and 95 %
Student-t interval over seeds, and over training: groups filtered (dynamic sampling), clip fractions
(low, high, dual), entropy, mean completion length, groups without signal, and how long the trainer
waited for each batch (dynamic sampling must not make it wait longer). Writes
``objectives.json`` and ``objectives-curves.png`` into ``--results``; the run directories stay in
``--out`` (``--resume`` skips finished runs).

    python benchmarks/objectives.py --out runs/objectives --results docs/benchmarks
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))


def manifest(job: Path, preset: str, store: Path, max_steps: int, eval_every: int) -> dict[str, Any]:
    """``job`` with the preset, the step count, the evaluation interval and a store of its own."""
    doc: dict[str, Any] = yaml.safe_load(job.read_text())
    spec = doc["spec"]
    spec["algorithm"]["preset"] = preset
    spec["algorithm"]["maxSteps"] = max_steps
    spec["task"]["evalEvery"] = eval_every
    spec["storage"] = {"type": "Local", "path": str(store)}
    doc["metadata"]["name"] = f"objectives-{preset.lower()}"
    return doc


def run_one(job: Path, preset: str, seed: int, out: Path, args: argparse.Namespace) -> Path:
    run_dir = (out / preset / f"seed{seed}").resolve()
    if args.resume and (run_dir / "summary.json").exists():
        print(f"[objectives] {preset} seed {seed}: done before, kept", flush=True)
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir.parent / f"seed{seed}.yaml"
    doc = manifest(job, preset, run_dir.parent / f"store{seed}", args.max_steps, args.eval_every)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    argv = [sys.executable, "-m", "echo_runtime.cli", "run", str(path), "--fresh", "--no-progress"]
    argv += ["--seed", str(seed), "--run-dir", str(run_dir)]
    started = time.time()
    print(f"[objectives] {preset} seed {seed}: running", flush=True)
    with (run_dir.parent / f"seed{seed}.log").open("w") as log:
        proc = subprocess.run(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=args.run_timeout)
    print(
        f"[objectives] {preset} seed {seed}: exit {proc.returncode} in {time.time() - started:.0f} s",
        flush=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"run {run_dir} failed; see {run_dir.parent / f'seed{seed}.log'}")
    return run_dir


def records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def measures(run: Path) -> dict[str, Any]:
    """What one run did: evaluations with their publication times, and the trainer's records by version."""
    recs = records(run)
    evals = sorted((r for r in recs if r.get("kind") == "eval"), key=lambda r: r["policyVersion"])
    steps: dict[int, dict[str, Any]] = {}
    for r in recs:
        if r.get("kind") == "trainer":
            steps[int(r["policyVersion"])] = r
    status = [r for r in recs if r.get("kind") == "status"]
    trainer = [steps[v] for v in sorted(steps)]
    return {
        "evals": [
            {
                "version": e["policyVersion"],
                "accuracy": e["heldoutAccuracy"],
                "at": float(e.get("publishedAt", 0.0)),
            }
            for e in evals
        ],
        "steps": [
            {
                "version": s["policyVersion"],
                "reward": s.get("rewardMean"),
                "clipLow": s.get("clipFractionLow"),
                "clipHigh": s.get("clipFractionHigh"),
                "dualClip": s.get("dualClipFraction"),
                "entropy": s.get("entropy"),
                "meanLength": s["tokens"] / s["rollouts"] if s.get("rollouts") else None,
                "zeroSignalGroups": s.get("zeroSignalGroups"),
                "groups": s.get("groups"),
                "batchSeconds": s.get("batchSeconds"),
                "stepSeconds": s.get("stepSeconds"),
            }
            for s in trainer
        ],
        "filteredGroups": int(status[-1].get("filteredGroups", 0)) if status else 0,
        "generatedGroups": int(status[-1].get("generatedGroups", 0)) if status else 0,
        "warnings": sorted({w for r in status for w in r.get("warnings") or []}),
    }


def accuracy_at(evals: list[dict[str, Any]], budget: float) -> float:
    """The held-out accuracy of the newest version evaluated and published by ``budget`` seconds."""
    within = [e for e in evals if e["at"] <= budget]
    return float(within[-1]["accuracy"] if within else evals[0]["accuracy"])


def interval(values: list[float]) -> dict[str, Any]:
    from echo_runtime.bench.sync import t_interval

    ci = t_interval(values)
    return {"mean": statistics.fmean(values), "ci95": list(ci) if ci else None, "values": values}


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    budget = min(m["evals"][-1]["at"] for ms in runs.values() for m in ms)
    out: dict[str, Any] = {"budgetSeconds": budget, "presets": {}}
    for preset, ms in runs.items():

        def mean_of(key: str, ms: list[dict[str, Any]] = ms) -> float | None:
            values = [s[key] for m in ms for s in m["steps"] if s.get(key) is not None]
            return statistics.fmean(values) if values else None

        out["presets"][preset] = {
            "accuracyAtBudget": interval([accuracy_at(m["evals"], budget) for m in ms]),
            "initialAccuracy": interval([m["evals"][0]["accuracy"] for m in ms]),
            "finalAccuracy": interval([m["evals"][-1]["accuracy"] for m in ms]),
            "secondsToLastVersion": interval([m["evals"][-1]["at"] for m in ms]),
            "filteredGroups": interval([float(m["filteredGroups"]) for m in ms]),
            "generatedGroups": interval([float(m["generatedGroups"]) for m in ms]),
            "clipFractionLow": mean_of("clipLow"),
            "clipFractionHigh": mean_of("clipHigh"),
            "dualClipFraction": mean_of("dualClip"),
            "entropy": mean_of("entropy"),
            "meanCompletionLength": mean_of("meanLength"),
            "zeroSignalGroupsPerStep": mean_of("zeroSignalGroups"),
            "trainerWaitSecondsPerStep": mean_of("batchSeconds"),
            "trainerStepSeconds": mean_of("stepSeconds"),
            "warnings": sorted({w for m in ms for w in m["warnings"]}),
        }
    return out


def plot(runs: dict[str, list[dict[str, Any]]], path: Path, budget: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    colours = dict(zip(runs, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for preset, ms in runs.items():
        for i, m in enumerate(ms):
            label = preset if i == 0 else None
            c = colours[preset]
            axes[0, 0].plot(
                [e["at"] / 60 for e in m["evals"]],
                [e["accuracy"] for e in m["evals"]],
                "o-",
                color=c,
                label=label,
                alpha=0.8,
            )
            versions = [s["version"] for s in m["steps"]]
            axes[0, 1].plot(versions, [s["meanLength"] for s in m["steps"]], color=c, label=label, alpha=0.8)
            axes[1, 0].plot(
                versions,
                [(s["clipLow"] or 0) + (s["clipHigh"] or 0) for s in m["steps"]],
                color=c,
                label=label,
                alpha=0.8,
            )
            axes[1, 1].plot(versions, [s["entropy"] for s in m["steps"]], color=c, label=label, alpha=0.8)
    axes[0, 0].axvline(budget / 60, color="grey", linestyle=":", label="common budget")
    axes[0, 0].set(
        xlabel="wall-clock (min)", ylabel="held-out accuracy (greedy)", title="accuracy against time"
    )
    axes[0, 1].set(xlabel="policy version", ylabel="tokens", title="mean completion length")
    axes[1, 0].set(xlabel="policy version", ylabel="fraction of tokens", title="clip fraction (low + high)")
    axes[1, 1].set(xlabel="policy version", ylabel="nats", title="policy entropy per token")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--job", type=Path, default=REPO / "examples" / "smollm2.yaml")
    parser.add_argument("--presets", default="GRPO,DAPO,DrGRPO,GSPO")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "objectives")
    parser.add_argument("--results", type=Path, default=REPO / "runs" / "objectives")
    parser.add_argument("--run-timeout", type=int, default=3600)
    parser.add_argument("--resume", action="store_true", help="Keep runs that finished before.")
    parser.add_argument("--summarise-only", action="store_true", help="Only read the runs in --out.")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in presets}
    for seed in range(args.seeds):  # seed-major: a session cut short still has every preset at seed 0
        for preset in presets:
            run_dir = (args.out / preset / f"seed{seed}").resolve()
            if not args.summarise_only:
                run_dir = run_one(args.job, preset, seed, args.out, args)
            if (run_dir / "summary.json").exists():
                runs[preset].append(measures(run_dir))
    runs = {p: ms for p, ms in runs.items() if ms}
    if not runs:
        raise SystemExit("no finished run to summarise")
    result = summarise(runs)
    result["setup"] = {
        "job": str(args.job.relative_to(REPO) if args.job.is_relative_to(REPO) else args.job),
        "maxSteps": args.max_steps,
        "evalEvery": args.eval_every,
        "seeds": {p: len(ms) for p, ms in runs.items()},
        "runs": {p: ms for p, ms in runs.items()},
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "objectives.json").write_text(json.dumps(result, indent=2))
    plot(runs, args.results / "objectives-curves.png", result["budgetSeconds"])
    print(json.dumps({p: r["accuracyAtBudget"] for p, r in result["presets"].items()}, indent=2))
    print(f"budget {result['budgetSeconds']:.0f} s; wrote {args.results / 'objectives.json'}")


if __name__ == "__main__":
    main()
