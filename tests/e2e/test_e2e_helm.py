"""The Helm chart on the real node: ``helm upgrade --install`` takes the session's kustomize install over
(the same objects, which tests/integration/operator/test_operator_chart.py shows object by object),
rolls out both operator replicas, and the chart's operator trains a job to Succeeded. Only the image
values differ from a user's install: the images scripts/images.sh built, pull policy Never.

Then it is uninstalled, its CRDs deleted, and installed fresh with `helm install`, as on a cluster without
Echo. Runs after the other e2e modules but Kueue's and Prometheus's (pytest's file order), which see the
chart's operator.
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


ECHO_CRDS = (
    "echojobs.echorl.dev",
    "inferenceswarms.echorl.dev",
    "trainingswarms.echorl.dev",
    "syncpolicies.echorl.dev",
)


def test_uninstalled_and_installed_fresh_the_chart_brings_everything_back(
    e2e: E2E, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """What an admin new to Echo does: ``helm install`` on a cluster with nothing of Echo's (no CRDs, no
    operator, no RBAC). The session's install is uninstalled first, its CRDs deleted (Helm keeps CRDs on
    uninstall by design); the fresh install must create the CRDs from the chart's crds/ and train a job."""
    cluster = e2e.cluster
    helm = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig)]
    values = tmp_path_factory.mktemp("helm-fresh") / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values(cluster.images)))
    # Earlier tests' jobs go with their namespaces, through the operator's finalizer: wait for them
    # while the operator still runs, or the CRDs could not be deleted.
    e2e.kubectl("delete", "echojobs", "--all", "--wait=true", "--timeout=180s", check=False)
    e2e.until(
        "no EchoJob left in the cluster",
        lambda: not cluster.kubectl_json("get", "echojobs", "-A")["items"] or None,
        timeout=300,
    )
    if cluster.run([*helm, "status", "echorl", "-n", "echorl-system"]).returncode == 0:
        proc = cluster.run(
            [*helm, "uninstall", "echorl", "-n", "echorl-system", "--wait", "--timeout", "3m"], timeout=240
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    else:  # the takeover did not run (-k): remove the kustomize install's operator by hand
        cluster.kubectl("delete", "deployment,serviceaccount,service,pdb", "-n", "echorl-system",
                        "-l", "app.kubernetes.io/name=echorl-operator", "--wait=true", check=True)  # fmt: skip
    cluster.kubectl("delete", "crd", *ECHO_CRDS, "--wait=true", "--timeout=120s", check=True, timeout=150)
    left = cluster.kubectl("get", "crd", "-o", "name").stdout
    assert "echorl.dev" not in left, left
    operators = cluster.kubectl_json("get", "deployments", "-n", "echorl-system")["items"]
    assert "echorl-operator" not in [d["metadata"]["name"] for d in operators]

    proc = cluster.run(
        [*helm, "install", "echorl", str(CHART), "--namespace", "echorl-system", "-f", str(values),
         "--wait", "--timeout", "5m"],
        timeout=420,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    crds = cluster.kubectl("get", "crd", "-o", "name").stdout
    assert all(f"customresourcedefinition.apiextensions.k8s.io/{c}" in crds for c in ECHO_CRDS), crds
    cluster.kubectl(
        "rollout", "status", "deployment/echorl-operator", "-n", "echorl-system", "--timeout=300s",
        check=True, timeout=330,
    )  # fmt: skip
    e2e.note("helm install on a cluster without Echo: deployed, CRDs created from the chart")
    e2e.apply(echojob("fresh", max_steps=8))
    done = e2e.wait_condition("fresh", "Succeeded")
    e2e.note(f"Succeeded under the freshly installed operator: {done['message']}")
    assert e2e.job("fresh")["status"]["policyVersion"] == 8
