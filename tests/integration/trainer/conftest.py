"""Fixtures for the trainer's integration tests.

``tiny_model_dir`` (session)
    The built-in tiny model, ``init_model("tiny", seed=0)``, in a session temp dir (Echo's cache untouched).
``one_torch_thread`` (autouse)
    Runs each test with one torch thread, restoring the count afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from echo_runtime.models import build


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build.init_model("tiny", tmp_path_factory.mktemp("trainer-model") / "tiny", seed=0))


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One torch thread: on a shared 2-core machine two OpenMP threads are far slower than one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
