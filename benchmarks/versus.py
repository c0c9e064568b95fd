"""Before/after: one benchmark script, run alternately from two commits' trees in one session.

A refactor must not slow Echo down, and two separate runs on a shared machine differ by more than a
refactor would. This runs the *same* benchmark from a base commit (checked out as a git worktree in a
temporary directory) and from this working tree, alternating base, head, head, base, ... (ABBA, so
neither side always runs first) for ``--rounds`` rounds, each side importing its own ``echo_runtime`` (``PYTHONPATH``) and running its own
copy of the script. It then reads the named metrics from each run's JSON and reports, per metric, each
side's median and the ratio head ÷ base of the medians, with the spread of the per-round ratios.

    python benchmarks/versus.py --base 22c51e6 --rounds 3 \\
        --metric 'ratio' -- benchmarks/trainer.py --quick
    python benchmarks/versus.py --base 22c51e6 --rounds 2 \\
        --metric 'results[workers=1000,mode=saturate].rolloutsPerSecond' \\
        --metric 'results[workers=1000,mode=paced].submitLatencyMs.p99' \\
        -- benchmarks/coordinator.py --quick --workers 1000

A metric is a dotted path into the script's JSON (``--out`` is added to the script's arguments); a
``name[key=value,...]`` step picks the one element of the list ``name`` whose fields match. Writes
``benchmarks/results/versus-<script>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_STEP = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:\[(?P<where>[^\]]*)\])?$")


def pick(data: Any, path: str) -> float:
    """The number at ``path`` (see the module docstring) in ``data``; a KeyError names the step."""
    here = data
    for step in path.split("."):
        m = _STEP.match(step)
        if m is None:
            raise KeyError(f"{path}: cannot read the step {step!r}")
        here = here[m["name"]]
        if m["where"] is not None:
            wanted = dict(part.split("=", 1) for part in m["where"].split(","))
            hits = [x for x in here if all(str(x.get(k)) == v for k, v in wanted.items())]
            if len(hits) != 1:
                raise KeyError(f"{path}: {len(hits)} elements of {m['name']} match {wanted}, need exactly 1")
            here = hits[0]
    return float(here)


def run_side(tree: Path, script: str, args: list[str], out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'runtime'}{os.pathsep}{tree / 'operator'}"}
    cmd = [sys.executable, str(tree / script), *args, "--out", str(out)]
    print(f"[versus] {tree.name}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the commit to compare against (any git revision)")
    parser.add_argument("--rounds", type=int, default=3, help="base/head pairs to run (default 3)")
    parser.add_argument("--metric", action="append", required=True, help="a dotted path into the JSON")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("script", help="the benchmark script, relative to the repository root")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    opts = parser.parse_args()
    # Stopped with SIGTERM (a CI timeout, kill), still remove the temporary worktree: exit through `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = [a for a in opts.args if a != "--"]
    if opts.rounds < 1:
        parser.error("--rounds must be ≥ 1")
    base_rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{opts.base}^{{commit}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    head_rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="echorl-versus-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base_tree), base_rev],
            check=True,
        )
        try:
            values: dict[str, dict[str, list[float]]] = {m: {"base": [], "head": []} for m in opts.metric}
            for i in range(opts.rounds):
                order = (("base", base_tree), ("head", ROOT))
                for side, tree in order if i % 2 == 0 else order[::-1]:  # ABBA: no side always goes first
                    data = run_side(tree, opts.script, args, Path(tmp) / f"{side}-{i}.json")
                    for metric in opts.metric:
                        values[metric][side].append(pick(data, metric))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False
            )
    report: dict[str, Any] = {
        "benchmark": "versus",
        "script": opts.script,
        "args": args,
        "base": base_rev,
        "head": head_rev,
        "dirty": bool(
            subprocess.run(
                ["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True
            ).stdout
        ),
        "rounds": opts.rounds,
        "metrics": {},
    }
    print(f"\n{'metric':60} {'base median':>12} {'head median':>12} {'head/base':>10}  per-round ratios")
    for metric, sides in values.items():
        base_med, head_med = statistics.median(sides["base"]), statistics.median(sides["head"])
        rounds = [h / b if b else float("nan") for b, h in zip(sides["base"], sides["head"], strict=True)]
        ratio = head_med / base_med if base_med else float("nan")
        report["metrics"][metric] = {
            **sides,
            "baseMedian": base_med,
            "headMedian": head_med,
            "ratio": ratio,
            "roundRatios": rounds,
        }
        print(
            f"{metric:60} {base_med:12.4g} {head_med:12.4g} {ratio:10.3f}  {', '.join(f'{r:.3f}' for r in rounds)}"
        )
    out = opts.out or ROOT / "benchmarks" / "results" / f"versus-{Path(opts.script).stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"→ {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
