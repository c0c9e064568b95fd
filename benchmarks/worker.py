"""Worker overhead benchmark: rollouts/s through the real worker loop vs the backend called directly.

Issue 6's target: the worker's sampling throughput is ≥ 0.85 × that of calling the backend directly on
the same batch. Both paths run in this process, on one ``transformers`` backend object (``echorl:tiny``,
CPU, the same torch threads), interleaved repetition by repetition (worker then direct, direct then
worker, ...) on the same prompts, so a neighbour's load on a shared machine hits both alike:

* **worker**: :class:`echo_runtime.worker.loop.Worker` — the loop ``echorl worker`` runs — against a
  real coordinator process on loopback HTTP (started as ``echorl run`` starts it: heartbeat 1 s, lease
  timeout 15 s), whose job reads a local snapshot store holding version 0. Each repetition is one
  ``Worker.run(max_groups=G)`` with a fresh client: register, heartbeat thread, then per round a version
  check, a lease of ``capacity`` tasks, one ``backend.sample`` of those prompts, one submission per
  group (the coordinator re-scores it with the task's verifier and buffers it), and finally leave.
  Rollouts/s = ``G × groupSize`` over the wall-clock of ``run``, everything included.
* **direct**: ``backend.sample(prompts, groupSize, params)`` on the same G prompts (the coordinator's
  train stream, replicated here and checked against what the worker leased), chunked as the worker's
  leases chunk them (``capacity`` prompts per call), with the sampling parameters the coordinator hands
  out. Rollouts/s over the wall-clock of those calls.

Why the trainer never has to run: the job is **Async** with ``bufferSize`` larger than every group the
benchmark leases (warm-up included), so leasing never pauses for backpressure, no batch is pulled, no
version is published beyond 0 and ``t_train`` stays 0 — the worker is never starved and never told to
load (its ``loadSeconds`` stays 0; it is reported to show that). Completions have a fixed length: the
backend's EOS set is emptied for both paths (as ``benchmarks/backends.py`` does), so each group is the
same amount of decoding whichever path samples it (``--natural-eos`` keeps the tokenizer's EOS).

Reported per repetition and as medians: the ratio worker/direct rollouts/s (the headline, target ≥ 0.85
printed beside it), and where the worker's extra time goes: its ``sample_seconds`` / ``load_seconds``
counters and the time spent in the client's lease, submit and register+leave calls (a timing subclass
of ``WorkerClient``; ``other`` is the rest of the loop). Two cross-checks: ``sampleShare``, the worker's
``sample_seconds`` ÷ its wall-clock — the same ratio if ``backend.sample`` runs as fast inside the loop
as alone, measured within one pass and so nearly immune to load drift — and ``sampleVsDirect``, the
worker's ``sample_seconds`` ÷ the direct path's time (is sampling itself slower inside the loop?).
On a busy 2-core machine the
paired wall-clock ratios of single repetitions scatter widely (a neighbour's burst lands on one path);
their median over many short repetitions is the estimate, and ``sampleShare`` says what it should be.

    python benchmarks/worker.py            # 30 repetitions, ~3 min on 2 busy cores (load 5); writes
                                           # benchmarks/results/worker.json
    python benchmarks/worker.py --quick    # 6 repetitions, ~50 s on 2 busy cores (load 7), ~25 s idle
    python benchmarks/worker.py --capacity 4 --groups 16   # 4 tasks per lease (4 prompts per sample call)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runtime"))

RESULTS = REPO / "benchmarks" / "results" / "worker.json"
TARGET = 0.85
POOL = "bench"
JOB = "bench-worker"


def job_document(store: Path, args: argparse.Namespace, buffer_groups: int) -> dict[str, Any]:
    """The EchoJob both paths share: Async, a buffer that never fills, the manifest's sampling defaults."""
    return {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": JOB},
        "spec": {
            "model": {"path": args.model},
            "task": {"name": "arithmetic"},
            "algorithm": {"groupSize": args.group_size, "sampling": {"maxNewTokens": args.max_new_tokens}},
            "syncPolicy": {"mode": "Async", "bufferSize": buffer_groups},
            "storage": {"type": "Local", "path": str(store)},
            "inferenceSwarms": [{"name": POOL, "capacity": args.capacity}],
        },
    }


def timed_client_class() -> type[Any]:
    """A ``WorkerClient`` that adds up the seconds the loop spends in each call and records leased prompts."""
    from echo_runtime.coordinator import client as coord
    from echo_runtime.coordinator import wire

    class TimedClient(coord.WorkerClient):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.seconds = {"lease": 0.0, "submit": 0.0, "registerLeave": 0.0}
            self.leased: list[list[str]] = []
            self.sampling: set[tuple[int, float, float, int]] = set()

        def register(self) -> wire.RegisterReply:
            started = time.perf_counter()
            try:
                return super().register()
            finally:
                if threading.current_thread() is threading.main_thread():
                    self.seconds["registerLeave"] += time.perf_counter() - started

        def leave(self) -> None:
            started = time.perf_counter()
            try:
                super().leave()
            finally:
                self.seconds["registerLeave"] += time.perf_counter() - started

        def lease(
            self, max_tasks: int = 1, wait: float = 0.0, loaded_version: int | None = None
        ) -> wire.LeaseReply:
            started = time.perf_counter()
            reply = super().lease(max_tasks, wait, loaded_version)
            self.seconds["lease"] += time.perf_counter() - started
            if reply.tasks:
                self.leased.append(
                    [t.prompt for t in reply.tasks if isinstance(t.prompt, str)]
                )  # text tasks here
                self.sampling.update(
                    (t.group_size, t.sampling.temperature, t.sampling.top_p, t.sampling.max_new_tokens)
                    for t in reply.tasks
                )
            return reply

        def submit(self, task_id: str, rollouts: Sequence[Any]) -> wire.SubmitReply:
            started = time.perf_counter()
            try:
                return super().submit(task_id, rollouts)
            finally:
                self.seconds["submit"] += time.perf_counter() - started

    return TimedClient


def chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="echorl:tiny", help="model path or echorl:<size>")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both paths (default 1)")
    parser.add_argument(
        "--capacity",
        type=int,
        default=1,
        help="tasks per lease = prompts per sample call (manifest default 1)",
    )
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per group (manifest default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="manifest default 32")
    parser.add_argument("--groups", type=int, default=8, help="groups per path per repetition")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="6 repetitions")
    parser.add_argument("--natural-eos", action="store_true", help="keep EOS: completion lengths vary")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="ECHORL_CACHE_DIR for the model (default: Echo's cache)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.repeats = 6
    if args.groups % args.capacity:
        parser.error("--groups must be a multiple of --capacity (every lease is full)")
    threads = str(args.threads)
    os.environ.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, ECHORL_THREADS=threads)
    if args.cache_dir is not None:
        os.environ["ECHORL_CACHE_DIR"] = str(args.cache_dir.resolve())

    import torch

    from echo_runtime import backends, snapshots, spec, tasks
    from echo_runtime.backends import base
    from echo_runtime.coordinator import auth
    from echo_runtime.coordinator import client as coord
    from echo_runtime.models import load as model_load
    from echo_runtime.runner.local import free_port
    from echo_runtime.runner.procs import NotHealthy, Processes, wait_healthy
    from echo_runtime.worker.loop import Worker

    warmup_groups = args.groups
    total_groups = warmup_groups + args.groups * args.repeats
    load_before = os.getloadavg()
    started_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="echorl-bench-worker-") as tmp:
        root = Path(tmp)
        job_file = root / "job.yaml"
        job_file.write_text(json.dumps(job_document(root / "store", args, total_groups + args.capacity)))
        job = spec.load_job(job_file)
        model_dir = Path(model_load.resolve_spec(job.spec.model, job.spec.task))
        store = snapshots.open_store(job.spec.storage, job.name)
        store.publish(
            0, {"model.safetensors": model_dir / "model.safetensors"}, kind="full", base_model=args.model
        )
        tokens = auth.generate([POOL])
        tokens_file = root / "tokens.json"
        tokens_file.write_text(json.dumps(tokens))
        tokens_file.chmod(0o600)

        procs = Processes(root / "logs")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        child = procs.start(
            "coordinator",
            [
                *(sys.executable, "-m", "echo_runtime.cli", "coordinator"),
                *("--job", str(job_file), "--port", str(port), "--tokens-file", str(tokens_file)),
                *("--heartbeat-interval", "1", "--lease-timeout", "15"),
            ],
            env={
                "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1",
                "ECHORL_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")) if p
                ),
            },
        )
        clients: list[Any] = []
        try:
            backend: Any = backends.create_backend(
                "transformers", model_dir, device="cpu", threads=args.threads
            )
            if not args.natural_eos:
                backend.eos_ids = frozenset({-1})  # no token is EOS: every row decodes max_new_tokens
            try:
                wait_healthy(url, child)
            except NotHealthy as exc:
                raise SystemExit(str(exc)) from exc
            sampling = job.spec.algorithm.sampling
            params = base.SamplingParams(  # what the coordinator hands out, as the worker builds it
                temperature=sampling.temperature, top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens
            )
            same_sampling = (args.group_size, params.temperature, params.top_p, params.max_new_tokens)
            stream: Iterator[Any] = tasks.get_task(job.spec.task.name, job.spec.task.options).prompts(
                "train", job.spec.algorithm.seed
            )
            TimedClient = timed_client_class()

            def run_worker(prompts: list[str]) -> dict[str, Any]:
                client = TimedClient(
                    url,
                    tokens["pools"][POOL],
                    pool=POOL,
                    backend=backend.name,
                    device=backend.device,
                    dtype=backend.dtype,
                    capacity=args.capacity,
                    host="bench",
                )
                clients.append(client)
                (root / "workers").mkdir(exist_ok=True)
                worker = Worker(
                    backend,
                    client,
                    store,
                    root / "cache" / f"w{len(clients)}",
                    capacity=args.capacity,
                    metrics_path=root / "workers" / f"w{len(clients)}.jsonl",
                )
                watchdog = threading.Timer(120.0, worker.stop)  # a stuck loop fails the run, not hangs it
                watchdog.start()
                t0 = time.perf_counter()
                try:
                    worker.run(max_groups=len(prompts))
                finally:
                    seconds = time.perf_counter() - t0
                    watchdog.cancel()
                if worker.groups != len(prompts):
                    raise SystemExit(f"the worker submitted {worker.groups} of {len(prompts)} groups")
                leased = [p for lease in client.leased for p in lease]
                if leased != prompts or any(len(lease) != args.capacity for lease in client.leased):
                    raise SystemExit(
                        "the worker leased other prompts (or batches) than the direct path samples"
                    )
                if client.sampling != {same_sampling}:
                    raise SystemExit(
                        f"the worker sampled with {client.sampling}, the direct path {same_sampling}"
                    )
                overhead = dict(client.seconds)
                accounted = worker.sample_seconds + worker.load_seconds + sum(overhead.values())
                return {
                    "seconds": seconds,
                    "rollouts": worker.rollouts,
                    "rolloutsPerSecond": worker.rollouts / seconds,
                    "sampleSeconds": worker.sample_seconds,
                    "loadSeconds": worker.load_seconds,
                    "loads": worker.loads,
                    **{f"{k}Seconds": v for k, v in overhead.items()},
                    "otherSeconds": seconds - accounted,
                    "registrations": client.registrations,
                }

            def run_direct(prompts: list[str]) -> dict[str, Any]:
                rollouts = 0
                t0 = time.perf_counter()
                for chunk in chunks(prompts, args.capacity):
                    groups = backend.sample(chunk, args.group_size, params)
                    rollouts += sum(len(g) for g in groups)
                seconds = time.perf_counter() - t0
                return {
                    "seconds": seconds,
                    "rollouts": rollouts,
                    "rolloutsPerSecond": rollouts / seconds,
                }

            def take(n: int) -> list[str]:
                return [next(stream).prompt for _ in range(n)]

            warm = take(args.groups)  # warm-up: allocator, lazy inits, the coordinator's first requests
            run_worker(warm)
            run_direct(warm)
            reps: list[dict[str, Any]] = []
            print(
                f"{args.repeats} repetitions × {args.groups} groups × {args.group_size} rollouts "
                f"({args.max_new_tokens} tokens), capacity {args.capacity}, {args.threads} thread(s)",
                flush=True,
            )
            for rep in range(args.repeats):
                prompts = take(args.groups)
                order = ("worker", "direct") if rep % 2 == 0 else ("direct", "worker")
                out: dict[str, Any] = {}
                for path in order:
                    out[path] = run_worker(prompts) if path == "worker" else run_direct(prompts)
                w, d = out["worker"], out["direct"]
                if w["rollouts"] != d["rollouts"]:
                    raise SystemExit(f"rollout counts differ: worker {w['rollouts']}, direct {d['rollouts']}")
                entry = {
                    "order": list(order),
                    "ratio": w["rolloutsPerSecond"] / d["rolloutsPerSecond"],
                    "sampleVsDirect": w["sampleSeconds"] / d["seconds"],
                    "sampleShare": w["sampleSeconds"] / w["seconds"],
                    "worker": w,
                    "direct": d,
                }
                reps.append(entry)
                print(
                    f"  rep {rep + 1:>2} ({order[0]} first): worker {w['rolloutsPerSecond']:6.1f}, "
                    f"direct {d['rolloutsPerSecond']:6.1f} rollouts/s, ratio {entry['ratio']:.3f}, "
                    f"sample in loop/direct {entry['sampleVsDirect']:.3f}, worker sample share {entry['sampleShare']:.3f} "
                    f"(lease {w['leaseSeconds'] * 1e3:.0f} ms, submit {w['submitSeconds'] * 1e3:.0f} ms, "
                    f"register+leave {w['registerLeaveSeconds'] * 1e3:.0f} ms, "
                    f"other {w['otherSeconds'] * 1e3:.0f} ms of {w['seconds']:.2f} s)",
                    flush=True,
                )
            with coord.TrainerClient(url, tokens["trainer"], timeout=5.0) as status_client:
                status = status_client.status()
            if status.buffer.groups != total_groups or status.dropped_stale or status.policy_version != 0:
                raise SystemExit(
                    f"the coordinator buffered {status.buffer.groups} of {total_groups} groups "
                    f"(dropped {status.dropped_stale}, policy version {status.policy_version})"
                )
        finally:
            for c in clients:
                with contextlib.suppress(Exception):
                    c.close()
            procs.stop_all(grace_s=10.0)

    ratios = [r["ratio"] for r in reps]
    ratio = statistics.median(ratios)
    groups_per_rep = int(args.groups)

    def per_group_ms(key: str, path: str = "worker") -> float:
        return round(_median([float(r[path][key]) for r in reps]) / groups_per_rep * 1e3, 3)

    worker_rps = _median([r["worker"]["rolloutsPerSecond"] for r in reps])
    direct_rps = _median([r["direct"]["rolloutsPerSecond"] for r in reps])
    per_group = {
        "workerWall": per_group_ms("seconds"),
        "directWall": per_group_ms("seconds", "direct"),
        "workerSample": per_group_ms("sampleSeconds"),
        "workerLoad": per_group_ms("loadSeconds"),
        "lease": per_group_ms("leaseSeconds"),
        "submit": per_group_ms("submitSeconds"),
        "registerLeave": per_group_ms("registerLeaveSeconds"),
        "other": per_group_ms("otherSeconds"),
    }
    extra = {
        "perGroupMs": per_group,
        "note": (
            "median over repetitions of each component, per group; submit includes the coordinator's "
            "re-scoring; registerLeave is once per repetition (one Worker.run each); other is the loop's own "
            "Python (building RolloutIn, the metrics line, the heartbeat thread's share of the GIL)"
        ),
    }
    result = {
        "benchmark": "worker loop vs backend.sample on the same batch",
        "ratio": round(ratio, 4),
        "target": TARGET,
        "meetsTarget": ratio >= TARGET,
        "ratioDefinition": "median over repetitions of worker rollouts/s ÷ direct rollouts/s (paired)",
        "ratios": [round(x, 4) for x in ratios],
        "ratioOfMedians": round(worker_rps / direct_rps, 4),
        "sampleVsDirect": round(_median([r["sampleVsDirect"] for r in reps]), 4),
        "sampleVsDirectDefinition": (
            "median of the worker's sample_seconds ÷ the direct path's seconds (paired): whether the same "
            "backend.sample calls run slower inside the loop than alone (1 = as fast)"
        ),
        "sampleShare": round(_median([r["sampleShare"] for r in reps]), 4),
        "sampleShareDefinition": (
            "median of the worker's sample_seconds ÷ its wall-clock: the ratio if backend.sample ran as fast "
            "inside the loop as alone, measured within one pass (no drift between the two paths)"
        ),
        "workerRolloutsPerSecond": {
            "median": round(worker_rps, 2),
            "min": round(min(r["worker"]["rolloutsPerSecond"] for r in reps), 2),
            "max": round(max(r["worker"]["rolloutsPerSecond"] for r in reps), 2),
        },
        "directRolloutsPerSecond": {
            "median": round(direct_rps, 2),
            "min": round(min(r["direct"]["rolloutsPerSecond"] for r in reps), 2),
            "max": round(max(r["direct"]["rolloutsPerSecond"] for r in reps), 2),
        },
        "workerExtraTime": extra,
        "repetitions": reps,
        "coordinator": {
            "policyVersion": status.policy_version,
            "bufferedGroups": status.buffer.groups,
            "bufferCapacity": status.buffer.capacity,
            "droppedStale": status.dropped_stale,
        },
        "setup": {
            "model": args.model,
            "backend": "transformers",
            "device": "cpu",
            "mode": "Async",
            "bufferGroups": total_groups + args.capacity,
            "capacity": args.capacity,
            "groupSize": args.group_size,
            "maxNewTokens": args.max_new_tokens,
            "fixedLength": not args.natural_eos,
            "groupsPerRepetition": args.groups,
            "repeats": args.repeats,
            "warmupGroups": warmup_groups,
            "threads": args.threads,
            "heartbeatIntervalSeconds": 1.0,
            "quick": args.quick,
        },
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadAverageBefore": [round(x, 2) for x in load_before],
            "loadAverageAfter": [round(x, 2) for x in os.getloadavg()],
        },
        "wallSeconds": round(time.perf_counter() - started_all, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    parts = ", ".join(f"{k} {v}" for k, v in per_group.items())
    print(f"worker extra time per group (ms, medians): {parts}")
    print(
        f"cross-checks: sample in loop/direct {result['sampleVsDirect']:.3f}, worker sample share {result['sampleShare']:.3f}, "
        f"ratio of medians {result['ratioOfMedians']:.3f}"
    )
    print(
        f"worker/direct rollouts/s: median ratio {ratio:.3f} (target ≥ {TARGET}, "
        f"{'met' if ratio >= TARGET else 'NOT met'}); worker {worker_rps:.1f}, direct {direct_rps:.1f} "
        f"rollouts/s → {args.out}"
    )


if __name__ == "__main__":
    main()
