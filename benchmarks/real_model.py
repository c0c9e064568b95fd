"""The real-model learning measurement: held-out accuracy before and after, per mode, over seeds, with CIs.

Reads the run directories that ``echorl bench sync --job examples/smollm2.yaml --configs
Async:2,Sequential --seeds 3 --out DIR`` leaves (``<config>/seed<k>/metrics.jsonl``), and for every run
takes (for every finished run: one with a ``summary.json``) the evaluator's held-out accuracy of version 0 (the base model) and of version ``--at`` (default:
the last version every run evaluated), with the wall-clock at which that version was published. Per
mode it reports the mean gain over seeds with a 95 % Student-t interval (``mean ± t₀.₉₇₅,n−1 · s/√n``;
the held-out set is the same for every seed, so each gain is a paired difference), and draws held-out
accuracy against wall-clock, one line per seed. Writes ``real-model.json`` and ``real-model-curves.png``
into ``--out``.

    python benchmarks/real_model.py runs/real-model --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))


def evals_of(run: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return sorted((r for r in records if r.get("kind") == "eval"), key=lambda r: r["policyVersion"])


def main() -> None:
    from echo_runtime.bench import sync

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("grid", type=Path)
    parser.add_argument("--at", type=int, default=None, help="Policy version compared with version 0.")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    args = parser.parse_args()
    runs = {
        config.name: sorted(p for p in config.iterdir() if p.is_dir() and (p / "summary.json").is_file())
        for config in sorted(args.grid.iterdir())
        if config.is_dir() and config.name != "store"
    }
    runs = {k: v for k, v in runs.items() if v}
    all_evals = {(mode, run.name): evals_of(run) for mode, seeds in runs.items() for run in seeds}
    at = args.at
    if at is None:
        at = min(max(e["policyVersion"] for e in evals) for evals in all_evals.values())
    report: dict[str, Any] = {"comparedVersion": at, "modes": {}}
    for mode, seeds in runs.items():
        rows = []
        for run in seeds:
            evals = {e["policyVersion"]: e for e in all_evals[(mode, run.name)]}
            if 0 not in evals or at not in evals:
                raise SystemExit(f"{run}: no evaluation of version 0 and {at}")
            rows.append(
                {
                    "seed": run.name,
                    "before": evals[0]["heldoutAccuracy"],
                    "after": evals[at]["heldoutAccuracy"],
                    "gain": evals[at]["heldoutAccuracy"] - evals[0]["heldoutAccuracy"],
                    "publishedAtSeconds": evals[at]["publishedAt"],
                    "heldoutSize": evals[at]["heldoutSize"],
                }
            )
        gains = [r["gain"] for r in rows]
        mean = statistics.mean(gains)
        interval = sync.t_interval(gains) or (math.nan, math.nan)
        report["modes"][mode] = {
            "runs": rows,
            "meanGain": mean,
            "ci95": list(interval),
            "meanBefore": statistics.mean(r["before"] for r in rows),
            "meanAfter": statistics.mean(r["after"] for r in rows),
            "meanSecondsToVersion": statistics.mean(r["publishedAtSeconds"] for r in rows),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "real-model.json").write_text(json.dumps(report, indent=2) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), sharey=True, squeeze=False)
    for ax, (mode, seeds) in zip(axes[0], runs.items(), strict=True):
        for run in seeds:
            curve = all_evals[(mode, run.name)]
            ax.plot(
                [e["publishedAt"] / 60 for e in curve],
                [e["heldoutAccuracy"] for e in curve],
                marker="o",
                label=run.name,
            )
        ax.set_title(f"{mode}: held-out accuracy (greedy, 16 new tokens)")
        ax.set_xlabel("wall-clock minutes (version published)")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel("held-out accuracy")
    fig.tight_layout()
    fig.savefig(args.out / "real-model-curves.png", dpi=110)
    for mode, data in report["modes"].items():
        low, high = data["ci95"]
        print(
            f"{mode}: {data['meanBefore']:.3f} -> {data['meanAfter']:.3f} at version {at} "
            f"(~{data['meanSecondsToVersion'] / 60:.1f} min): gain {data['meanGain']:+.3f}, 95% CI [{low:+.3f}, {high:+.3f}]"
        )


if __name__ == "__main__":
    main()
