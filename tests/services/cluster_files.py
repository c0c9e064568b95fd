"""The test cluster's configuration files, as pure functions of its addresses and paths.

One function per component; :mod:`services.cluster` writes what they return and starts the process.
The choices that matter on this kind of machine (``notes/kubernetes-node.md``) are made here, each
with its reason next to it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml


@dataclasses.dataclass(frozen=True)
class Addresses:
    """The cluster's addresses: they exist only inside its network namespace."""

    node_ip: str = "10.250.0.2"
    service_cidr: str = "10.96.0.0/24"
    apiserver_service_ip: str = "10.96.0.1"
    """The ``kubernetes`` Service: the first address of the service range."""
    cluster_cidr: str = "10.244.0.0/16"
    node_pod_cidr: str = "10.244.0.0/24"
    """Pod addresses of the real node (host-local IPAM)."""
    simulated_pod_cidr: str = "10.244.64.0/18"
    """Pod addresses kwok hands to pods on simulated nodes (never routed: nothing runs there)."""
    apiserver_port: int = 6443
    cluster_domain: str = "cluster.local"

    @property
    def dns_ip(self) -> str:
        """CoreDNS runs as a process on the node's address (kubelet ``clusterDNS``)."""
        return self.node_ip


def containerd_config(root: Path, state: Path, socket: Path, cni_conf_dir: Path, sandbox_image: str) -> str:
    """containerd 1.6 with the CRI plugin, runc, overlayfs, CNI from Debian's plugin directory."""
    return f"""version = 2
root = "{root}"
state = "{state}"
oom_score = 0
# Nothing but the CRI plugin's needs: no other snapshotters, no TCP/metrics listeners.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  # Root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj is refused and runc fails with
  # "can't get final child's PID from pipe"; clamp container scores to containerd's own (0).
  restrict_oom_score_adj = true
  # Pod network namespaces under our state dir, not /run/netns: nothing of the cluster outside it.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf_dir}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # crun fails on cgroup v1 hybrid; Debian's runc works.
        BinaryName = "/usr/sbin/runc"
        Root = "{state / "runc"}"
        SystemdCgroup = false
"""


def cni_config(addresses: Addresses, ipam_dir: Path) -> str:
    """A ``ptp`` network: one veth per pod, both ends inside the cluster's namespaces.

    ``ptp`` rather than ``bridge``: every packet between pods is routed through the node's namespace,
    so kube-proxy's NAT rules see both directions without ``br_netfilter`` or masquerading.
    """
    return json.dumps(
        {
            "cniVersion": "0.4.0",
            "name": "echorl-pods",
            "plugins": [
                {
                    "type": "ptp",
                    "mtu": 1500,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(ipam_dir),
                        "ranges": [[{"subnet": addresses.node_pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "loopback"},
            ],
        },
        indent=2,
    )


def kubelet_config(
    addresses: Addresses,
    ca_file: Path,
    runtime_socket: Path,
    cgroup_root: str,
    pod_logs_dir: Path,
    resolv_conf: Path,
) -> str:
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # cgroup v1 hybrid, cgroupfs (no systemd), swap allowed: this machine's kind.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,  # every pod cgroup below it: one directory to find and remove
        "failSwapOn": False,
        "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE: a negative score is refused
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "address": addresses.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "clusterDNS": [addresses.dns_ip],
        "clusterDomain": addresses.cluster_domain,
        # Pods' DNS base (dnsPolicy Default too): the cluster's DNS, never the host's resolvers.
        "resolvConf": str(resolv_conf),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(pod_logs_dir),
        "staticPodPath": "",
        # The images are imported once and never pulled: never garbage-collect them, and evict only
        # when the disk is really full (CI machines' disks are shared).
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%"},
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "shutdownGracePeriod": "0s",
        "protectKernelDefaults": False,
        "maxPods": 110,
    }
    return yaml.safe_dump(config, sort_keys=False)


def kube_proxy_config(addresses: Addresses, kubeconfig: Path, node_name: str) -> str:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "bindAddress": addresses.node_ip,
        "clusterCIDR": addresses.cluster_cidr,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # /proc/sys/net/netfilter/nf_conntrack_max is not writable here: leave conntrack's sizes alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "nodePortAddresses": [f"{addresses.node_ip}/32"],
    }
    return yaml.safe_dump(config, sort_keys=False)


def corefile(addresses: Addresses, kubeconfig: Path) -> str:
    """CoreDNS for the cluster's names only: no ``forward``, so an outside name fails at once."""
    return f""".:53 {{
    bind {addresses.dns_ip}
    errors
    health 127.0.0.1:8081
    ready 127.0.0.1:8181
    kubernetes {addresses.cluster_domain} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""


def resolv_conf(addresses: Addresses) -> str:
    return f"nameserver {addresses.dns_ip}\noptions ndots:5\n"


BOOTSTRAP_RBAC = """
# CoreDNS's kubernetes plugin reads Services, EndpointSlices and Namespaces.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "echorl-test:coredns"}
rules:
  - apiGroups: [""]
    resources: [services, namespaces, endpoints, pods]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "echorl-test:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "echorl-test:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "echorl-test:coredns"}]
---
# The API server's client identity towards the kubelet (logs, exec, port-forward).
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "echorl-test:apiserver-kubelet"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:kubelet-api-admin"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "echorl-test:apiserver"}]
---
# kwok plays the kubelet of the simulated nodes: it writes their nodes', leases' and pods' status.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "echorl-test:kwok"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "echorl-test:kwok"}]
"""


METRICS_SERVER_PORT = 4443
"""metrics-server listens on the node's address, beside the kubelet (10250) and the API server (6443)."""

METRICS_SERVER_RBAC = """
# metrics-server reads pods and nodes and scrapes each kubelet's /metrics/resource (nodes/metrics).
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "echorl-test:metrics-server"}
rules:
  - apiGroups: [""]
    resources: [pods, nodes, namespaces, configmaps]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [nodes/metrics]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "echorl-test:metrics-server"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "echorl-test:metrics-server"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "echorl-test:metrics-server"}]
---
# As an aggregated API server it delegates authentication and authorization to the API server.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "echorl-test:metrics-server:auth-delegator"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:auth-delegator"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "echorl-test:metrics-server"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: "echorl-test:metrics-server:auth-reader", namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: "extension-apiserver-authentication-reader"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "echorl-test:metrics-server"}]
"""


def metrics_api(addresses: Addresses) -> str:
    """The resource metrics API (``metrics.k8s.io``) served by the metrics-server process on the node.

    A Service without a selector and an EndpointSlice whose one endpoint is that process; the API
    server, run with ``--enable-aggregator-routing``, proxies ``/apis/metrics.k8s.io`` to it. metrics-server's serving
    certificate is self-signed, hence ``insecureSkipTLSVerify`` (a test cluster only: the connection
    never leaves the namespace).
    """
    port = METRICS_SERVER_PORT
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "metrics-server", "namespace": "kube-system"},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "metrics-server-node",
                "namespace": "kube-system",
                "labels": {"kubernetes.io/service-name": "metrics-server"},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [addresses.node_ip], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": "v1beta1.metrics.k8s.io"},
            "spec": {
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                "service": {"name": "metrics-server", "namespace": "kube-system", "port": 443},
                "insecureSkipTLSVerify": True,
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        },
    ]
    return "\n---\n".join(yaml.safe_dump(o, sort_keys=False) for o in objects)


def kwok_config(stage_files: list[Path]) -> str:
    """kwok's configuration: its Stage manifests (node init, lease heartbeats, pod lifecycle)."""
    return "\n---\n".join(p.read_text().strip() for p in sorted(stage_files)) + "\n"
