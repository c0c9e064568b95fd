"""``echorl run`` of a job whose trainer is two FSDP ranks (``trainingSwarm.processesPerNode: 2``,
``strategy: FSDP``): torchrun's ranks as processes, each holding half the model, checking the worker's
log-probs together, publishing every version once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

JOB = """apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: sharded}}
spec:
  model: {{path: echorl:tiny}}
  task: {{name: arithmetic, evalEvery: 0}}
  algorithm: {{maxSteps: 4, batchSize: 2, groupSize: 4, learningRate: 0.0003, sampling: {{maxNewTokens: 6}}}}
  storage: {{path: {store}}}
  syncPolicy: {{mode: Async, maxStaleness: 1, retention: {{keepLast: 100}}}}
  trainingSwarm: {{processesPerNode: 2, strategy: FSDP, checkpointInterval: 2}}
"""


def test_echorl_run_trains_with_two_sharded_ranks(tmp_path: Path, built_model_cache: Path) -> None:
    job = tmp_path / "sharded.yaml"
    job.write_text(JOB.format(store=tmp_path / "store"))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "echo_runtime.cli", "run", str(job), "--no-progress", "--run-dir", str(run_dir)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["policyVersion"] == 4
    log = (run_dir / "logs" / "trainer.log").read_text()
    held = re.findall(r"strategy FSDP: rank (\d) of 2 holds (\d+) of the model's (\d+) parameters", log)
    assert sorted(rank for rank, _, _ in held) == ["0", "1"], log[-2000:]
    for _, mine, total in held:
        assert abs(int(mine) - int(total) / 2) <= 1024, held  # half each (odd first dimensions round)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trainer = [r for r in records if r.get("kind") == "trainer"]
    assert [r["policyVersion"] for r in trainer] == [1, 2, 3, 4]  # each version once, in order
    for record in trainer:  # the worker's log-probs recomputed by both ranks together: exact on CPU
        checks = record["logprobChecks"]
        assert checks and all(c["tokens"] > 0 and c["meanAbs"] < 1e-4 for c in checks.values()), checks
    versions = sorted(
        int(p.name) for p in (tmp_path / "store" / "sharded" / "snapshots").iterdir() if p.name.isdigit()
    )
    assert versions == [1, 2, 3, 4]
