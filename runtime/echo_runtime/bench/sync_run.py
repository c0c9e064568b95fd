"""``echorl bench sync``, the shell: run the grid of sync configurations × seeds, then aggregate and plot.

Every run is a plain ``echorl run`` subprocess (``--fresh --no-progress --target-accuracy X``) of the
*same* manifest with only these fields changed: ``metadata.name`` (one per run), ``spec.syncPolicy``
(mode, ``maxStaleness``; ``bufferSize`` kept only for Async, ``refreshThreshold`` 0),
``spec.algorithm.seed`` (the seed of prompt order, sampling and LoRA initialisation — the base model,
and its warm-up, are the same in every run) and ``spec.storage`` (a local store under ``--out``).

Fairness: runs execute one at a time, so configurations never compete for the CPU, and in the order
seed-major (every configuration once per seed, then the next seed), so slow drift in the machine's
load spreads over all of them. Each run gets the same ``--cores``; ``echorl run`` splits them as it
always does — decoupled modes: trainer ⌊cores/2⌋ threads, the workers the rest; Colocated: every core
in both phases; the evaluator 1 thread in every mode.

Layout of ``--out``::

    <config>/seed<k>/       the run directory of each run (summary.json, metrics.jsonl, logs/)
    <config>/seed<k>.yaml   the manifest it ran
    results.json, results.md, accuracy_vs_wallclock.png, staleness.png, speedup.png
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from echo_runtime.bench import sync
from echo_runtime.spec import load as spec_load

QUICK_CONFIGS = ("Colocated", "Sequential", "Async:2")
FULL_CONFIGS = ("Colocated", "Sequential", "Async:0", "Async:1", "Async:2", "Async:4", "Async:8")


@dataclasses.dataclass(frozen=True)
class Config:
    """One sync configuration of the grid."""

    mode: str
    max_staleness: int

    @property
    def name(self) -> str:
        return f"Async:{self.max_staleness}" if self.mode == "Async" else self.mode

    @property
    def slug(self) -> str:
        return self.name.lower().replace(":", "")


def parse_configs(text: str) -> list[Config]:
    """``Colocated,Sequential,Async:0,Async:2`` → configurations; a ValueError says what is allowed."""
    out: list[Config] = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        match = re.fullmatch(r"(Colocated|Sequential)|Async:(\d+)", item)
        if match is None:
            raise ValueError(f"configuration {item!r}: expected Colocated, Sequential or Async:<Δmax>")
        config = Config(match.group(1), 0) if match.group(1) else Config("Async", int(match.group(2)))
        if config in out:
            raise ValueError(f"configuration {item!r} is listed twice")
        out.append(config)
    if not out:
        raise ValueError("no configurations given")
    return out


@dataclasses.dataclass(frozen=True)
class Options:
    job: Path
    out: Path
    configs: tuple[Config, ...]
    seeds: int
    max_steps: int | None
    target_accuracy: float | None
    cores: int | None = None
    resume_grid: bool = False
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Extra ``spec`` fields merged into every manifest (the ``--quick`` preset's smaller task)."""
    run_timeout_s: float = 3600.0
    framing: str = "equal"
    """``equal``: every run gets ``cores``. ``offload`` (the paper's thesis: generation moves to added
    hardware): Colocated gets only the trainer's share of them, the decoupled runs all of them, the
    trainer on the same CPUs as Colocated and the workers on the added ones; every process pinned."""


def manifest_for(
    base: dict[str, Any], config: Config, seed: int, store: Path, overrides: dict[str, Any]
) -> dict[str, Any]:
    """The EchoJob document of one run (module docstring: which fields change, and nothing else)."""
    doc: dict[str, Any] = json.loads(json.dumps(base))  # a deep copy of plain YAML data
    spec = doc.setdefault("spec", {})
    for key, value in overrides.items():
        if isinstance(value, dict):
            spec.setdefault(key, {}).update(value)
        else:
            spec[key] = value
    name = str(doc.get("metadata", {}).get("name", "job"))
    doc.setdefault("metadata", {})["name"] = f"{name}-{config.slug}-s{seed}"[:63].rstrip("-")
    sync_policy = dict(spec.pop("syncPolicy", None) or {})
    spec.pop("syncPolicyRef", None)
    sync_policy.update(mode=config.mode, maxStaleness=config.max_staleness, refreshThreshold=0)
    if config.mode != "Async":
        sync_policy.pop("bufferSize", None)
    spec["syncPolicy"] = sync_policy
    spec["storage"] = {"type": "Local", "path": str(store)}
    return spec_load.seeded(doc, seed)  # as `echorl run --seed` does


def load_job_document(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The EchoJob of ``path`` and any other documents (referenced objects travel unchanged)."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    jobs = [d for d in docs if d.get("kind") == "EchoJob"]
    if len(jobs) != 1:
        raise ValueError(f"{path}: expected exactly one EchoJob document, found {len(jobs)}")
    return jobs[0], [d for d in docs if d is not jobs[0]]


def _finished(run_dir: Path, max_steps: int | None) -> bool:
    summary = run_dir / "summary.json"
    if not summary.exists():
        return False
    version = json.loads(summary.read_text()).get("policyVersion")
    return version is not None and (max_steps is None or version >= max_steps)


def run_grid(options: Options, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every (seed, configuration) not yet finished, then aggregate and plot; return results."""
    base, others = load_job_document(options.job)
    options.out.mkdir(parents=True, exist_ok=True)
    store = (options.out / "store").resolve()
    total = len(options.configs) * options.seeds
    started = time.monotonic()
    failures: list[dict[str, Any]] = []
    done = 0
    for seed in range(options.seeds):
        for config in options.configs:
            done += 1
            run_dir = (options.out / config.slug / f"seed{seed}").resolve()
            if options.resume_grid and _finished(run_dir, options.max_steps):
                log(f"[{done}/{total}] {config.name} seed {seed}: finished before, skipped")
                continue
            manifest = run_dir.parent / f"seed{seed}.yaml"
            manifest.parent.mkdir(parents=True, exist_ok=True)
            doc = manifest_for(base, config, seed, store, options.overrides)
            manifest.write_text(yaml.safe_dump_all([doc, *others], sort_keys=False))
            argv = [sys.executable, "-m", "echo_runtime.cli", "run", str(manifest), "--fresh", "--no-progress",
                    "--run-dir", str(run_dir)]  # fmt: skip
            if options.max_steps is not None:
                argv += ["--max-steps", str(options.max_steps)]
            if options.target_accuracy is not None:
                argv += ["--target-accuracy", str(options.target_accuracy)]
            argv += run_cores(options, config)
            log(
                f"[{done}/{total}] {config.name} seed {seed}: running ({time.monotonic() - started:.0f}s elapsed)"
            )
            run_started = time.monotonic()
            console = run_dir.parent / f"seed{seed}.log"
            with console.open("w") as out:
                code = _run_once(argv, out, options.run_timeout_s)
            if code != 0:
                failures.append({"config": config.name, "seed": seed, "exitCode": code, "log": str(console)})
                log(f"    failed with exit code {code}; see {console}")
            else:
                log(f"    done in {time.monotonic() - run_started:.0f}s")
    results = collect(options, failures)
    write_outputs(results, options.out)
    return results


def run_cores(options: Options, config: Config) -> list[str]:
    """The ``echorl run`` flags that give one run its CPUs (:attr:`Options.framing`)."""
    if options.framing not in ("equal", "offload"):
        raise ValueError(f"framing: expected equal or offload, got {options.framing!r}")
    if options.framing == "equal":
        return [] if options.cores is None else ["--cores", str(options.cores)]
    from echo_runtime.runner import cpus

    cores = options.cores or len(os.sched_getaffinity(0))
    if cores < 2:
        raise ValueError("the offload framing needs at least 2 cores: the trainer's and an added one")
    if config.mode == "Colocated":
        return ["--cores", str(cpus.plan_cores(cores, 1).trainer), "--pin-cores"]
    return ["--cores", str(cores), "--pin-cores"]


def _run_once(argv: list[str], out: IO[str], timeout_s: float) -> int:
    """One ``echorl run``; past ``timeout_s`` it gets SIGTERM (it stops its own processes, which run in
    sessions of their own and would survive a SIGKILL of the runner), SIGKILL only if that hangs."""
    proc = subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        out.write(f"\n[echorl bench sync] run timed out after {timeout_s:.0f}s: stopping it\n")
        out.flush()
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return -1
    except BaseException:  # Ctrl-C of the grid: the run in flight stops its processes too
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        raise


def collect(options: Options, failures: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Read every finished run of the grid and aggregate them (runs without a summary are skipped)."""
    from echo_runtime.runner import metrics

    runs: dict[str, list[dict[str, Any]]] = {}
    per_run: list[dict[str, Any]] = []
    for config in options.configs:
        for seed in range(options.seeds):
            run_dir = options.out / config.slug / f"seed{seed}"
            if not (run_dir / "summary.json").exists():
                continue
            summary = json.loads((run_dir / "summary.json").read_text())
            measures = sync.run_measures(
                summary,
                metrics.read_records(run_dir / "metrics.jsonl"),
                options.target_accuracy,
                snapshot_traffic(run_dir, options.out / "store"),
            )
            runs.setdefault(config.name, []).append(measures)
            per_run.append({"config": config.name, "seed": seed, **measures})
    results = sync.aggregate(runs, options.target_accuracy, framing=options.framing)
    results["runs"] = per_run
    results["failures"] = list(failures)
    results["grid"] = {
        "job": str(options.job),
        "configs": [c.name for c in options.configs],
        "seeds": options.seeds,
        "maxSteps": options.max_steps,
        "overrides": options.overrides,
        "cores": options.cores or os.cpu_count(),
        "framing": options.framing,
        "coreSplit": _core_split(options.cores or os.cpu_count() or 1, options.framing),
    }
    results["machine"] = machine()
    return results


def snapshot_traffic(run_dir: Path, store: Path) -> dict[str, float]:
    """The workers' snapshot loads (``load`` events of ``workers/*.jsonl``) and the bytes they moved:
    per load, the bytes the run's local store holds for that version (``snapshots/<v>/data-*``); a
    version retention has collected counts as the median of those still held (``bench/sync.py``)."""
    from echo_runtime.runner import metrics

    loads = [
        int(r["version"])
        for path in sorted((run_dir / "workers").glob("*.jsonl"))
        for r in metrics.read_records(path)
        if r.get("event") == "load" and r.get("version") is not None
    ]
    job = yaml.safe_load((run_dir / "job.yaml").read_text()) if (run_dir / "job.yaml").exists() else {}
    name = str(((job or {}).get("metadata") or {}).get("name", ""))
    sizes: dict[int, int] = {}
    snapshots = store / name / "snapshots"
    if name and snapshots.is_dir():
        for entry in snapshots.iterdir():
            if entry.name.isdigit():
                files = [f for data in entry.glob("data-*") for f in data.rglob("*") if f.is_file()]
                if files:
                    sizes[int(entry.name)] = sum(f.stat().st_size for f in files)
    typical = statistics.median(sizes.values()) if sizes else 0.0
    return {"loads": len(loads), "bytes": float(sum(sizes.get(v, typical) for v in loads))}


def _core_split(cores: int, framing: str = "equal") -> dict[str, str]:
    from echo_runtime.runner import cpus

    plan = cpus.plan_cores(cores, 1)
    if framing == "offload":
        return {
            "decoupled": f"trainer pinned to {plan.trainer} CPU(s), the worker to the other "
            f"{cores - plan.trainer} (added hardware), evaluator beside the worker, coordinator unpinned "
            "(mostly idle)",
            "Colocated": f"one process pinned to the trainer's {plan.trainer} CPU(s) for sampling and "
            "training; evaluator on the others",
        }
    return {
        "decoupled": f"trainer {plan.trainer} thread(s), each worker {plan.worker} thread(s), evaluator 1, "
        "coordinator 1 (mostly idle)",
        "Colocated": f"one process with {cores} thread(s) for sampling and for training, evaluator 1",
    }


def machine() -> dict[str, Any]:
    """Where and when the grid ran (for the committed results)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu,
        "cores": os.cpu_count(),
        "command": " ".join(["echorl", *sys.argv[1:]]) if sys.argv else None,
    }


def write_outputs(results: dict[str, Any], out: Path) -> list[Path]:
    """results.json, results.md and the PNG plots; returns their paths."""
    from echo_runtime.bench import sync_plots

    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps(results, indent=2))  # the grid's order, as in the table
    m = results["machine"]
    header = (
        f"# echorl bench sync\n\n`{m['command']}` — {m['date']}, {m['cpu']} ({m['cores']} cores), "
        f"torch {m['torch']}.\n\nCore split: decoupled — {results['grid']['coreSplit']['decoupled']}; "
        f"Colocated — {results['grid']['coreSplit']['Colocated']}.\n\n"
    )
    header += sync.bound_text(results)
    failures = "".join(f"\n- {f['config']} seed {f['seed']} failed (exit {f['exitCode']}): {f['log']}"
                       for f in results.get("failures", []))  # fmt: skip
    paths[1].write_text(
        header + sync.markdown_table(results) + (f"\nFailed runs:{failures}\n" if failures else "")
    )
    paths += sync_plots.plot_all(results, out)
    return paths
