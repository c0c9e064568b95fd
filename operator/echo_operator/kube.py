"""A thin, typed shell over the Kubernetes API for the handful of calls the operator makes.

Objects travel as plain dicts (what the pure modules produce and what ``kubectl`` shows), not as the
client's generated models. Writes of children are server-side applies with the operator's field
manager: re-applying an unchanged object is a no-op on the server (no new resourceVersion, no new
generation), and fields other managers own (an HPA's ``replicas``, a user's extra labels) are left
alone. Errors surface as :class:`KubeError` carrying the API status code and the server's message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from echo_operator import metrics, names

Object = dict[str, Any]

# (apiVersion, kind) → plural. Only what the operator touches.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("apps/v1", "Deployment"): "deployments",
    ("batch/v1", "Job"): "jobs",
    ("echorl.dev/v1alpha1", "EchoJob"): "echojobs",
    ("echorl.dev/v1alpha1", "InferenceSwarm"): "inferenceswarms",
    ("echorl.dev/v1alpha1", "TrainingSwarm"): "trainingswarms",
    ("echorl.dev/v1alpha1", "SyncPolicy"): "syncpolicies",
    ("kueue.x-k8s.io/v1beta2", "Workload"): "workloads",
    ("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass"): "workloadpriorityclasses",
    ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"): "resourceflavors",
    ("coordination.k8s.io/v1", "Lease"): "leases",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "customresourcedefinitions",
}


class KubeError(Exception):
    """An API call failed: ``status`` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str, what: str) -> None:
        super().__init__(f"{what}: {message} (HTTP {status})" if status else f"{what}: {message}")
        self.status = status
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


def path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    """REST path of a collection or an object."""
    plural = PLURALS[(api_version, kind)]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace is not None:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    return base if name is None else f"{base}/{name}"


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body).get("message", exc.reason))
    except (TypeError, ValueError):
        return str(exc.reason or exc)


class Kube:
    """The operator's Kubernetes API access (thread-safe: kopf runs sync handlers in threads)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.fence: Callable[[], bool] | None = None
        """When set (a replica elected leader, :mod:`echo_operator.leader`): asked before every write,
        which is refused unless it answers True: a replica that lost its Lease writes nothing more."""

    @classmethod
    def from_environment(cls, identity: str = "") -> Kube:
        """In-cluster service account if there is one, else ``$KUBECONFIG`` / ``~/.kube/config``.

        ``identity`` (a replica's pod name) goes into the User-Agent of every request, so the API
        server's audit log tells the replicas apart (they share a service account and field manager).
        """
        try:
            config.load_incluster_config()
            api = client.ApiClient()
        except config.ConfigException:
            # The client reads $KUBECONFIG when it is imported; read it now instead.
            api = config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"))
        api.user_agent = f"{names.MANAGER}/{identity}" if identity else names.MANAGER
        return cls(api)

    def close(self) -> None:
        self.api.close()

    def _call(
        self,
        method: str,
        url: str,
        what: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Object:
        data = self._send(
            method, url, what, body, query, {"Content-Type": content_type, "Accept": "application/json"}
        )
        return dict(json.loads(data)) if data else {}

    def _send(
        self,
        method: str,
        url: str,
        what: str,
        body: Any,
        query: list[tuple[str, str]] | None,
        headers: dict[str, str],
        timeout_s: float = 30,
    ) -> bytes:
        """One request, fenced on the leader Lease for writes, counted in the metrics; the body's bytes."""
        if method != "GET" and self.fence is not None and not self.fence() and "selfsubject" not in url:
            raise KubeError(0, "not written: this operator replica no longer holds the leader Lease", what)
        code = 0
        try:
            resp = self.api.call_api(
                url,
                method,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout_s,
            )
            answered = resp if hasattr(resp, "status") else resp[0]
            code = int(getattr(answered, "status", 200) or 200)
        except ApiException as exc:
            code = exc.status or 0
            raise KubeError(exc.status or 0, _message(exc), what) from None
        except Exception as exc:  # connection refused, TLS, timeouts
            raise KubeError(0, str(exc), what) from exc
        finally:
            metrics.api_request(method, code)
            if url.endswith("/status") and method != "GET" and code:
                metrics.STATUS_WRITES.labels(what.split()[1]).inc()
        return bytes(answered.data or b"")

    # -- reads ---------------------------------------------------------------------------------
    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Object | None:
        try:
            return self._call("GET", path(api_version, kind, namespace, name), f"get {kind} {name}")
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str | None, selector: dict[str, str] | None = None
    ) -> list[Object]:
        query = []
        if selector:
            query.append(("labelSelector", ",".join(f"{k}={v}" for k, v in sorted(selector.items()))))
        body = self._call("GET", path(api_version, kind, namespace), f"list {kind}", query=query)
        items: list[Object] = body.get("items", [])
        for item in items:  # list items come without apiVersion/kind
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    def log(
        self,
        namespace: str,
        pod: str,
        container: str,
        previous: bool = False,
        tail_lines: int = 1000,
        limit_bytes: int = 1 << 20,
        timeout_s: float = 5.0,
    ) -> str:
        """The last ``tail_lines`` lines of a container's log (``previous``: of its last run before a
        restart), at most ``limit_bytes`` of them, as text (``pods/log``; undecodable bytes replaced).
        Read through the API server, which asks the pod's kubelet: a pod with no node, or a node whose
        kubelet does not answer, is a :class:`KubeError` like any other."""
        what = f"read log of pod {pod} container {container}{' (previous)' if previous else ''}"
        query = [
            ("container", container),
            ("tailLines", str(tail_lines)),
            ("limitBytes", str(limit_bytes)),
        ]
        if previous:
            query.append(("previous", "true"))
        data = self._send(
            "GET",
            path("v1", "Pod", namespace, pod) + "/log",
            what,
            None,
            query,
            {"Accept": "application/json, */*"},  # */*: the log is text; errors are JSON
            timeout_s,
        )
        return data.decode("utf-8", errors="replace")

    def may(self, verb: str, group: str, resource: str, namespace: str | None = None) -> bool:
        """Whether this identity may ``verb`` ``resource`` (a SelfSubjectAccessReview; any user may ask)."""
        attributes = {"verb": verb, "group": group, "resource": resource}
        if namespace is not None:
            attributes["namespace"] = namespace
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        body = self._call(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            f"review {verb} {resource}",
            body=review,
        )
        return bool(body.get("status", {}).get("allowed", False))

    # -- writes --------------------------------------------------------------------------------
    def apply(
        self, obj: Object, dry_run: bool = False, force: bool = True, manager: str = names.MANAGER
    ) -> Object:
        """Server-side apply ``obj`` as ``manager`` (the operator's); returns the object as stored."""
        meta = obj["metadata"]
        query = [("fieldManager", manager), ("force", "true" if force else "false")]
        if dry_run:
            query.append(("dryRun", "All"))
        return self._call(
            "PATCH",
            path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]),
            f"apply {obj['kind']} {meta['name']}",
            body=obj,
            query=query,
            content_type="application/apply-patch+yaml",
        )

    def create(self, obj: Object) -> Object:
        meta = obj["metadata"]
        return self._call(
            "POST",
            path(obj["apiVersion"], obj["kind"], meta.get("namespace")),
            f"create {obj['kind']} {meta.get('name') or meta.get('generateName', '')}",
            body=obj,
            query=[("fieldManager", names.MANAGER)],
        )

    def update(self, obj: Object) -> Object:
        """PUT ``obj`` whole, guarded by its ``metadata.resourceVersion`` (a conflict is a 409)."""
        meta = obj["metadata"]
        return self._call(
            "PUT",
            path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]),
            f"update {obj['kind']} {meta['name']}",
            body=obj,
            query=[("fieldManager", names.MANAGER)],
        )

    def merge_patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Object,
        subresource: str = "",
    ) -> Object:
        url = path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return self._call(
            "PATCH",
            url,
            f"patch {kind} {name}{'/' + subresource if subresource else ''}",
            body=patch,
            query=[("fieldManager", names.MANAGER)],
            content_type="application/merge-patch+json",
        )

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str, status: Object) -> Object:
        """Merge-patch ``status`` through the status subresource (``None`` values delete keys)."""
        return self.merge_patch(api_version, kind, namespace, name, {"status": status}, subresource="status")

    def replace_status(self, api_version: str, kind: str, namespace: str, name: str, obj: Object) -> Object:
        """PUT the whole object to its status subresource: guarded by its ``resourceVersion`` (a
        conflict is a 409 :class:`KubeError`), and, unlike a merge patch, it can drop a field another
        manager wrote (Kueue's ``status.admission``)."""
        return self._call(
            "PUT",
            path(api_version, kind, namespace, name) + "/status",
            f"update {kind} {name}/status",
            body=obj,
            query=[("fieldManager", names.MANAGER)],
        )

    def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        uid: str | None = None,
        propagation: str = "Background",
    ) -> bool:
        """Delete; True if it existed. ``uid`` guards against a re-created object. ``Foreground``
        propagation keeps the object (terminating) until its dependents, e.g. a Job's pods, are gone."""
        body: Object = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            self._call("DELETE", path(api_version, kind, namespace, name), f"delete {kind} {name}", body=body)
        except KubeError as exc:
            if exc.not_found:
                return False
            raise
        return True
