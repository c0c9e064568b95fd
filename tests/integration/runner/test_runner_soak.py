"""The soak in the suite: 300 versions of a quickstart-shaped ``echorl run``, sampled every 10, must be
flat after the warm-up — every process's memory, descriptors and threads, the store, the pins, the
coordinator's leases and p99 latency — and the store and buffer within what the manifest bounds.

The same sampler and judgement run 5000 versions in ``benchmarks/soak.py`` (docs/benchmarks/soak.md);
``tests/unit/bench/test_bench_soak.py`` shows that the judgement fails leaks of the sizes it claims.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from echo_runtime import spec
from echo_runtime.bench import soak

JOB = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: soak}}
spec:
  model: {{path: echorl:tiny}}
  task: {{name: arithmetic, heldoutSize: 16, evalEvery: 25}}
  inferenceSwarms: [{{name: default, capacity: 8}}]
  algorithm: {{maxSteps: {steps}, groupSize: 16, sampling: {{maxNewTokens: 8}}}}
  storage: {{path: {store}}}
  syncPolicy: {{mode: Async, maxStaleness: 2}}
"""
STEPS, EVERY, WARMUP = 300, 10, 60


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="the soak reads /proc (Linux)")
def test_a_300_version_run_is_flat(tmp_path: Path, built_model_cache: Path) -> None:
    job_file = tmp_path / "soak.yaml"
    job_file.write_text(JOB.format(steps=STEPS, store=tmp_path / "store"))
    code, samples = soak.watch(job_file, tmp_path / "run", every=EVERY, timeout_s=900)
    assert code == 0, (tmp_path / "run.soak.log").read_text()[-3000:]
    job = spec.load_job(job_file)
    checks = soak.judge(samples, warmup=WARMUP, ceilings=soak.ceilings(job, readers=2))
    (tmp_path / "soak.json").write_text(json.dumps(soak.to_json(samples, checks)))
    judged = {c.series for c in checks}
    processes = {"runner", "coordinator", "worker:default-0", "trainer", "evaluator"}
    assert {f"rssMiB[{p}]" for p in processes} | {f"fds[{p}]" for p in processes} <= judged
    assert {
        "storeMiB",
        "storeVersions",
        "storeCheckpoints",
        "pins",
        "bufferGroups",
        "p99Ms[submit]",
    } <= judged
    assert len([s for s in samples if s.version >= WARMUP]) >= 20
    assert [c.describe() for c in checks if not c.ok] == []
    assert samples[-1].store_versions >= 1 and samples[-1].rss_mib["trainer"] > 100  # real measurements
