"""Proof that ``kube_apiserver`` is a real Kubernetes API: CRUD, kubectl, CEL-validated CRDs,
watches, and RBAC for an unprivileged identity."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from services.kube import KubeApiServer

pytestmark = pytest.mark.services

T = TypeVar("T")

WIDGET_GROUP = "proof.echorl.dev"
WIDGET_CRD_NAME = f"widgets.{WIDGET_GROUP}"
WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": WIDGET_CRD_NAME},
    "spec": {
        "group": WIDGET_GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["minReplicas", "maxReplicas"],
                                "properties": {
                                    "minReplicas": {"type": "integer", "minimum": 0},
                                    "maxReplicas": {"type": "integer"},
                                    "mode": {"type": "string", "default": "sync"},
                                },
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.minReplicas <= self.maxReplicas",
                                        "message": "minReplicas must not exceed maxReplicas",
                                    }
                                ],
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def eventually(fn: Callable[[], T], timeout: float = 15.0, interval: float = 0.1) -> T:
    """Call ``fn`` until it stops raising; re-raise its last error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(interval)


@pytest.fixture
def core(kube_apiserver: KubeApiServer) -> Iterator[client.CoreV1Api]:
    with kube_apiserver.api_client() as api:
        yield client.CoreV1Api(api)


def test_apiserver_ready(kube_apiserver: KubeApiServer) -> None:
    assert kube_apiserver.get("/readyz") == b"ok"
    version = kube_apiserver.kubectl_json("version")
    assert version["serverVersion"]["gitVersion"].startswith("v1.")
    assert kube_apiserver.etcd.running() and kube_apiserver.apiserver.running()


def test_namespace_and_configmap_visible_to_kubectl(
    kube_apiserver: KubeApiServer, core: client.CoreV1Api
) -> None:
    ns = f"proof-{time.time_ns() % 10**9}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels={"proof": "yes"})))
    try:
        core.create_namespaced_config_map(
            ns,
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name="settings", labels={"app": "echo"}),
                data={"lr": "1e-6", "group_size": "8"},
            ),
        )
        got_ns = kube_apiserver.kubectl_json("get", "namespace", ns)
        assert got_ns["metadata"]["labels"]["proof"] == "yes"
        assert got_ns["status"]["phase"] == "Active"

        cm = kube_apiserver.kubectl_json("get", "configmap", "settings", "-n", ns)
        assert cm["data"] == {"lr": "1e-6", "group_size": "8"}
        assert cm["metadata"]["labels"] == {"app": "echo"}

        listed = kube_apiserver.kubectl_json("get", "configmaps", "-n", ns, "-l", "app=echo")
        assert [i["metadata"]["name"] for i in listed["items"]] == ["settings"]

        missing = kube_apiserver.kubectl("get", "configmap", "nope", "-n", ns)
        assert missing.returncode != 0 and "NotFound" in missing.stderr
    finally:
        core.delete_namespace(ns)


def test_crd_with_cel_validation(kube_apiserver: KubeApiServer, tmp_path: Path) -> None:
    crd_file = tmp_path / "widget-crd.yaml"
    crd_file.write_text(yaml.safe_dump(WIDGET_CRD))
    assert kube_apiserver.install_crds(crd_file) == [WIDGET_CRD_NAME]
    ns = "default"
    try:
        with kube_apiserver.api_client() as api:
            custom = client.CustomObjectsApi(api)

            def widget(name: str, lo: int, hi: int) -> dict[str, Any]:
                return {
                    "apiVersion": f"{WIDGET_GROUP}/v1",
                    "kind": "Widget",
                    "metadata": {"name": name},
                    "spec": {"minReplicas": lo, "maxReplicas": hi},
                }

            created = custom.create_namespaced_custom_object(
                WIDGET_GROUP, "v1", ns, "widgets", widget("ok", 1, 3)
            )
            assert created["spec"]["mode"] == "sync"  # structural-schema defaulting happened

            with pytest.raises(ApiException) as err:
                custom.create_namespaced_custom_object(WIDGET_GROUP, "v1", ns, "widgets", widget("bad", 5, 2))
            assert err.value.status == 422
            assert "minReplicas must not exceed maxReplicas" in str(err.value.body)

            with pytest.raises(ApiException) as err:
                custom.create_namespaced_custom_object(
                    WIDGET_GROUP, "v1", ns, "widgets", widget("neg", -1, 2)
                )
            assert err.value.status == 422 and "should be greater than or equal to 0" in str(err.value.body)

            # An update that breaks the rule is rejected too; kubectl reports the rule's message.
            bad_patch = kube_apiserver.kubectl(
                "patch",
                "widget.proof.echorl.dev",
                "ok",
                "-n",
                ns,
                "--type=merge",
                "-p",
                '{"spec": {"maxReplicas": 0}}',
            )
            assert bad_patch.returncode != 0
            assert "minReplicas must not exceed maxReplicas" in bad_patch.stderr

            # The status subresource is real: status is ignored on the main resource.
            custom.patch_namespaced_custom_object_status(
                WIDGET_GROUP, "v1", ns, "widgets", "ok", {"status": {"ready": 2}}
            )
            got = custom.get_namespaced_custom_object(WIDGET_GROUP, "v1", ns, "widgets", "ok")
            assert got["status"] == {"ready": 2}
            assert got["spec"] == {"minReplicas": 1, "maxReplicas": 3, "mode": "sync"}
    finally:
        kube_apiserver.kubectl("delete", "customresourcedefinition", WIDGET_CRD_NAME, "--wait=true")


def test_watch_sees_configmap_events(kube_apiserver: KubeApiServer, kube_namespace: str) -> None:
    ns = kube_namespace
    with kube_apiserver.api_client() as api:
        core = client.CoreV1Api(api)
        start_rv = core.list_namespaced_config_map(ns).metadata.resource_version

        core.create_namespaced_config_map(
            ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="watched"), data={"step": "0"})
        )
        core.patch_namespaced_config_map("watched", ns, {"data": {"step": "1"}})
        core.delete_namespaced_config_map("watched", ns)

        seen: list[tuple[str, str, dict[str, str] | None]] = []
        w = watch.Watch()
        for event in w.stream(
            core.list_namespaced_config_map, ns, resource_version=start_rv, timeout_seconds=20
        ):
            obj = event["object"]
            seen.append((event["type"], obj.metadata.name, obj.data))
            if event["type"] == "DELETED":
                w.stop()
    assert [(t, n) for t, n, _ in seen] == [
        ("ADDED", "watched"),
        ("MODIFIED", "watched"),
        ("DELETED", "watched"),
    ]
    assert seen[0][2] == {"step": "0"} and seen[1][2] == {"step": "1"}


def test_rbac_denies_then_allows_unprivileged_user(
    kube_apiserver: KubeApiServer, kube_namespace: str
) -> None:
    user = kube_apiserver.unprivileged_user
    role_name = f"echorl-proof-ns-reader-{kube_namespace}"
    with kube_apiserver.api_client() as admin_api, kube_apiserver.api_client(unprivileged=True) as user_api:
        user_core = client.CoreV1Api(user_api)
        rbac = client.RbacAuthorizationV1Api(admin_api)

        # Authenticated, but with no permissions: 403, and the server names the user.
        with pytest.raises(ApiException) as err:
            user_core.list_namespace()
        assert err.value.status == 403
        assert f'User "{user}" cannot list resource "namespaces"' in json.loads(err.value.body)["message"]
        with pytest.raises(ApiException) as err:
            user_core.list_namespaced_config_map(kube_namespace)
        assert err.value.status == 403
        assert (
            kube_apiserver.kubectl("auth", "can-i", "list", "namespaces", "--as", user).stdout.strip() == "no"
        )

        # Cluster-wide: a ClusterRole + ClusterRoleBinding lets the user list namespaces (only).
        rbac.create_cluster_role(
            client.V1ClusterRole(
                metadata=client.V1ObjectMeta(name=role_name),
                rules=[client.V1PolicyRule(api_groups=[""], resources=["namespaces"], verbs=["get", "list"])],
            )
        )
        subject = client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")
        rbac.create_cluster_role_binding(
            client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name=role_name),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role_name
                ),
                subjects=[subject],
            )
        )
        try:
            names = eventually(lambda: [n.metadata.name for n in user_core.list_namespace().items])
            assert kube_namespace in names and "default" in names
            with pytest.raises(ApiException) as err:
                user_core.list_namespaced_secret(kube_namespace)
            assert err.value.status == 403

            # Namespaced: a Role + RoleBinding grants config maps in this namespace and nowhere else.
            rbac.create_namespaced_role(
                kube_namespace,
                client.V1Role(
                    metadata=client.V1ObjectMeta(name="cm-reader"),
                    rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["list"])],
                ),
            )
            rbac.create_namespaced_role_binding(
                kube_namespace,
                client.V1RoleBinding(
                    metadata=client.V1ObjectMeta(name="cm-reader"),
                    role_ref=client.V1RoleRef(
                        api_group="rbac.authorization.k8s.io", kind="Role", name="cm-reader"
                    ),
                    subjects=[subject],
                ),
            )
            eventually(lambda: user_core.list_namespaced_config_map(kube_namespace))
            with pytest.raises(ApiException) as err:
                user_core.list_namespaced_config_map("default")
            assert err.value.status == 403
            with pytest.raises(ApiException) as err:
                user_core.create_namespaced_config_map(
                    kube_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"))
                )
            assert err.value.status == 403
            can_i = kube_apiserver.kubectl(
                "auth",
                "can-i",
                "list",
                "configmaps",
                "-n",
                kube_namespace,
                kubeconfig=kube_apiserver.unprivileged_kubeconfig,
            )
            assert can_i.stdout.strip() == "yes", can_i.stderr
        finally:
            rbac.delete_cluster_role_binding(role_name)
            rbac.delete_cluster_role(role_name)
