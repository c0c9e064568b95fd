"""Helpers shared by the loop tests and the torchrun script: a job manifest and a scripted coordinator.

``make_job(root, model_dir, interval=2, max_steps=4, training_swarm=None, **sync)`` → a resolved EchoJob (LoRA rank 4 on the
given model, 2 groups × 3 rollouts, micro-batches of 2, a small KL penalty, Async Δmax 1, a local store in
``root/store``). :class:`ScriptedCoordinator` serves deterministic batches per version and records what
the trainer asked and announced.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from echo_runtime import spec, staleness
from echo_runtime.coordinator import wire

PROMPTS = ["3 + 4 =", "12 - 5 =", "7 * 6 =", "9 + 9 ="]


def make_job(
    root: Path,
    model_dir: str,
    *,
    interval: int = 2,
    max_steps: int = 4,
    full: bool = False,
    anchor_interval: int | None = None,
    training_swarm: dict[str, Any] | None = None,
    **sync: Any,
) -> spec.ResolvedJob:
    doc = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": "looptest"},
        "spec": {
            "model": {"path": model_dir, "lora": {"rank": 4, "alpha": 8}},
            "algorithm": {
                "groupSize": 3, "batchSize": 2, "microBatchSize": 2, "learningRate": 1e-2, "maxSteps": max_steps,
                "klCoef": 0.01,
            },
            # The scripted batches' behaviour log-probs are made up: no log-prob check (trainer/verify.py).
            "syncPolicy": {"mode": "Async", "maxStaleness": 1, "logprobChecksPerGroup": 0, **sync},
            "storage": {"type": "Local", "path": str(root / "store")},
            "trainingSwarm": {"checkpointInterval": interval, "device": "cpu", **(training_swarm or {})},
        },
    }  # fmt: skip
    if full:  # full fine-tuning, with delta snapshots when anchor_interval is given
        # bf16 and a small learning rate, as in real full fine-tuning: most updates round away.
        doc["spec"]["model"] = {"path": model_dir, "finetune": "Full", "dtype": "bfloat16"}
        doc["spec"]["algorithm"]["learningRate"] = 1e-5
        doc["spec"]["trainingSwarm"]["snapshotAnchorInterval"] = anchor_interval
    (manifest,) = spec.load_documents(json.dumps(doc))
    assert isinstance(manifest, spec.EchoJob)
    return spec.resolve(manifest)


class ScriptedCoordinator:
    """Deterministic batches per version; records announcements; can fail at a version (a crash)."""

    def __init__(self, fail_at: int | None = None, stale_by: int = 0) -> None:
        self.announced: list[int] = []
        self.asked: list[int] = []
        self.events: list[tuple[str, int]] = []
        """("ask", v) and ("announce", v) in the order they happened."""
        self.step_seconds: list[float | None] = []
        self.fail_at = fail_at
        self.stale_by = stale_by

    def announce(self, version: int) -> wire.AnnounceReply:
        self.announced.append(version)
        self.events.append(("announce", version))
        return wire.AnnounceReply(policy_version=version, dropped_stale=0)

    def quarantine(self, worker_id: str, reason: str, *, version: int, mismatch: float | None = None) -> None:
        raise AssertionError(f"no check runs on scripted batches, yet worker {worker_id} was quarantined")

    def wait_batch(
        self,
        version: int,
        policy: staleness.StalenessPolicy | None = None,
        timeout: float | None = None,
        *,
        step_seconds: float | None = None,
    ) -> wire.BatchReply:
        self.asked.append(version)
        self.events.append(("ask", version))
        self.step_seconds.append(step_seconds)
        if version == self.fail_at:
            raise ConnectionError(f"scripted crash at version {version}")
        rng = random.Random(version)
        groups = []
        for g in range(2):
            produced = max(0, version - (self.stale_by if g == 1 else 0))
            rollouts = []
            for i in range(3):
                tokens = [rng.randrange(1, 1000) for _ in range(rng.randint(1, 5))]
                rollouts.append(
                    wire.RolloutOut(
                        completion="x", token_ids=tokens, logprobs=[-rng.uniform(6.0, 7.5) for _ in tokens],
                        policy_version=produced, staleness=version - produced, reward=float(i == g),
                        reward_components={}, reward_reason="", backend="transformers", device="cpu",
                        dtype="float32",
                    )
                )  # fmt: skip
            groups.append(
                wire.GroupOut(
                    task_id=f"t{version}-{g}", problem_id=f"p{g}", prompt=PROMPTS[(version + g) % 4], worker_id="w",
                    policy_version=produced, staleness=version - produced, importance_weighted=False,
                    rollouts=rollouts,
                )
            )  # fmt: skip
        return wire.BatchReply(ready=True, version=version, groups=groups)
