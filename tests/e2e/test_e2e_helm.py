"""The Helm chart on the real node: ``helm upgrade --install`` takes the session's kustomize install over
(the same objects, which tests/integration/operator/test_operator_chart.py shows object by object),
rolls out both operator replicas, and the chart's operator trains a job to Succeeded. Only the image
values differ from a user's install: the images scripts/images.sh built, pull policy Never.

Runs after the other e2e modules but Kueue's (pytest's file order); they see the same operator.
"""

from __future__ import annotations

import pytest
import yaml
from e2e_kit import E2E
from test_e2e_echojob import echojob

from services.install import CHART, chart_values

pytestmark = pytest.mark.timeout(900)


def test_the_chart_takes_over_the_install_and_its_operator_trains_a_job(
    e2e: E2E, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster = e2e.cluster
    values = tmp_path_factory.mktemp("helm") / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values(cluster.images)))
    helm = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig)]
    proc = cluster.run(
        [*helm, "upgrade", "--install", "echorl", str(CHART), "--namespace", "echorl-system",
         "--take-ownership", "--server-side=true", "--force-conflicts", "-f", str(values),
         "--wait", "--timeout", "5m"],
        timeout=420,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    e2e.note(f"helm upgrade --install: {proc.stdout.strip().splitlines()[:3]}")
    dep = cluster.kubectl_json("get", "deployment", "echorl-operator", "-n", "echorl-system")
    assert dep["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert dep["metadata"]["annotations"]["meta.helm.sh/release-name"] == "echorl"
    cluster.kubectl(
        "rollout", "status", "deployment/echorl-operator", "-n", "echorl-system", "--timeout=300s",
        check=True, timeout=330,
    )  # fmt: skip
    assert dep["spec"]["replicas"] == 2
    status = cluster.run([*helm, "status", "echorl", "--namespace", "echorl-system", "-o", "json"])
    assert '"status":"deployed"' in status.stdout.replace(" ", ""), status.stdout + status.stderr

    e2e.apply(echojob("charted", max_steps=12))
    done = e2e.wait_condition("charted", "Succeeded")
    e2e.note(f"Succeeded under the chart's operator: {done['message']}")
    assert e2e.job("charted")["status"]["policyVersion"] == 12
