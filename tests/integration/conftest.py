"""Integration tests that run ``echorl`` processes share one built tiny model through a cache directory
made once per session, exported as ECHORL_CACHE_DIR to the processes of the tests that ask for it
(and only to those: other tests keep the machine's cache, where the pretrained models are)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _tiny_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from echo_runtime.models import resolve

    cache = tmp_path_factory.mktemp("echorl-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ECHORL_CACHE_DIR", str(cache))
        resolve.resolve_model("echorl:tiny")
    return cache


@pytest.fixture
def built_model_cache(_tiny_model_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache dir holding ``echorl:tiny``, exported as ECHORL_CACHE_DIR for this test's child processes."""
    monkeypatch.setenv("ECHORL_CACHE_DIR", str(_tiny_model_cache))
    return _tiny_model_cache


@pytest.fixture(scope="session")
def reward_model_dirs(_tiny_model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A classifier and a judge fine-tuned here from ``echorl:tiny`` to prefer answers ending with " !"
    (tests/reward_models.py): ``{"classifier": dir, "judge": dir}``."""
    import torch

    import reward_models
    from echo_runtime.models import resolve

    out = tmp_path_factory.mktemp("reward-models")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ECHORL_CACHE_DIR", str(_tiny_model_cache))
            base = resolve.resolve_model("echorl:tiny")
        return {
            "classifier": reward_models.build_classifier(base, out / "classifier"),
            "judge": reward_models.build_judge(base, out / "judge"),
        }
    finally:
        torch.set_num_threads(threads)
