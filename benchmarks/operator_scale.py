"""The operator's control loop with many EchoJobs: its CPU, API requests and status writes.

``--jobs`` EchoJobs (default 200) on the real kube-apiserver (etcd + kube-apiserver, no kubelet) with
MinIO for their stores: ``--finished`` of them (default 180) finished — their trainer Job marked Failed
as the Job controller would, with ``backoffLimit: 0`` — and the rest running, whose status the
operator reads from a stub coordinator (one HTTP server answering every job's ``GET /v1/status`` with
figures that move on every read, as a training job's reward and rollouts/s do). The operator runs as
its own process (``python -m echo_operator``, as its Deployment does; status every 10 s, re-apply every
60 s). Once every finished job says Failed and a warm-up has passed, the script measures a window of
``--window`` seconds: the operator's CPU time, the API requests its client made and the status writes
(its ``/metrics``), and the writes of every kind the API server's audit log records from it (kopf's
bookkeeping included).

    python benchmarks/operator_scale.py --label after     # ~6 min; writes results/operator-scale-after.json

Needs the test binaries (scripts/testbin.sh; ``ECHORL_TESTBIN_DIR``).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
NS = "scale"


def job_yaml(name: str, bucket: str, endpoint: str, backoff: int) -> str:
    return f"""apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: {name}, namespace: {NS}}}
spec:
  model: {{path: echorl:tiny}}
  storage: {{type: S3, endpoint: "{endpoint}", secure: false, bucket: {bucket}, credentialsSecret: minio-credentials}}
  backoffLimit: {backoff}
  inferenceSwarms: [{{name: cpu, replicas: 1}}]
"""


class StubCoordinators:
    """``GET /<job>/v1/status`` for any job: a valid status document whose figures move each read."""

    def __init__(self) -> None:
        reads: dict[str, int] = {}
        lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                job = self.path.strip("/").split("/")[0]
                with lock:
                    reads[job] = reads.get(job, 0) + 1
                    n = reads[job]
                doc = {
                    "job": job, "mode": "Async", "maxStaleness": 2, "policyVersion": n,
                    "buffer": {"groups": 3, "capacity": 8}, "maxObservedStaleness": 1,
                    "stalenessHistogram": {"0": n, "1": n // 2}, "droppedStale": 0, "weightedStale": n // 3,
                    "consumedGroups": 4 * n, "rolloutsPerSecond": round(random.uniform(1, 9), 3),
                    "reward": round(random.random(), 4),
                    "workers": [{"id": f"w-{job}", "pool": "cpu", "host": f"{job}-cpu-0", "backend": "transformers",
                                 "device": "cpu", "dtype": "float32", "external": False, "loadedVersion": n, "stuck": False,
                                 "lastHeartbeat": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 "rolloutsPerSecond": 1.0}],
                    "pools": {"cpu": {"workers": 1, "minLoadedVersion": n}},
                }  # fmt: skip
                body = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.reads = reads
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("echorl_operator_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def total(sample: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in sample.items() if k.startswith(prefix))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--finished", type=int, default=180)
    parser.add_argument("--window", type=float, default=120.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds after setup before measuring")
    parser.add_argument("--label", default="run", help="names the result file")
    args = parser.parse_args()
    if not 0 <= args.finished <= args.jobs:
        parser.error("--finished: between 0 and --jobs")

    import psutil

    sys.path.insert(0, str(REPO / "tests"))
    from echo_runtime.coordinator import wire
    from services import minio as minio_service
    from services import procs
    from services.kube import start_kube_apiserver

    bin_dir = procs.run_testbin()
    probe = StubCoordinators()  # its documents must be valid ones, or the operator would read none
    with urllib.request.urlopen(f"http://127.0.0.1:{probe.port}/probe/v1/status", timeout=10) as r:
        wire.StatusDocument.model_validate_json(r.read())
    probe.server.shutdown()
    with tempfile.TemporaryDirectory(prefix="echorl-bench-operator-") as tmp:
        work = Path(tmp)
        kube = start_kube_apiserver(bin_dir, work / "kube")
        minio = minio_service.start_minio(bin_dir, work / "minio")
        stub = StubCoordinators()
        operator: subprocess.Popen[bytes] | None = None
        try:
            kube.install_crds(REPO / "crds")
            for argv in (
                ("apply", "--server-side", "-k", str(REPO / "manifests")),
                ("create", "namespace", NS),
                ("create", "secret", "generic", "minio-credentials", "-n", NS,
                 f"--from-literal=accessKey={minio.access_key}", f"--from-literal=secretKey={minio.secret_key}"),
            ):  # fmt: skip
                proc = kube.kubectl(*argv, timeout=120)
                assert proc.returncode == 0, proc.stderr
            (metrics_port,) = procs.free_ports(1)
            env = {
                **os.environ,
                "KUBECONFIG": str(kube.kubeconfig),
                "ECHORL_STATUS_INTERVAL": "10",
                "ECHORL_RESYNC_INTERVAL": "60",
                "ECHORL_COORDINATOR_URL": f"http://127.0.0.1:{stub.port}/{{job}}",
                "ECHORL_METRICS_PORT": str(metrics_port),
                "ECHORL_METRICS_ADDRESS": "127.0.0.1",  # loopback only
                "ECHORL_LEADER_ELECTION": "false",
            }
            log = (work / "operator.log").open("wb")
            operator = subprocess.Popen(
                [sys.executable, "-m", "echo_operator"], env=env, stdout=log, stderr=log
            )
            names = [f"fin-{i:03d}" for i in range(args.finished)]
            names += [f"run-{i:03d}" for i in range(args.jobs - args.finished)]
            t0 = time.monotonic()
            for start in range(0, len(names), 20):
                text = "---\n".join(
                    job_yaml(n, "scale", minio.endpoint, 0 if n.startswith("fin") else 3) for n in names[start:start + 20]
                )  # fmt: skip
                proc = kube.kubectl("apply", "-f", "-", input=text, timeout=120)
                assert proc.returncode == 0, proc.stderr
            print(f"applied {len(names)} EchoJobs in {time.monotonic() - t0:.0f} s", flush=True)

            def trainer_jobs() -> set[str]:
                items = kube.kubectl_json("get", "jobs", "-n", NS)["items"]
                return {j["metadata"]["name"] for j in items}

            want = {f"{n}-trainer" for n in names}
            while not want <= trainer_jobs():
                if time.monotonic() - t0 > 1200:
                    raise SystemExit(f"the operator did not create every trainer Job: {len(trainer_jobs())}")
                time.sleep(5)
            print(f"every trainer Job created after {time.monotonic() - t0:.0f} s", flush=True)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            conds = [{"type": t, "status": "True", "reason": "BackoffLimitExceeded", "message": "benchmark",
                      "lastTransitionTime": now} for t in ("FailureTarget", "Failed")]  # fmt: skip
            patch = json.dumps({"status": {"startTime": now, "failed": 1, "conditions": conds}})
            for n in names[: args.finished]:
                proc = kube.kubectl("patch", "job", f"{n}-trainer", "-n", NS, "--subresource=status",
                                    "--type=merge", "-p", patch)  # fmt: skip
                assert proc.returncode == 0, proc.stderr

            def failed() -> int:
                items = kube.kubectl_json("get", "echojobs", "-n", NS)["items"]
                return sum(
                    any(c["type"] == "Failed" and c["status"] == "True" for c in (j.get("status") or {}).get("conditions") or [])
                    for j in items
                )  # fmt: skip

            while failed() < args.finished:
                if time.monotonic() - t0 > 1800:
                    raise SystemExit(f"only {failed()} of {args.finished} jobs Failed")
                time.sleep(5)
            print(
                f"{args.finished} jobs Failed after {time.monotonic() - t0:.0f} s; warm-up {args.warmup:.0f} s",
                flush=True,
            )
            time.sleep(args.warmup)

            proc_ps = psutil.Process(operator.pid)
            cpu0, m0, a0 = sum(proc_ps.cpu_times()[:2]), scrape(metrics_port), len(kube.audit())
            reads0 = sum(stub.reads.values())
            w0 = time.monotonic()
            time.sleep(args.window)
            cpu1, m1, audit = sum(proc_ps.cpu_times()[:2]), scrape(metrics_port), kube.audit()
            window = time.monotonic() - w0
            writes = [e for e in audit[a0:] if e.get("userAgent", "").startswith(("echorl-operator", "kopf"))]
            by_kind: dict[str, int] = {}
            for e in writes:
                what = f"{e['verb']} {e['objectRef'].get('resource')}{'/' + e['objectRef']['subresource'] if e['objectRef'].get('subresource') else ''}"
                by_kind[what] = by_kind.get(what, 0) + 1
            result = {
                "label": args.label,
                "jobs": args.jobs,
                "finished": args.finished,
                "running": args.jobs - args.finished,
                "window_s": round(window, 1),
                "operator_cpu_s": round(cpu1 - cpu0, 2),
                "operator_cpu_fraction": round((cpu1 - cpu0) / window, 4),
                "api_requests_per_s": round((total(m1, "echorl_operator_api_requests_total") - total(m0, "echorl_operator_api_requests_total")) / window, 2),
                "status_writes_per_min": round((total(m1, "echorl_operator_status_writes_total") - total(m0, "echorl_operator_status_writes_total")) * 60 / window, 1),
                "status_passes_per_min": round((m1.get('echorl_operator_reconciles_total{kind="status",result="ok"}', 0) - m0.get('echorl_operator_reconciles_total{kind="status",result="ok"}', 0)) * 60 / window, 1),
                "audited_writes_per_min": round(len(writes) * 60 / window, 1),
                "audited_writes_by_kind_per_min": {k: round(v * 60 / window, 1) for k, v in sorted(by_kind.items())},
                "coordinator_reads_per_min": round((sum(stub.reads.values()) - reads0) * 60 / window, 1),
            }  # fmt: skip
            print(json.dumps(result, indent=2))
            RESULTS.mkdir(parents=True, exist_ok=True)
            out = RESULTS / f"operator-scale-{args.label}.json"
            out.write_text(json.dumps(result, indent=2) + "\n")
            print(f"wrote {out}")
        finally:
            if operator is not None:
                operator.terminate()
                try:
                    operator.wait(30)
                except subprocess.TimeoutExpired:
                    operator.kill()
            stub.server.shutdown()
            minio.stop()
            kube.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
