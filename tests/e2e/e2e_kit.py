"""Helpers the e2e tests drive the cluster with: kubectl, as a user would, inside the cluster's namespace.

Waiting is by condition, never by a fixed sleep: :meth:`E2E.until` polls a predicate (``kubectl``
reads) until it holds or a generous deadline passes, then fails with what it last saw and a dump of
the namespace. Deadlines are there only so a broken cluster fails instead of hanging; the tests
assert states, not durations (durations are measured and printed).

:meth:`E2E.store_objects` lists the job's objects in the in-cluster MinIO from inside the cluster's
network namespace (through MinIO's Service address), with the MinIO SDK.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from services import argocd
from services.cluster import Cluster

T = TypeVar("T")
DEADLINE_S = 600.0
MINIO_ACCESS, MINIO_SECRET = "echorl-dev", "echorl-dev-secret"  # manifests/dev/minio.yaml
BUCKET = "echorl"


@dataclasses.dataclass
class Installed:
    cluster: Cluster


@dataclasses.dataclass
class E2E:
    cluster: Cluster
    namespace: str
    started: float = dataclasses.field(default_factory=time.monotonic)

    # -- kubectl -----------------------------------------------------------------------------
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, namespaced: bool = True
    ) -> str:
        ns = ["-n", self.namespace] if namespaced else []
        return self.cluster.kubectl(*ns, *args, input=input, check=check).stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def apply(self, manifest: str | dict[str, Any], server_side: bool = False) -> None:
        """``kubectl apply`` (``--server-side``, as Argo CD and Flux apply, when asked)."""
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest, sort_keys=False)
        extra = ["--server-side"] if server_side else []
        self.kubectl("apply", *extra, "-f", "-", input=textwrap.dedent(text))

    def health(self, name: str) -> tuple[str, str]:
        """What Argo CD's health check (manifests/argocd/echojob-health.lua) says of EchoJob ``name``."""
        return argocd.health(self.job(name))

    def job(self, name: str) -> dict[str, Any]:
        return dict(self.json("get", "echojob", name))

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        for cond in self.job(name).get("status", {}).get("conditions") or []:
            if cond.get("type") == type_:
                return dict(cond)
        return {}

    def pods(self, selector: str, field: str = "") -> list[dict[str, Any]]:
        args = ["get", "pods", "-l", selector] + ([f"--field-selector={field}"] if field else [])
        return list(self.json(*args)["items"])

    def wait_condition(self, name: str, type_: str, timeout: float = DEADLINE_S) -> dict[str, Any]:
        """``kubectl wait --for=condition=TYPE echojob/NAME``, then the condition itself."""
        self.kubectl("wait", f"--for=condition={type_}", f"echojob/{name}", f"--timeout={int(timeout)}s")
        return self.condition(name, type_)

    def until(
        self, what: str, check: Callable[[], T | None], timeout: float = DEADLINE_S, every: float = 2.0
    ) -> T:
        """Poll ``check`` until it returns something truthy; fail with a dump after ``timeout``."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                last = check()
            except AssertionError as exc:  # a kubectl read failed: try again until the deadline
                last = exc
            if last and not isinstance(last, AssertionError):
                return last
            if time.monotonic() > deadline:
                self.dump()
                raise AssertionError(f"{what}: not reached within {timeout:.0f} s; last seen: {last!r}")
            time.sleep(every)

    def version(self, name: str) -> int:
        return int(self.job(name).get("status", {}).get("policyVersion") or 0)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def note(self, text: str) -> None:
        """Progress on the terminal (pytest -s) and in the report's captured output."""
        print(f"[e2e {self.elapsed():6.1f} s] {text}", file=sys.stderr, flush=True)

    # -- namespace ---------------------------------------------------------------------------
    def create_namespace(self) -> None:
        self.kubectl("create", "namespace", self.namespace, namespaced=False)
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "minio-credentials"},
                "type": "Opaque",
                "stringData": {"accessKey": MINIO_ACCESS, "secretKey": MINIO_SECRET},
            }
        )

    def delete_namespace(self) -> None:
        self.kubectl(
            "delete",
            "namespace",
            self.namespace,
            "--wait=true",
            "--timeout=180s",
            namespaced=False,
            check=False,
        )

    def dump(self) -> None:
        """What a person would look at: the job, its pods and events, the operator's log."""
        for args in (
            ("get", "echojob,deploy,job,pods,svc", "-o", "wide"),
            ("get", "echojob", "-o", "yaml"),
            ("get", "events", "--sort-by=.lastTimestamp"),
        ):
            print(
                f"$ kubectl -n {self.namespace} {' '.join(args)}\n{self.kubectl(*args, check=False)}",
                file=sys.stderr,
            )
        print(
            self.kubectl(
                "-n",
                "echorl-system",
                "logs",
                "-l",
                "app.kubernetes.io/name=echorl-operator",  # both replicas: the leader's log and the other's
                "--prefix",
                "--tail=80",
                namespaced=False,
                check=False,
            ),
            file=sys.stderr,
        )

    # -- the snapshot store ------------------------------------------------------------------
    def store(self, prefix: str) -> dict[str, Any]:
        """Every object under ``prefix`` in the dev MinIO's bucket (name → the JSON of manifests and
        trainer records, else None), read from inside the cluster's network namespace through MinIO's Service address."""
        address = self.kubectl(
            "-n", "echorl-system", "get", "svc", "minio", "-o", "jsonpath={.spec.clusterIP}", namespaced=False
        )  # fmt: skip
        # A running trainer's retention may delete an object between the listing and the read: one that
        # is gone by then is left out, as if it had not been listed.
        code = textwrap.dedent(
            f"""
            import json
            from minio import Minio
            from minio.error import S3Error
            client = Minio({address + ":9000"!r}, access_key={MINIO_ACCESS!r}, secret_key={MINIO_SECRET!r}, secure=False)
            out = {{}}
            for o in client.list_objects({BUCKET!r}, prefix={prefix!r}, recursive=True):
                body = None
                if o.object_name.endswith(("/manifest.json", "/trainer-record.json")):
                    try:
                        body = json.loads(client.get_object({BUCKET!r}, o.object_name).read())
                    except S3Error as exc:
                        if exc.code != "NoSuchKey":
                            raise
                        continue
                out[o.object_name] = body
            print(json.dumps(out))
            """
        )
        proc = self.cluster.run([sys.executable, "-c", code], timeout=120)
        assert proc.returncode == 0, proc.stderr
        return dict(json.loads(proc.stdout))


@dataclasses.dataclass(frozen=True)
class Published:
    """One policy version as the store holds it."""

    version: int
    created: str
    """When its publish finished (the manifest's ``created``)."""
    data: str
    """The ``data-*`` folder its manifest names."""
    folders: frozenset[str]
    """Every ``data-*`` folder under the version: more than ``data`` means a publish was cut short."""


def published(objects: dict[str, Any], job: str, kind: str = "snapshots") -> dict[int, Published]:
    """The versions (or checkpoints) of ``job`` in a :meth:`E2E.store` listing."""
    folders: dict[int, set[str]] = {}
    manifests: dict[int, dict[str, Any]] = {}
    head = f"{job}/{kind}/"
    for name, body in objects.items():
        parts = name.removeprefix(head).split("/") if name.startswith(head) else []
        if not parts or not parts[0].isdigit():
            continue
        version = int(parts[0])
        if parts[1:] == ["manifest.json"] and body is not None:
            manifests[version] = body
        elif len(parts) > 2 and parts[1].startswith("data-"):
            folders.setdefault(version, set()).add(parts[1])
    return {
        v: Published(v, str(m["created"]), str(m["data"]), frozenset(folders.get(v, set())))
        for v, m in sorted(manifests.items())
    }
