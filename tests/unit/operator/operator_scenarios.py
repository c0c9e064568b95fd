"""Canned coordinator status documents and observations shared by the operator's unit tests."""

from __future__ import annotations

from typing import Any

from echo_operator import status as status_mod
from echo_runtime.coordinator import wire


def worker(
    id_: str, pool: str, version: int | None, *, external: bool = False, stuck: bool = False, **extra: Any
) -> dict[str, Any]:
    return {
        "id": id_,
        "pool": pool,
        "backend": "mlx" if external else "transformers",
        "device": "mps" if external else "cpu",
        "dtype": "float32",
        "external": external,
        "loadedVersion": version,
        "lastHeartbeat": "2026-11-29T19:00:00Z",
        "rolloutsPerSecond": 2.0,
        "stuck": stuck,
        **extra,
    }


def doc(
    t: int = 17,
    workers: list[dict[str, Any]] | None = None,
    max_observed: int | None = 2,
    max_staleness: int = 2,
    mode: str = "Async",
) -> wire.StatusDocument:
    workers = workers if workers is not None else [worker("w1", "gpu", 16), worker("w2", "cpu", 15)]
    pools: dict[str, dict[str, Any]] = {}
    for w in workers:
        entry = pools.setdefault(w["pool"], {"workers": 0, "minLoadedVersion": None})
        entry["workers"] += 1
        v = w["loadedVersion"]
        if v is not None:
            entry["minLoadedVersion"] = (
                v if entry["minLoadedVersion"] is None else min(entry["minLoadedVersion"], v)
            )
    return wire.StatusDocument.model_validate(
        {
            "job": "demo",
            "mode": mode,
            "maxStaleness": max_staleness,
            "policyVersion": t,
            "buffer": {"groups": 6, "capacity": 16},
            "maxObservedStaleness": max_observed,
            "stalenessHistogram": {"0": 120, "1": 80, "2": 13},
            "droppedStale": 4,
            "weightedStale": 1,
            "consumedGroups": 213,
            "rolloutsPerSecond": 41.5,
            "reward": 0.42,
            "workers": workers,
            "pools": pools,
        }
    )


def observation(make_job: Any, **kw: Any) -> status_mod.Observation:
    job = kw.pop("job", make_job())
    ready_trainer = {"spec": {"replicas": 2}, "status": {"readyReplicas": 2}}
    defaults: dict[str, Any] = {
        "generation": 3,
        "suspended": False,
        "job": job,
        "coordinator": doc(
            workers=[worker("w1", "gpu", 16), worker("w2", "cpu", 15), worker("w3", "shared", 16)]
        ),
        "trainer": ready_trainer,
        "deployments": {"demo-gpu": {"spec": {"replicas": 3}, "status": {"replicas": 3, "readyReplicas": 2}}},
    }
    defaults.update(kw)
    return status_mod.Observation(**defaults)
