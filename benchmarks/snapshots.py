"""Snapshot store benchmark: publish + fetch against the raw ``minio`` SDK, on a real MinIO on loopback.

Three payloads, each measured in the same run against the same server:

* (a) the tiny model's LoRA adapter: peft on ``echorl:tiny``'s Qwen3 config, the default LoRA
  settings of the spec (rank 16 on all seven projections), ~0.3 MB;
* (b) a 40 MB adapter: rank-16 LoRA tensors of a Qwen3-0.6B-shaped model (28 layers), fp32;
* (c) a 1 GiB full state dict (fp32), saved as two 512 MiB safetensors shards plus an index.

For every repetition, in alternating order: **ours** is ``SnapshotStore.publish`` (hashing, upload,
manifest, pointer) then ``SnapshotStore.fetch`` into an empty cache (download, sha256 verification,
atomic rename); **raw** is the SDK's ``put_object`` of each file from disk, then ``get_object`` of
each into a local file, with the SDK's defaults. The ratio of raw time to our time is our share of
the raw throughput. Targets: ratio ≥ 0.8 for (b) and (c) (publish and fetch each), and publish +
fetch of (a) under 50 ms. Both sides move the bytes to and from the same local disk, and both read
each object cold, right after writing it. For reference, some repetitions time a raw read that
also hashes the stream with sha256: the floor of any verified fetch. The load average and the
client's CPU seconds are recorded too: on a busy 2-core machine the sha256 verification (about as
much CPU per byte as the raw transfer itself) no longer overlaps with the transfer.

    python benchmarks/snapshots.py           # ~3 minutes on 2 cores; writes benchmarks/results/snapshots.json
    python benchmarks/snapshots.py --quick   # ~40 s: fewer repetitions, 256 MiB instead of 1 GiB for (c)
    python benchmarks/snapshots.py --endpoint 127.0.0.1:9000 --access-key K --secret-key S   # your server
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "snapshots.json"
MiB = 1024 * 1024
RATIO_TARGET = 0.8
TINY_TARGET_S = 0.050


@dataclass
class Case:
    key: str
    title: str
    make: Callable[[Path], Path]
    reps: int
    kind: str


def tiny_lora(out: Path) -> Path:
    import peft
    import torch
    from transformers import Qwen3ForCausalLM

    from echo_runtime.models import build
    from echo_runtime.snapshots import payloads
    from echo_runtime.spec import LoRA

    torch.manual_seed(0)
    lora = LoRA()
    config = peft.LoraConfig(
        r=lora.rank, lora_alpha=int(lora.alpha), target_modules=lora.target_modules, init_lora_weights=False
    )
    model = peft.get_peft_model(Qwen3ForCausalLM(build.qwen3_config("tiny", eos_token_id=0)), config)
    return payloads.save_peft_adapter(model, out)


def adapter_40mb(out: Path) -> Path:
    import torch

    from echo_runtime.snapshots import payloads

    gen = torch.Generator().manual_seed(0)
    hidden, inter, q_out, kv_out, rank = 1024, 3072, 2048, 1024, 16
    shapes = {
        "q_proj": (hidden, q_out),
        "k_proj": (hidden, kv_out),
        "v_proj": (hidden, kv_out),
        "o_proj": (q_out, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    tensors = {}
    for layer in range(28):
        for module, (fan_in, fan_out) in shapes.items():
            part = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            name = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen)
            tensors[f"{name}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 32,
        "target_modules": sorted(shapes),
        "base_model_name_or_path": "Qwen/Qwen3-0.6B",
        "task_type": "CAUSAL_LM",
    }
    return payloads.save_lora_adapter(tensors, config, out)


def full_state_dict(total_bytes: int) -> Callable[[Path], Path]:
    def make(out: Path) -> Path:
        import torch

        from echo_runtime.snapshots import payloads

        gen = torch.Generator().manual_seed(0)
        per_tensor = 64 * MiB
        state = {
            f"model.layers.{i}.weight": torch.randn(per_tensor // 4, generator=gen)
            for i in range(total_bytes // per_tensor)
        }
        payloads.save_state_dict(state, out, max_shard_bytes=total_bytes // 2)
        return out

    return make


def files_of(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def cpu_s() -> float:
    """CPU seconds (user + system) this process has used so far, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raw_round(
    client: Any, bucket: str, prefix: str, files: list[Path], dest: Path, hashed_first: bool
) -> tuple[float, float, float, float]:
    """The SDK's put_object of each file, then get_object of each into ``dest``, twice: once plain and
    once also hashing the stream with sha256 (the floor of any *verified* fetch, for reference).

    Returns (put s, plain get s, CPU s of put + plain get, hashed get s). The first read after the
    upload is the cold one (MinIO reads past the page cache), as our fetch after our publish is; so
    the two reads alternate between repetitions and only the cold one of each kind is kept (the
    other comes back as NaN).
    """
    cpu_before = cpu_s()
    start = time.perf_counter()
    for f in files:
        with f.open("rb") as fh:
            client.put_object(bucket, f"{prefix}/{f.name}", fh, f.stat().st_size)
    put_s = time.perf_counter() - start
    cpu_put = cpu_s() - cpu_before
    dest.mkdir(parents=True)
    times = {}
    for hashed in (True, False) if hashed_first else (False, True):
        cpu_before = cpu_s()
        start = time.perf_counter()
        _raw_get(client, bucket, prefix, files, dest, hashed=hashed)
        times[hashed] = time.perf_counter() - start
        if not hashed:
            cpu_get = cpu_s() - cpu_before
    nan = float("nan")
    return (
        put_s,
        times[False] if not hashed_first else nan,
        cpu_put + cpu_get,
        times[True] if hashed_first else nan,
    )


def _raw_get(client: Any, bucket: str, prefix: str, files: list[Path], dest: Path, hashed: bool) -> None:
    for f in files:
        digest = hashlib.sha256()
        resp = client.get_object(bucket, f"{prefix}/{f.name}")
        try:
            with (dest / f.name).open("wb") as out:
                for chunk in resp.stream(4 * MiB):
                    out.write(chunk)
                    if hashed:
                        digest.update(chunk)
        finally:
            resp.close()
            resp.release_conn()


def ours_round(store: Any, version: int, folder: Path, kind: str, cache: Path) -> tuple[float, float]:
    start = time.perf_counter()
    store.publish(version, folder, kind=kind, base_model="bench")
    publish_s = time.perf_counter() - start
    start = time.perf_counter()
    store.fetch(version, cache)
    return publish_s, time.perf_counter() - start


def run_case(
    case: Case, store: Any, client: Any, bucket: str, work: Path, first_version: int
) -> dict[str, Any]:
    src = case.make(work / f"src-{case.key}")
    files = files_of(src)
    size = sum(f.stat().st_size for f in files)
    ours: list[tuple[float, float]] = []
    raw: list[tuple[float, float]] = []
    raw_hashed: list[float] = []
    cpu = {True: 0.0, False: 0.0}
    for rep in range(case.reps + 1):  # the first repetition warms up connections and caches, unrecorded
        version = first_version + rep
        order = [True, False] if rep % 2 else [False, True]
        for mine in order:
            dest = work / f"dest-{case.key}-{rep}-{'ours' if mine else 'raw'}"
            if mine:
                cpu_before = cpu_s()
                result = ours_round(store, version, src, case.kind, dest)
                used = cpu_s() - cpu_before
            else:
                put_s, get_s, used, hashed_s = raw_round(
                    client, bucket, f"raw/{case.key}/{rep}", files, dest, hashed_first=rep % 3 == 2
                )
                result = (put_s, get_s)
            if rep:
                cpu[mine] += used
                if not mine and math.isnan(get_s):
                    raw_hashed.append(hashed_s)
                else:
                    (ours if mine else raw).append(result)
            shutil.rmtree(dest, ignore_errors=True)
        for o in client.list_objects(bucket, prefix=f"raw/{case.key}/{rep}/", recursive=True):
            client.remove_object(bucket, o.object_name)
        store.gc(keep_last=1)
    shutil.rmtree(src, ignore_errors=True)

    def summary(rounds: list[tuple[float, float]]) -> dict[str, float]:
        put = statistics.median(r[0] for r in rounds)
        get = statistics.median(r[1] for r in rounds)
        total = statistics.median(r[0] + r[1] for r in rounds)
        return {
            "publish_s": put,
            "fetch_s": get,
            "total_s": total,
            "publish_MBps": size / put / 1e6,
            "fetch_MBps": size / get / 1e6,
        }

    o, r = summary(ours), summary(raw)
    ratio = {
        "publish": r["publish_s"] / o["publish_s"],
        "fetch": r["fetch_s"] / o["fetch_s"],
        "total": r["total_s"] / o["total_s"],
    }
    o["client_cpu_s_per_round"] = cpu[True] / case.reps
    r["client_cpu_s_per_round"] = cpu[False] / case.reps
    if raw_hashed:
        r["fetch_sha256_s"] = statistics.median(raw_hashed)
        ratio["fetch_vs_raw_sha256"] = r["fetch_sha256_s"] / o["fetch_s"]
    if case.key == "a":
        target = f"publish + fetch < {TINY_TARGET_S * 1000:.0f} ms"
        met = o["total_s"] < TINY_TARGET_S
    else:
        target = f"publish and fetch each ≥ {RATIO_TARGET} of raw throughput"
        met = ratio["publish"] >= RATIO_TARGET and ratio["fetch"] >= RATIO_TARGET
    return {
        "case": case.key,
        "title": case.title,
        "bytes": size,
        "files": len(files),
        "reps": case.reps,
        "ours": o,
        "raw": r,
        "ratio": ratio,
        "target": target,
        "met": met,
        "ours_rounds": ours,
        "raw_rounds": raw,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and 256 MiB for (c)")
    parser.add_argument("--endpoint", help="use this MinIO/S3 (host:port) instead of starting one")
    parser.add_argument("--access-key", default=os.environ.get("ECHORL_S3_ACCESS_KEY"))
    parser.add_argument("--secret-key", default=os.environ.get("ECHORL_S3_SECRET_KEY"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    load_at_start = os.getloadavg()
    sys.path.insert(0, str(REPO / "tests"))  # the test suite's MinIO launcher
    from minio import Minio

    from echo_runtime.snapshots import open_store
    from echo_runtime.spec import Storage

    big = (256 if args.quick else 1024) * MiB
    cases = [
        Case(
            "a",
            "tiny model LoRA adapter (echorl:tiny, r=16, 7 modules)",
            tiny_lora,
            10 if args.quick else 30,
            "lora",
        ),
        Case(
            "b",
            "40 MB LoRA adapter (Qwen3-0.6B shapes, r=16, fp32)",
            adapter_40mb,
            3 if args.quick else 7,
            "lora",
        ),
        Case(
            "c",
            f"{big // MiB} MiB full state dict (fp32, 2 shards)",
            full_state_dict(big),
            1 if args.quick else 3,
            "full",
        ),
    ]
    server = None
    with tempfile.TemporaryDirectory(prefix="echorl-bench-snapshots-") as tmp:
        work = Path(tmp)
        if args.endpoint:
            endpoint, access, secret = args.endpoint, args.access_key, args.secret_key
        else:
            from services import minio as minio_service
            from services import procs

            server = minio_service.start_minio(procs.run_testbin(), work / "minio")
            endpoint, access, secret = server.endpoint, server.access_key, server.secret_key
        try:
            client = Minio(endpoint, access_key=access, secret_key=secret, secure=False)
            bucket = f"bench-snapshots-{int(time.time())}"
            client.make_bucket(bucket)
            store = open_store(
                Storage(type="S3", endpoint=f"http://{endpoint}", bucket=bucket),
                "bench",
                credentials=(access, secret),
            )
            results = []
            for n, case in enumerate(cases):
                started = time.perf_counter()
                result = run_case(case, store, client, bucket, work, first_version=1000 * (n + 1))
                result["wall_s"] = time.perf_counter() - started
                result["load_average_after"] = os.getloadavg()
                results.append(result)
                print_case(result)
            for o in client.list_objects(bucket, recursive=True):
                client.remove_object(bucket, o.object_name)
            client.remove_bucket(bucket)
        finally:
            if server is not None:
                server.stop()
    report = {
        "benchmark": "snapshots",
        "quick": args.quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_at_start": load_at_start,
        },
        "server": "external " + endpoint if args.endpoint else "MinIO started on loopback (single drive)",
        "method": (
            "median over repetitions after one warm-up; ours = SnapshotStore.publish + fetch into an empty "
            "cache (sha256 verified); raw = minio SDK put_object/get_object of the same files, to/from disk"
        ),
        "cases": results,
        "all_targets_met": all(r["met"] for r in results),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nall targets met: {report['all_targets_met']}; wrote {args.output}")
    return 0


def print_case(r: dict[str, Any]) -> None:
    o, w, q = r["ours"], r["raw"], r["ratio"]
    print(
        f"\n({r['case']}) {r['title']}: {r['bytes'] / 1e6:.2f} MB in {r['files']} file(s), {r['reps']} rep(s)"
    )
    print(f"    {'':8} {'publish':>22} {'fetch':>22} {'publish+fetch':>14}")
    for name, s in (("ours", o), ("raw SDK", w)):
        print(
            f"    {name:8} {s['publish_s'] * 1e3:9.1f} ms {s['publish_MBps']:7.0f} MB/s "
            f"{s['fetch_s'] * 1e3:9.1f} ms {s['fetch_MBps']:7.0f} MB/s {s['total_s'] * 1e3:11.1f} ms"
        )
    print(
        f"    ratio (raw time / ours): publish {q['publish']:.2f}, fetch {q['fetch']:.2f}, total {q['total']:.2f}"
        f"  — target: {r['target']}: {'met' if r['met'] else 'NOT met'}"
    )
    if "fetch_sha256_s" in w:
        print(
            f"    raw get_object + sha256 of the stream (the floor of a verified fetch): "
            f"{w['fetch_sha256_s'] * 1e3:.1f} ms; raw-verified time / ours: {q['fetch_vs_raw_sha256']:.2f}"
        )
    print(
        f"    client CPU per round: ours {o['client_cpu_s_per_round']:.3f} s, raw {w['client_cpu_s_per_round']:.3f} s;"
        f" load average after: {r['load_average_after'][0]:.1f}"
    )


if __name__ == "__main__":
    sys.exit(main())
