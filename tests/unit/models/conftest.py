"""Shared by the model tests: one torch thread, no hub, and a temporary Echo cache per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """These models are too small to gain from a second thread, and on a busy 2-core machine torch's
    spinning OpenMP threads make each step several times slower; the setting is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ECHORL_CACHE_DIR", str(tmp_path / "cache"))
