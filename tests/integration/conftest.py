"""Integration tests that run ``echorl`` processes share one built tiny model through a session-wide
cache directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def built_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache dir holding ``echorl:tiny``, exported as ECHORL_CACHE_DIR for the child processes."""
    from echo_runtime.models import resolve

    cache = tmp_path_factory.mktemp("echorl-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("ECHORL_CACHE_DIR", str(cache))
    resolve.resolve_model("echorl:tiny")
    yield cache
    mp.undo()
