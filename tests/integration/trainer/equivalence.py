"""What the data-parallel and sharding tests compare: the files ``trainer_ddp_script.step_phases`` wrote
for one process (``one``) and for several ranks (``two``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch


def torchrun(script: Path, *args: str, ranks: int = 2, timeout: float = 300) -> None:
    """``script`` under ``torchrun --standalone`` with ``ranks`` processes on CPU, one thread each,
    outside any torchrun world this process may be in; fails the test with its output if a rank fails."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
    }
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
         str(script), *args],
        env={**env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]


def assert_same_update(one: Path, two: Path, adamw_atol: float, adamw_share: float) -> None:
    """The SGD phase (rate 1, or 1e-2 for Full: the parameters move by the gradient times the rate) within
    1e-6 absolute and 1e-5 relative everywhere, with at most 0.1 % of elements beyond 1e-6; the AdamW phase
    within ``adamw_atol``, at most ``adamw_share`` of elements beyond 1e-6. AdamW divides by √v + 1e-8,
    which amplifies the float rounding of gradients near zero, so a few elements move differently."""
    for phase, atol, share in (("sgd", 1e-6, 1e-3), ("adamw", adamw_atol, adamw_share)):
        a = safetensors.torch.load_file(str(one / f"{phase}.safetensors"))
        b = safetensors.torch.load_file(str(two / f"{phase}.safetensors"))
        assert a.keys() == b.keys() and len(a) > 0
        moved = loose = total = 0
        for name in a:
            torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=atol, msg=f"{phase}: {name}")
            moved += int(not torch.equal(a[name], torch.zeros_like(a[name])))
            loose += int(((b[name] - a[name]).abs() > 1e-6).sum())
            total += a[name].numel()
        assert moved > 0
        assert loose <= total * share, f"{phase}: {loose} of {total} elements differ by more than 1e-6"


def assert_same_metrics(one: Path, two: Path) -> list[dict[str, Any]]:
    """Every step's metrics equal (floats to 1e-4 relative), but the padding; returns ``one``'s."""
    m1 = json.loads((one / "metrics.json").read_text())
    m2 = json.loads((two / "metrics.json").read_text())
    assert len(m1) == len(m2) == 3
    for r1, r2 in zip(m1, m2, strict=True):
        assert r1.keys() == r2.keys()
        # Padding depends on how the batch is split: two ranks pad their own micro-batches, and one runs
        # a filler (9 rollouts over 2 ranks). Everything else is a property of the batch and the update.
        assert 0 <= r1["padding_fraction"] < r2["padding_fraction"] < 1
        for key in r1.keys() - {"padding_fraction"}:
            if isinstance(r1[key], float):
                assert r2[key] == pytest.approx(r1[key], rel=1e-4, abs=1e-6), key
            else:
                assert r2[key] == r1[key], key
    result: list[dict[str, Any]] = m1
    return result
