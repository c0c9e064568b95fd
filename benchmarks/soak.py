"""Soak: the quickstart for thousands of versions, sampled for anything that grows without bound.

Runs ``echorl run`` on a job (default ``examples/quickstart.yaml`` for 5000 versions) and, every
``--every`` versions, samples each process's resident memory, open file descriptors and threads, the
snapshot store (bytes, versions, checkpoints, live pins), the coordinator's buffer, leases and the p99
of its request durations (:mod:`echo_runtime.bench.soak`). After the warm-up every series must be
flat (its fitted growth within an allowance) and the bounded ones under their ceiling; a series that
grows fails the run (exit 1). Writes a JSON of every sample and verdict and a PNG.

    python benchmarks/soak.py                                  # 5000 quickstart versions, ~20 min
    python benchmarks/soak.py --steps 500 --job examples/smollm2.yaml --every 10 --name smollm2

(``tests/integration/bench/test_bench_soak.py`` runs a 300-version version in the suite.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from echo_runtime import spec
from echo_runtime.bench import soak

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--job", type=Path, default=ROOT / "examples" / "quickstart.yaml")
    parser.add_argument("--steps", type=int, default=5000, help="policy versions to run (--max-steps)")
    parser.add_argument("--every", type=int, default=50, help="sample every this many versions")
    parser.add_argument(
        "--warmup", type=float, default=0.2, help="share of the versions left out of the slopes (warm-up)"
    )
    parser.add_argument("--name", default="quickstart", help="the outputs are soak-<name>.{json,png}")
    parser.add_argument("--out-dir", type=Path, default=DOCS)
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "soak")
    opts = parser.parse_args()
    job = spec.load_job(opts.job)
    readers = sum(p.replicas if p.replicas is not None else 1 for _, p in job.inference_pools) + 1
    started = time.time()

    def show(s: soak.Sample) -> None:
        rss = " ".join(f"{k}={v:.0f}" for k, v in sorted(s.rss_mib.items()))
        p99 = " ".join(f"{k}={v}" for k, v in s.p99_ms.items())
        print(
            f"v{s.version:5d} {s.time:7.0f}s  RSS MiB {rss}  store {s.store_bytes / 2**20:.1f} MiB "
            f"{s.store_versions}v {s.pins}p  buffer {s.buffer_groups:.0f} leased {s.tasks_leased:.0f}  p99 ms {p99}",
            flush=True,
        )

    code, samples = soak.watch(opts.job, opts.run_dir, every=opts.every, max_steps=opts.steps, on_sample=show)
    if code != 0:
        print(
            f"echorl run exited with {code}: see {opts.run_dir}.soak.log and {opts.run_dir}/logs",
            file=sys.stderr,
        )
        return 1
    checks = soak.judge(samples, warmup=int(opts.warmup * opts.steps), ceilings=soak.ceilings(job, readers))
    for check in checks:
        print(check.describe())
    data = soak.to_json(
        samples,
        checks,
        benchmark="soak",
        job=str(opts.job.relative_to(ROOT) if opts.job.is_relative_to(ROOT) else opts.job),
        steps=opts.steps,
        every=opts.every,
        warmupVersions=int(opts.warmup * opts.steps),
        wallSeconds=round(time.time() - started, 1),
        date=time.strftime("%Y-%m-%d"),
    )
    soak.write(opts.out_dir / f"soak-{opts.name}.json", data)
    soak.plot(
        samples, opts.out_dir / f"soak-{opts.name}.png", f"soak: {opts.job.name}, {opts.steps} versions"
    )
    print(
        f"{'all flat' if data['ok'] else 'SOMETHING GROWS'}; wrote {opts.out_dir}/soak-{opts.name}.{{json,png}}"
    )
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
