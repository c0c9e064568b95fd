"""The Argo CD health check (manifests/argocd/echojob-health.lua), run in Lua 5.1 as Argo CD's gopher-lua would.

The EchoJobs fed to it carry conditions computed by the operator's own status code, so a change of
reasons or types there that the Lua does not know about fails here.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml
from operator_scenarios import doc, observation, worker

from echo_operator import conditions, pool_lag
from echo_operator import status as status_mod
from echo_runtime.spec import SyncPolicySpec
from services.argocd import health

pytest.importorskip("lupa.lua51", reason="the Lua runtime comes with the `lupa` package")

ARGOCD = pathlib.Path(__file__).resolve().parents[3] / "manifests" / "argocd"
SCRIPT = (ARGOCD / "echojob-health.lua").read_text()


def echojob(
    conds: list[conditions.Condition] | None, generation: int = 2, observed: int | None = 2
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"generation": generation},
    }
    if conds is not None:
        obj["status"] = {"conditions": conditions.merge([], conds, observed, "T")}
        if observed is not None:
            obj["status"]["observedGeneration"] = observed
    return obj


def computed(make_job: Any, **kw: Any) -> list[conditions.Condition]:
    return status_mod.conditions(observation(make_job, **kw))


def test_the_patch_embeds_the_script_verbatim() -> None:
    patch = yaml.safe_load((ARGOCD / "argocd-cm-patch.yaml").read_text())
    assert patch["data"]["resource.customizations.health.echorl.dev_EchoJob"] == SCRIPT


def test_no_status_yet_and_a_stale_generation_are_progressing() -> None:
    assert health(echojob(None))[0] == "Progressing"
    status, message = health(
        echojob([conditions.Condition("Ready", "True", "AllComponentsReady", "up")], 3, 2)
    )
    assert status == "Progressing" and "generation 3" in message


def test_a_spec_the_operator_could_not_apply_is_degraded_not_progressing() -> None:
    # observedGeneration stays at the last generation applied (1) while the job is at 2.
    refused = conditions.Condition("Degraded", "True", "ApplyFailed", "Deployment j-cpu: invalid")
    status, message = health(echojob([refused], generation=2, observed=1))
    assert (status, message) == ("Degraded", "ApplyFailed: Deployment j-cpu: invalid")
    fine = conditions.Condition("Degraded", "False", "AsExpected", "no problem found")
    assert health(echojob([fine], generation=2, observed=1))[0] == "Progressing"


def test_health_follows_the_operators_conditions(make_job: Any) -> None:
    assert health(echojob(computed(make_job)))[0] == "Healthy"
    assert health(echojob(computed(make_job, coordinator=doc(t=100)))) == (
        "Healthy",
        "trained 100 of 100 policy versions",
    )
    assert health(echojob(computed(make_job, suspended=True, coordinator=None)))[0] == "Suspended"
    starting = computed(make_job, coordinator=None, coordinator_error="connection refused")
    status, message = health(echojob(starting))
    assert status == "Progressing" and "connection refused" in message
    fault = (status_mod.Fault("ReferenceNotFound", "SyncPolicy 'fast' not found"),)
    status, message = health(echojob(computed(make_job, faults=fault)))
    assert (status, message) == ("Degraded", "ReferenceNotFound: SyncPolicy 'fast' not found")
    lagging = doc(t=17, workers=[worker("w1", "gpu", 10, stuck=True), worker("w2", "cpu", 16)])
    behind = pool_lag.pools_behind(lagging, SyncPolicySpec(max_staleness=2))
    status, message = health(echojob(computed(make_job, coordinator=lagging, behind=behind)))
    assert status == "Degraded" and message.startswith("PoolFallingBehind: ") and "pool gpu" in message
