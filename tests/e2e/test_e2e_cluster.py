"""The test cluster is real and contained: a Ready node that runs pods, Services reached by DNS name
from inside pods, and a network namespace with no way out."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from e2e_kit import E2E

from services.cluster import Cluster, build_images

# The first e2e test's setup waits for the images (built in the background while the other tiers
# ran; a cold build takes half an hour), starts the cluster and installs Echo.
pytestmark = pytest.mark.timeout(3600)


def test_the_cluster_has_no_route_and_no_interface_leading_out(kube_cluster: Cluster) -> None:
    routes = kube_cluster.ns.ip_json("route", "show", "table", "all") + kube_cluster.ns.ip_json(
        "-6", "route", "show", "table", "all"
    )
    assert not [r for r in routes if r.get("dst") in ("default", "0.0.0.0/0", "::/0")], routes
    links = kube_cluster.ns.ip_json("-d", "link", "show")
    kinds = {
        link["ifname"]: link.get("linkinfo", {}).get("info_kind", link.get("link_type")) for link in links
    }
    assert set(kinds.values()) <= {"loopback", "veth"}, kinds
    # Every veth pairs with a pod's eth0 (both ends inside); every pod's only way is that veth.
    assert kube_cluster.containment() == []
    # A route lookup (no packet is sent) for a documentation address finds nothing.
    lookup = kube_cluster.run(["ip", "route", "get", "192.0.2.1"])
    assert lookup.returncode != 0 and "unreachable" in lookup.stderr.lower(), lookup
    # The node's address exists only in there, not on the host.
    host = subprocess.run(["ip", "-json", "addr"], capture_output=True, text=True, check=True).stdout
    assert kube_cluster.addresses.node_ip not in host


def test_the_node_is_real_and_its_pods_reach_services_by_dns_name(e2e: E2E) -> None:
    node = e2e.cluster.kubectl_json("get", "node", e2e.cluster.node_name)
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True"
    assert {a["type"]: a["address"] for a in node["status"]["addresses"]}[
        "InternalIP"
    ] == e2e.cluster.addresses.node_ip
    # A pod of the operator's image (Python) resolves the API server's and MinIO's Service names
    # through CoreDNS and gets an answer through kube-proxy's rules.
    script = (
        "import socket, urllib.request; "
        "print(socket.gethostbyname('kubernetes.default.svc.cluster.local')); "
        "print(urllib.request.urlopen('http://minio.echorl-system.svc:9000/minio/health/live').status)"
    )
    e2e.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "probe",
                        "image": e2e.cluster.images["operator"],
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", script],
                    }
                ],
            },
        }
    )
    e2e.until(
        "probe pod finished",
        lambda: e2e.json("get", "pod", "probe")["status"].get("phase") in ("Succeeded", "Failed"),
    )
    out = e2e.kubectl("logs", "probe")
    assert e2e.json("get", "pod", "probe")["status"]["phase"] == "Succeeded", out
    assert out.split() == [e2e.cluster.addresses.apiserver_service_ip, "200"]


def test_a_namespace_left_by_a_killed_image_build_is_removed_by_the_next_build(
    kube_cluster: Cluster, tmp_path: Path
) -> None:
    # SIGKILL gives scripts/images.sh no EXIT trap: its echorl-build-<pid> namespace stays, with
    # whatever ran inside. The next build (instant here: the images exist) must remove both.
    gone = subprocess.Popen(["true"])
    gone.wait()
    name = f"echorl-build-{gone.pid}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    lingering = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "600"])
    try:
        for _ in range(100):  # until the sleep runs in there (ip netns exec has exec'd it)
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
            if str(lingering.pid) in pids.split():
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the process never entered {name}")
        build_images(tmp_path / "images.log")
        assert not (Path("/run/netns") / name).exists()
        assert lingering.wait(timeout=30) == -9
        assert f"removed the network namespace {name}" in (tmp_path / "images.log").read_text()
    finally:
        if lingering.poll() is None:
            lingering.kill()
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
