"""Store size over a run: what the trainer's retention keeps while the job runs, version by version.

Reads a finished ``echorl run``'s ``metrics.jsonl`` (the trainer's records carry ``snapshotsKept``,
``storeBytes``, ``snapshotsCollected`` and ``retentionFailures``, :mod:`echo_runtime.trainer.collect`)
and its ``job.yaml`` (``keepLast``, the bound), and writes a JSON summary and a PNG of the versions and
bytes the store held after each collection, against the ceiling ``max(keepLast, bound + 1)`` versions
(pinned versions come on top). Also reports the run's peak memory per process from ``summary.json``.

    echorl run examples/quickstart.yaml --fresh --no-progress --run-dir runs/retention
    python benchmarks/retention.py runs/retention            # → benchmarks/results/retention.{json,png}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from echo_runtime import spec, staleness

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=RESULTS / "retention.json")
    opts = parser.parse_args()
    job = spec.load_job(opts.run_dir / "job.yaml")
    retention = job.sync_policy.retention
    bound = staleness.StalenessPolicy.from_spec(job.sync_policy).bound
    ceiling = max(retention.keep_last, bound + 1)
    records = [json.loads(line) for line in (opts.run_dir / "metrics.jsonl").read_text().splitlines() if line]
    trainer = sorted(
        (r for r in records if r.get("kind") == "trainer" and "snapshotsKept" in r),
        key=lambda r: r["policyVersion"],
    )
    if not trainer:
        print(
            f"{opts.run_dir}: no trainer record carries snapshotsKept (a run from before in-run retention?)"
        )
        return 1
    versions = [r["policyVersion"] for r in trainer]
    kept = [r["snapshotsKept"] for r in trainer]
    stored = [r.get("storeBytes", 0) / 2**20 for r in trainer]
    summary: dict[str, Any] = json.loads((opts.run_dir / "summary.json").read_text())
    report = {
        "benchmark": "retention",
        "job": job.name,
        "keepLast": retention.keep_last,
        "checkpointKeepLast": retention.checkpoint_keep_last,
        "bound": bound,
        "ceilingVersions": ceiling,
        "lastVersion": versions[-1],
        "maxSnapshotsKept": max(kept),
        "withinCeiling": max(kept) <= ceiling,
        "maxStoreMiB": round(max(stored), 2),
        "finalStoreMiB": round(stored[-1], 2),
        "snapshotsCollected": trainer[-1].get("snapshotsCollected"),
        "retentionFailures": trainer[-1].get("retentionFailures"),
        "memory": summary.get("memory"),
        "wallClockSeconds": summary.get("wallClockSeconds"),
        "series": {
            "policyVersion": versions,
            "snapshotsKept": kept,
            "storeMiB": [round(s, 3) for s in stored],
        },
    }
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report, indent=2) + "\n")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
    left.step(versions, kept, where="post", label="versions in the store")
    left.axhline(
        ceiling,
        color="tab:red",
        linestyle="--",
        label=f"max(keepLast {retention.keep_last}, bound {bound} + 1)",
    )
    left.set_xlabel("policy version")
    left.set_ylabel("versions")
    left.set_ylim(0, ceiling + 2)
    left.legend(loc="lower right")
    left.grid(alpha=0.3)
    right.plot(versions, stored, label="snapshots + checkpoints")
    right.set_xlabel("policy version")
    right.set_ylabel("MiB in the store")
    right.set_ylim(bottom=0)
    right.grid(alpha=0.3)
    right.legend(loc="lower right")
    fig.suptitle(f"{job.name}: the store while the job runs ({versions[-1]} versions published)")
    png = opts.out.with_suffix(".png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    print(json.dumps({k: v for k, v in report.items() if k != "series"}, indent=2))
    print(f"→ {opts.out}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
