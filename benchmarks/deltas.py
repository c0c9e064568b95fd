"""Delta snapshots against full snapshots: bytes per version and fetch time, on the real model.

SmolLM2-135M-Instruct, fully fine-tuned in bfloat16 with AdamW at ``--lr`` (default 1e-6, TRL's GRPO
default): each optimizer step is a real backward pass (next-token loss on real prompts of the
``examples/smollm2.yaml`` data, ``examples/data/addition.jsonl``, so every parameter gets a gradient; with Adam the size of an update is
about ``lr`` per element whatever the loss, so which elements survive bf16 rounding does not depend on
the loss chosen). After each step the same weights are published twice into one real MinIO on
loopback, side by side:

* **full**: ``model.safetensors`` every version (what a full fine-tuning job publishes today);
* **delta**: ``trainingSwarm.snapshotAnchorInterval: N`` — an anchor every N versions, a delta between
  (``echo_runtime.snapshots.deltas.Writer``, the trainer's own code path).

Then a reader that follows the run (it holds version v − 1 in its cache, as a worker does) fetches
each version from each store, in alternating order; the delta reader's weights are compared bit for
bit with the trainer's. Reported per version: bytes published, fetch seconds, their ratios, and the
share of bf16 elements left bit-identical by the step. Goal (issue): ≥ 10× fewer bytes and fetch time
≤ 0.2× of full snapshots, loaded weights bit-identical.

Loopback moves bytes about as fast as the reader's disk can write them, which no worker's network does.
``--link-mbit`` adds readers behind a throttled link: a TCP relay on loopback between reader and MinIO
that paces each direction to the given rate (bandwidth only: no latency, no loss), one more pair of
readers per rate, each fetching every version from both stores. The relay's measured rate is reported
(bytes of a full fetch over its seconds).

    python benchmarks/deltas.py                 # ~6 minutes on 2 cores: 10 versions, loopback + 1000, 200 Mbit/s
    python benchmarks/deltas.py --versions 4 --link-mbit ''    # quicker: loopback only
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "deltas.json"


def prompts(limit: int) -> list[str]:
    """Real prompts: the questions of the examples' dataset task."""
    lines = (REPO / "examples" / "data" / "addition.jsonl").read_text().splitlines()
    return [str(json.loads(line)["prompt"]) for line in lines if line.strip()][:limit]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=10)
    parser.add_argument("--anchor-interval", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--link-mbit",
        default="1000,200",
        help="comma-separated link rates in Mbit/s for throttled readers, besides loopback ('' for none)",
    )
    args = parser.parse_args()
    if args.versions < 2:
        parser.error("--versions: at least 2 (one anchor and one delta)")
    try:
        rates = [float(r) for r in args.link_mbit.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--link-mbit: comma-separated numbers of Mbit/s, got {args.link_mbit!r}")
    if any(r <= 0 for r in rates):
        parser.error(f"--link-mbit: rates must be > 0, got {args.link_mbit!r}")

    import torch

    sys.path.insert(0, str(REPO / "tests"))  # the test suite's MinIO launcher
    from echo_runtime.models import load as model_load
    from echo_runtime.snapshots import deltas, open_store, payloads
    from echo_runtime.spec import Model, Storage
    from services import minio as minio_service
    from services import procs
    from services.relay import Relay

    torch.manual_seed(0)
    path = model_load.resolve_spec(Model(path="echorl:smollm2-135m"))
    model = model_load.load_causal_lm(path, "bfloat16")
    tokenizer = model_load.load_tokenizer(path)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    texts = prompts(64)
    writer = deltas.Writer(args.anchor_interval)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="echorl-bench-deltas-") as tmp:
        work = Path(tmp)
        server = minio_service.start_minio(procs.run_testbin(), work / "minio")
        links = {rate: Relay(server.endpoint, mbit=rate) for rate in rates}
        try:
            storage = Storage(
                type="S3", endpoint=f"http://{server.endpoint}", bucket=f"deltas-{int(time.time())}"
            )
            creds = (server.access_key, server.secret_key)
            full = open_store(storage, "full", credentials=creds, create_bucket=True)
            delta = open_store(storage, "delta", credentials=creds)
            # The same stores seen through each throttled link (S3 signs the host the client dials,
            # and the relay forwards the request unchanged).
            behind = {
                rate: {
                    name: open_store(
                        Storage(type="S3", endpoint=f"http://{link.endpoint}", bucket=storage.bucket),
                        name,
                        credentials=creds,
                    )
                    for name in ("full", "delta")
                }
                for rate, link in links.items()
            }
            previous = {n: t.clone() for n, t in payloads.storable(model.state_dict()).items()}
            for version in range(1, args.versions + 1):
                batch = tokenizer(
                    texts[(version * 4) % len(texts) :][:4] or texts[:4], return_tensors="pt", padding=True
                )
                loss = model(**batch, labels=batch["input_ids"]).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                state = payloads.storable(model.state_dict())
                same = sum(
                    int((deltas.bits(state[n]) == deltas.bits(previous[n])).sum()) for n in state
                ) / sum(t.numel() for t in state.values())
                previous = {n: t.clone() for n, t in state.items()}
                out_full, out_delta = work / f"full-{version}", work / f"delta-{version}"
                out_full.mkdir()
                out_delta.mkdir()
                t0 = time.perf_counter()
                written = payloads.save_state_dict(state, out_full)
                full_export = time.perf_counter() - t0
                t0 = time.perf_counter()
                files, meta = writer.export(version, state, out_delta)
                delta_export = time.perf_counter() - t0
                full_doc = full.publish(version, written, kind="full", base_model=path)
                delta_doc = delta.publish(version, files, kind="full", base_model=path, delta=meta)
                # A following reader: version - 1 is in its cache; fetch v from each store, alternating.
                order = (
                    (("full", full), ("delta", delta)) if version % 2 else (("delta", delta), ("full", full))
                )
                seconds = {}
                for name, store in order:
                    store.fetch(version - 1, work / f"cache-{name}") if version > 1 else None
                    t0 = time.perf_counter()
                    got_dir = store.fetch(version, work / f"cache-{name}", keep_cached=2)
                    seconds[name] = time.perf_counter() - t0
                    if name == "delta":
                        got = payloads.load_state_dict(got_dir)
                        identical = (
                            all(torch.equal(deltas.bits(got[n]), deltas.bits(state[n])) for n in state)
                            and got.keys() == state.keys()
                        )
                linked = {}
                for rate, stores in behind.items():
                    cache = work / f"link-{rate:g}"
                    times = {}
                    for name in [n for n, _ in order]:
                        if version > 1:
                            stores[name].fetch(version - 1, cache / name)
                        t0 = time.perf_counter()
                        stores[name].fetch(version, cache / name, keep_cached=2)
                        times[name] = time.perf_counter() - t0
                    linked[f"{rate:g}"] = {
                        "fullFetchSeconds": times["full"],
                        "deltaFetchSeconds": times["delta"],
                        "fetchRatio": times["delta"] / times["full"],
                        "fullMBps": full_doc.total_size / 1e6 / times["full"],
                    }
                row = {
                    "version": version,
                    "anchor": meta is None,
                    "unchangedFraction": same,
                    "fullBytes": full_doc.total_size,
                    "deltaBytes": delta_doc.total_size,
                    "bytesRatio": delta_doc.total_size / full_doc.total_size,
                    "fullFetchSeconds": seconds["full"],
                    "deltaFetchSeconds": seconds["delta"],
                    "fetchRatio": seconds["delta"] / seconds["full"],
                    "fullExportSeconds": full_export,
                    "deltaExportSeconds": delta_export,
                    "bitIdentical": identical,
                    "links": linked,
                }
                rows.append(row)
                print(
                    f"v{version:>3} {'anchor' if meta is None else 'delta ':<6} unchanged {same:.4f}  "
                    f"bytes {delta_doc.total_size / 1e6:8.2f} MB vs {full_doc.total_size / 1e6:7.2f} MB "
                    f"({row['bytesRatio']:.4f}×)  fetch {seconds['delta']:.3f} s vs {seconds['full']:.3f} s "
                    f"({row['fetchRatio']:.3f}×)  bit-identical {identical}"
                    + "".join(
                        f"\n      at {mbit} Mbit/s: fetch {x['deltaFetchSeconds']:.3f} s vs "
                        f"{x['fullFetchSeconds']:.3f} s ({x['fetchRatio']:.3f}×; full at {x['fullMBps']:.1f} MB/s)"
                        for mbit, x in linked.items()
                    ),
                    flush=True,
                )
        finally:
            for link in links.values():
                link.close()
            server.stop()
    deltas_only = [r for r in rows if not r["anchor"]]
    summary = {
        "versions": len(rows),
        "deltaVersions": len(deltas_only),
        "bytesRatioMedian": statistics.median(r["bytesRatio"] for r in deltas_only),
        "bytesReductionMedian": 1 / statistics.median(r["bytesRatio"] for r in deltas_only),
        "fetchRatioMedian": statistics.median(r["fetchRatio"] for r in deltas_only),
        "unchangedFractionMedian": statistics.median(r["unchangedFraction"] for r in rows),
        "allBitIdentical": all(r["bitIdentical"] for r in rows),
        "bytesAllVersionsRatio": sum(r["deltaBytes"] for r in rows) / sum(r["fullBytes"] for r in rows),
        "fetchRatioMedianByLinkMbit": {
            mbit: statistics.median(r["links"][mbit]["fetchRatio"] for r in deltas_only)
            for mbit in (deltas_only[0]["links"] if deltas_only else {})
        },
        "fullMBpsMedianByLinkMbit": {
            mbit: statistics.median(r["links"][mbit]["fullMBps"] for r in rows)
            for mbit in (rows[0]["links"] if rows else {})
        },
    }
    result = {
        "benchmark": "deltas",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "loadAtEnd": os.getloadavg()},
        "model": "SmolLM2-135M-Instruct (bfloat16, full fine-tuning)",
        "lr": args.lr,
        "anchorInterval": args.anchor_interval,
        "summary": summary,
        "rows": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.output}")
    return 0 if summary["allBitIdentical"] else 1


if __name__ == "__main__":
    sys.exit(main())
