"""The two stores every snapshot-store test runs on: a temp dir and a real MinIO bucket."""

from __future__ import annotations

from pathlib import Path

import pytest
from snapshots_testing import Target

from echo_runtime.snapshots.store import SnapshotStore


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.services)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if request.param == "local":
        return Target("local", path=str(tmp_path / "store"))
    return Target.of_bucket(request.getfixturevalue("minio"), prefix="team/echo")


@pytest.fixture
def store(target: Target) -> SnapshotStore:
    return target.open()
