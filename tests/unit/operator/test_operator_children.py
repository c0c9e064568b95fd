"""The children of an EchoJob, computed from its spec: what each pod gets, and what never changes."""

from __future__ import annotations

import base64
import dataclasses
import pathlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from echo_operator import children, names
from echo_operator.children import coordinator, inputs, pods, token_secrets
from echo_operator.config import Images, Settings
from echo_runtime import spec

SETTINGS = Settings()


def by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {children.key(o): o for o in objects}


def container(obj: dict[str, Any]) -> dict[str, Any]:
    (only,) = obj["spec"]["template"]["spec"]["containers"]
    return dict(only)


def env_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(obj)["env"]}


def workloads(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (o for o in objects if o["kind"] in ("Deployment", "Job"))


# ---------------------------------------------------------------------------------------------
# The set of children


def test_heterogeneous_job_gets_every_child_and_no_pods_for_external_pools(make_job: Any) -> None:
    objs = children.desired(make_job(), SETTINGS)
    assert [children.key(o) for o in objs] == [
        ("ConfigMap", "demo-config"),
        ("Secret", "demo-tokens"),
        ("Service", "demo-coordinator"),
        ("Service", "demo-coordinator-external"),
        ("Deployment", "demo-coordinator"),
        ("Service", "demo-trainer"),
        ("Job", "demo-trainer"),
        ("Deployment", "demo-gpu"),
        ("Deployment", "demo-cpu"),
        ("Deployment", "demo-shared"),
    ]
    assert ("Deployment", "demo-mac") not in by_key(objs)


def test_every_child_is_labelled_namespaced_and_controlled_by_the_job(make_job: Any) -> None:
    for obj in children.desired(make_job(uid="u-42"), SETTINGS):
        meta = obj["metadata"]
        assert meta["namespace"] == "ml"
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "echorl.dev/v1alpha1",
            "kind": "EchoJob",
            "name": "demo",
            "uid": "u-42",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        labels = meta["labels"]
        assert labels[names.JOB] == "demo"
        assert labels["app.kubernetes.io/instance"] == "demo"
        assert labels["app.kubernetes.io/managed-by"] == "echorl-operator"
        assert labels["app.kubernetes.io/part-of"] == "echorl"
        assert labels["app.kubernetes.io/component"] == labels[names.COMPONENT]


def test_selectors_match_their_pods_and_services_match_their_workloads(make_job: Any) -> None:
    objs = children.desired(make_job(), SETTINGS)
    index = by_key(objs)
    for obj in workloads(objs):
        if obj["kind"] == "Job":
            continue  # the Job controller selects its pods by its own uid label
        selector = obj["spec"]["selector"]["matchLabels"]
        pod_labels = obj["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
    coordinator_pods = index[("Deployment", "demo-coordinator")]["spec"]["template"]["metadata"]["labels"]
    for svc in ("demo-coordinator", "demo-coordinator-external"):
        assert index[("Service", svc)]["spec"]["selector"].items() <= coordinator_pods.items()
    trainer_pods = index[("Job", "demo-trainer")]["spec"]["template"]["metadata"]["labels"]
    assert index[("Service", "demo-trainer")]["spec"]["selector"].items() <= trainer_pods.items()


def test_same_input_gives_identical_output(make_job: Any) -> None:
    first = yaml.safe_dump(children.desired(make_job(), SETTINGS))
    second = yaml.safe_dump(children.desired(make_job(), SETTINGS))
    assert first == second


# ---------------------------------------------------------------------------------------------
# Inference pools


def test_gpu_pool_gets_vllm_image_placement_gpu_and_in_place_rollout(make_job: Any) -> None:
    gpu = by_key(children.desired(make_job(), SETTINGS))[("Deployment", "demo-gpu")]
    pod = gpu["spec"]["template"]["spec"]
    c = container(gpu)
    assert gpu["spec"]["replicas"] == 3
    assert c["image"] == Images().worker_vllm
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    node_affinity = pod["affinity"]["nodeAffinity"]
    assert node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]
    }
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}]}}
    ]
    assert c["resources"] == {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"nvidia.com/gpu": "1"}}
    assert gpu["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    args = c["command"]
    assert args[:2] == ["echorl", "worker"]
    assert args[args.index("--coordinator") + 1] == "http://demo-coordinator.ml.svc:8700"
    assert args[args.index("--pool") + 1] == "gpu"
    assert args[args.index("--backend") + 1] == "vllm"
    assert env_of(gpu)["ECHORL_TOKEN"] == {"secretKeyRef": {"name": "demo-gpu-join", "key": "token"}}
    assert args[args.index("--job") + 1] == pods.JOB_FILE
    assert {"name": "job", "mountPath": "/etc/echorl/job", "readOnly": True} in c["volumeMounts"]


def test_explicit_gpu_count_is_kept(make_job: Any) -> None:
    text = """
    apiVersion: echorl.dev/v1alpha1
    kind: EchoJob
    metadata: {name: demo, namespace: ml}
    spec:
      inferenceSwarms:
      - {name: big, device: cuda, resources: {limits: {nvidia.com/gpu: "4"}}}
    """
    big = by_key(children.desired(make_job(text), SETTINGS))[("Deployment", "demo-big")]
    assert container(big)["resources"] == {"limits": {"nvidia.com/gpu": "4"}}
    assert container(big)["image"] == Images().worker_cpu  # torch from PyPI is the CUDA build


def test_vllm_gpus_per_replica_requests_the_gpus_and_shards_the_model_over_them(make_job: Any) -> None:
    text = """
    apiVersion: echorl.dev/v1alpha1
    kind: EchoJob
    metadata: {name: demo, namespace: ml}
    spec:
      inferenceSwarms:
      - {name: tp, backend: vllm, gpusPerReplica: 4}
      - {name: one, backend: vllm}
    """
    objs = by_key(children.desired(make_job(text), SETTINGS))
    tp, one = container(objs[("Deployment", "demo-tp")]), container(objs[("Deployment", "demo-one")])
    assert tp["resources"] == {"limits": {"nvidia.com/gpu": "4"}}
    assert tp["command"][tp["command"].index("--tensor-parallel-size") + 1] == "4"
    assert (
        one["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
        and "--tensor-parallel-size" not in one["command"]
    )
    # The pod's shape, not what the processes read: the job manifest does not carry it.
    assert "gpusPerReplica" not in objs[("ConfigMap", "demo-config")]["data"]["job.yaml"]


def test_cpu_pool_without_replicas_leaves_the_field_to_others(make_job: Any) -> None:
    cpu = by_key(children.desired(make_job(), SETTINGS))[("Deployment", "demo-cpu")]
    assert "replicas" not in cpu["spec"]  # `kubectl scale deployment` or an HPA may own it
    c = container(cpu)
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    assert c["command"][c["command"].index("--threads") + 1] == "4"
    assert env_of(cpu)["OMP_NUM_THREADS"] == "4"
    assert cpu["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": "25%", "maxUnavailable": "25%"}
    assert not any(m["name"] == "dshm" for m in c["volumeMounts"])


def test_pool_from_an_inference_swarm_uses_its_spec_and_carries_its_label(make_job: Any) -> None:
    shared = by_key(children.desired(make_job(), SETTINGS))[("Deployment", "demo-shared")]
    assert shared["spec"]["replicas"] == 2
    assert container(shared)["image"] == "registry.local/echorl-cpu:dev"
    assert shared["metadata"]["labels"][names.INFERENCE_SWARM] == "shared-pool"
    assert shared["spec"]["template"]["metadata"]["labels"][names.INFERENCE_SWARM] == "shared-pool"
    assert names.INFERENCE_SWARM not in shared["spec"]["selector"]["matchLabels"]  # selectors are immutable


def test_workers_get_read_only_store_credentials_and_the_rest_full_ones(make_job: Any) -> None:
    index = by_key(children.desired(make_job(readonly="demo-storage-readonly"), SETTINGS))
    ro = {"secretKeyRef": {"name": "demo-storage-readonly", "key": "accessKey"}}
    full = {"secretKeyRef": {"name": "creds", "key": "accessKey"}}
    for pool in ("demo-gpu", "demo-cpu", "demo-shared"):
        assert env_of(index[("Deployment", pool)])["ECHORL_S3_ACCESS_KEY"] == ro
    assert env_of(index[("Deployment", "demo-coordinator")])["ECHORL_S3_ACCESS_KEY"] == full
    assert env_of(index[("Job", "demo-trainer")])["ECHORL_S3_ACCESS_KEY"] == full


def test_without_read_only_credentials_workers_fall_back_and_without_any_get_none(make_job: Any) -> None:
    index = by_key(children.desired(make_job(), SETTINGS))
    assert env_of(index[("Deployment", "demo-cpu")])["ECHORL_S3_SECRET_KEY"] == {
        "secretKeyRef": {"name": "creds", "key": "secretKey"}
    }
    ambient = by_key(children.desired(make_job(secret=None), SETTINGS))
    for obj in workloads(list(ambient.values())):
        assert "ECHORL_S3_ACCESS_KEY" not in env_of(obj)  # e.g. IAM roles for service accounts


# ---------------------------------------------------------------------------------------------
# Trainer and coordinator


def test_trainer_is_an_indexed_job_that_fails_as_a_gang_with_rendezvous_env_under_torchrun(
    make_job: Any,
) -> None:
    index = by_key(children.desired(make_job(), SETTINGS))
    job = index[("Job", "demo-trainer")]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    # One failed rank fails the whole Job (the operator restarts every rank), never one at a time.
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"] == [
        {"type": "DisruptionTarget", "status": "True"}
    ]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["subdomain"] == "demo-trainer"  # pod demo-trainer-0 is demo-trainer-0.demo-trainer.ml.svc
    env = env_of(job)
    assert env["MASTER_ADDR"] == "demo-trainer-0.demo-trainer.ml.svc"
    assert env["MASTER_PORT"] == "29500"
    assert env["NNODES"] == "2"
    assert env["NPROC_PER_NODE"] == "2"
    assert env["NODE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-completion-index']"}
    }
    assert env["ECHORL_TRAINER_TOKEN"] == {"secretKeyRef": {"name": "demo-trainer-join", "key": "token"}}
    args = container(job)["command"]
    assert args[:2] == ["torchrun", "--no-python"]
    assert "--node-rank=$(NODE_RANK)" in args
    assert args[args.index("echorl") :][:2] == ["echorl", "trainer"]
    assert container(job)["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert container(job)["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert pod["nodeSelector"] == {"echorl.dev/pool": "train"}
    svc = index[("Service", "demo-trainer")]["spec"]
    assert svc["clusterIP"] == "None"
    assert svc["publishNotReadyAddresses"] is True


def test_a_change_of_what_the_trainer_runs_changes_its_jobs_hash(make_job: Any) -> None:
    text = "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: solo, namespace: ml}\n"
    base = by_key(children.desired(make_job(text), SETTINGS))[("Job", "solo-trainer")]
    changed = by_key(children.desired(make_job(text + "spec: {algorithm: {learningRate: 0.01}}\n"), SETTINGS))
    lifecycle_only = by_key(children.desired(make_job(text + "spec: {backoffLimit: 7}\n"), SETTINGS))
    hash_ = names.SPEC_HASH
    assert (
        changed[("Job", "solo-trainer")]["metadata"]["annotations"][hash_]
        != base["metadata"]["annotations"][hash_]
    )
    assert lifecycle_only[("Job", "solo-trainer")] == base  # backoffLimit is the operator's alone


def test_suspended_or_finished_jobs_have_no_trainer_and_no_running_processes(make_job: Any) -> None:
    text = "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: solo, namespace: ml}\n"
    for job in (
        make_job(text + "spec: {suspend: true}\n"),
        dataclasses.replace(make_job(text), finished=True),
    ):
        objs = by_key(children.desired(job, SETTINGS))
        assert ("Job", "solo-trainer") not in objs
        assert all(o["spec"]["replicas"] == 0 for k, o in objs.items() if k[0] == "Deployment")


def test_single_process_trainer_runs_without_torchrun(make_job: Any) -> None:
    text = "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: solo, namespace: ml}\n"
    sts = by_key(children.desired(make_job(text), SETTINGS))[("Job", "solo-trainer")]
    assert container(sts)["command"][:4] == ["echorl", "trainer", "--job", pods.JOB_FILE]
    assert "--resume" in container(sts)["command"]
    assert "resources" not in container(sts) or "limits" not in container(sts)["resources"]


def test_trackers_get_their_credentials_from_a_secret_and_one_run_id_per_job(make_job: Any) -> None:
    text = "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: solo, namespace: ml}\n"
    plain = by_key(children.desired(make_job(text), SETTINGS))[("Job", "solo-trainer")]
    assert "ECHORL_TRACKING_RUN_ID" not in env_of(plain) and "envFrom" not in container(plain)
    tracked = (
        text + "spec: {trainingSwarm: {tracking: {reportTo: [wandb, mlflow], secretName: tracker-keys}}}\n"
    )
    job = by_key(children.desired(make_job(tracked, uid="0123456789abcdef"), SETTINGS))[
        ("Job", "solo-trainer")
    ]
    assert env_of(job)["ECHORL_TRACKING_RUN_ID"] == "solo-01234567"
    assert container(job)["envFrom"] == [{"secretRef": {"name": "tracker-keys"}}]
    # The trainer reads which trackers from the manifest; the command line does not say none.
    assert "--report-to" not in container(job)["command"]


def test_a_reward_model_gets_a_scoring_pool_the_coordinator_calls_with_the_scorer_token(
    make_job: Any,
) -> None:
    text = (
        "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: solo, namespace: ml}\n"
        "spec:\n  rewardModels:\n  - {name: judge, type: Judge, model: /models/j, rubric: '{prompt} {completion}',"
        " replicas: 2, nodeSelector: {pool: rm}}\n"
    )
    job = make_job(text)
    index = by_key(children.desired(job, SETTINGS))
    deployment, service = index[("Deployment", "solo-scorer-judge")], index[("Service", "solo-scorer-judge")]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "rm"}
    command = container(deployment)["command"]
    assert command[:2] == ["echorl", "scorer"] and command[command.index("--reward-model") + 1] == "judge"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    token = {"secretKeyRef": {"name": "solo-scorer-token", "key": "token"}}
    assert env_of(deployment)["ECHORL_SCORER_TOKEN"] == token
    coordinator = index[("Deployment", "solo-coordinator")]
    assert env_of(coordinator)["ECHORL_SCORER_TOKEN"] == token
    args = container(coordinator)["command"]
    assert args[args.index("--reward-model") + 1] == "judge=http://solo-scorer-judge.ml.svc:8710"
    assert "scorer" in children.roles(job)
    # No worker or trainer holds the scoring token.
    for obj in (index[("Job", "solo-trainer")], *(o for k, o in index.items() if k[1] == "solo-default")):
        assert "ECHORL_SCORER_TOKEN" not in env_of(obj)
    suspended = by_key(
        children.desired(make_job(text.replace("spec:\n", "spec:\n  suspend: true\n")), SETTINGS)
    )
    assert suspended[("Deployment", "solo-scorer-judge")]["spec"]["replicas"] == 0
    plain = by_key(children.desired(make_job(text.split("spec:")[0]), SETTINGS))
    assert not [k for k in plain if "scorer" in k[1]] and "scorer" not in children.roles(
        make_job(text.split("spec:")[0])
    )


def test_coordinator_is_a_recreated_singleton_with_probes_and_the_tokens_file(make_job: Any) -> None:
    index = by_key(children.desired(make_job(), SETTINGS))
    dep = index[("Deployment", "demo-coordinator")]
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    c = container(dep)
    assert c["command"][:2] == ["echorl", "coordinator"]
    assert c["command"][c["command"].index("--tokens-file") + 1] == pods.TOKENS_FILE
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tokens"] == {"name": "tokens", "secret": {"secretName": "demo-tokens"}}
    assert volumes["job"] == {"name": "job", "configMap": {"name": "demo-config"}}


def test_the_coordinators_startup_probe_waits_for_it_instead_of_being_refused(make_job: Any) -> None:
    """The probe's script, run for real: it returns 0 once /healthz answers (the server comes up a
    moment after it starts, as a coordinator does), 1 when nothing answers within its time."""
    import http.server
    import subprocess
    import sys
    import threading
    import time

    from echo_operator.children import coordinator as coordinator_children

    c = container(by_key(children.desired(make_job(), SETTINGS))[("Deployment", "demo-coordinator")])
    probe = c["startupProbe"]
    assert probe["timeoutSeconds"] > coordinator_children.STARTUP_WAIT_S  # the kubelet lets it wait
    script, limit, url = probe["exec"]["command"][2:]
    assert url.endswith(f":{names.COORDINATOR_PORT}/healthz")

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    local = f"http://127.0.0.1:{port}/healthz"
    nothing = subprocess.run([sys.executable, "-c", script, "1", local], timeout=30)
    assert nothing.returncode == 1
    started = time.monotonic()
    waiter = subprocess.Popen([sys.executable, "-c", script, limit, local])
    time.sleep(1.0)  # the coordinator still starting: connections refused
    assert waiter.poll() is None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert waiter.wait(30) == 0
    finally:
        server.shutdown()
    assert time.monotonic() - started < float(limit)


def test_metrics_auth_closes_the_coordinators_metrics_and_drops_the_scrape_annotations(make_job: Any) -> None:
    def coordinator(settings: Settings) -> dict[str, Any]:
        return by_key(children.desired(make_job(), settings))[("Deployment", "demo-coordinator")]

    open_, closed = coordinator(SETTINGS), coordinator(Settings(metrics_auth=True))
    assert "--metrics-auth" not in container(open_)["command"]
    assert open_["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert "--metrics-auth" in container(closed)["command"]
    assert not any(
        k.startswith("prometheus.io/") for k in closed["spec"]["template"]["metadata"]["annotations"]
    )
    assert Settings.from_env({"ECHORL_METRICS_AUTH": "true"}).metrics_auth
    with pytest.raises(ValueError, match="ECHORL_METRICS_AUTH: must be true or false"):
        Settings.from_env({"ECHORL_METRICS_AUTH": "yes"})


def test_pods_run_unprivileged_without_api_access(make_job: Any) -> None:
    for obj in workloads(children.desired(make_job(), SETTINGS)):
        pod = obj["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        sc = container(obj)["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container(obj)["volumeMounts"]


# ---------------------------------------------------------------------------------------------
# Tokens and the job manifest


def test_tokens_file_holds_digests_never_tokens(make_job: Any) -> None:
    job = make_job()
    secret = by_key(children.desired(job, SETTINGS))[("Secret", "demo-tokens")]
    text = base64.b64decode(secret["data"]["tokens.yaml"]).decode()
    data = yaml.safe_load(text)
    assert data["trainer"] == f"sha256:{job.token_digests['trainer']}"
    assert set(data["pools"]) == {"gpu", "cpu", "mac", "shared"}
    assert all(v.startswith("sha256:") and len(v) == 7 + 64 for v in data["pools"].values())
    assert data["status"] == f"sha256:{job.token_digests['status']}"  # read-only: the operator's


def test_join_secret_follows_the_contract() -> None:
    owner = {"uid": "u"}
    external = {"coordinator": "https://1.2.3.4:8443", "fingerprint": "sha256:" + "ab" * 32, "ca.crt": None}
    secret = token_secrets.join_secret("demo", "ml", owner, "mac", "tok-123", external)
    assert secret["metadata"]["name"] == "demo-mac-join"
    assert base64.b64decode(secret["data"]["token"]).decode() == "tok-123"
    assert base64.b64decode(secret["data"]["coordinator"]).decode() == "https://1.2.3.4:8443"
    assert base64.b64decode(secret["data"]["fingerprint"]).decode() == "sha256:" + "ab" * 32
    assert "ca.crt" not in secret["data"]  # None: absent, not an empty key
    assert secret["metadata"]["labels"][names.POOL] == "mac"
    assert secret["metadata"]["ownerReferences"] == [owner]
    trainer = token_secrets.join_secret("demo", "ml", owner, "trainer", "t")
    assert "coordinator" not in trainer["data"] and names.POOL not in trainer["metadata"]["labels"]
    status = token_secrets.join_secret("demo", "ml", owner, names.STATUS_ROLE, "s")
    assert (
        status["metadata"]["name"] == "demo-status-token" and names.POOL not in status["metadata"]["labels"]
    )


def test_process_manifest_is_a_loadable_self_contained_job(make_job: Any, tmp_path: pathlib.Path) -> None:
    cm = by_key(children.desired(make_job(), SETTINGS))[("ConfigMap", "demo-config")]
    path = tmp_path / "job.yaml"
    path.write_text(cm["data"]["job.yaml"])
    resolved = spec.load_job(path)
    assert resolved.name == "demo"
    assert resolved.sync_policy.max_staleness == 2
    pools = dict(resolved.inference_pools)
    assert set(pools) == {"gpu", "cpu", "mac", "shared"}
    assert pools["gpu"].backend == "vllm" and pools["mac"].external and pools["shared"].device == "cpu"
    assert resolved.training_swarm.nodes == 2
    text = cm["data"]["job.yaml"]
    for operator_only in ("swarmRef", "nodeSelector", "tolerations", "replicas", "image", "suspend"):
        assert operator_only not in text


def _changed(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


def _hashes(job: inputs.JobInput) -> dict[str, str]:
    out = {}
    for obj in workloads(children.desired(job, SETTINGS)):
        out[obj["metadata"]["name"]] = obj["spec"]["template"]["metadata"]["annotations"][names.SPEC_HASH]
    return out


def _templates(job: inputs.JobInput) -> dict[str, str]:
    return {
        o["metadata"]["name"]: yaml.safe_dump(o["spec"]["template"])
        for o in workloads(children.desired(job, SETTINGS))
    }


def test_scaling_rolls_nothing_and_a_pool_change_rolls_only_that_pool(
    make_job: Any, hetero_text: str
) -> None:
    base = make_job(hetero_text)
    scaled = make_job(_changed(hetero_text, "replicas: 3", "replicas: 7"))
    assert _templates(scaled) == _templates(base)
    assert (
        by_key(children.desired(scaled, SETTINGS))[("ConfigMap", "demo-config")]
        == by_key(children.desired(base, SETTINGS))[("ConfigMap", "demo-config")]
    )
    moved = make_job(_changed(hetero_text, "threads: 4", "threads: 2"))
    changed = {k for k in _templates(base) if _templates(base)[k] != _templates(moved)[k]}
    assert "demo-cpu" in changed and "demo-gpu" not in changed and "demo-shared" not in changed


def test_a_model_change_rolls_coordinator_trainer_but_not_workers(make_job: Any, hetero_text: str) -> None:
    base = _hashes(make_job(hetero_text))
    other = _hashes(make_job(_changed(hetero_text, "maxStaleness: 2", "maxStaleness: 3")))
    assert other["demo-coordinator"] != base["demo-coordinator"]
    assert other["demo-trainer"] != base["demo-trainer"]
    assert other["demo-gpu"] == base["demo-gpu"]


def test_suspend_scales_everything_to_zero(make_job: Any, hetero_text: str) -> None:
    job = make_job(hetero_text.replace("spec:\n  storage", "spec:\n  suspend: true\n  storage", 1))
    assert job.suspended
    for obj in workloads(children.desired(job, SETTINGS)):
        assert obj["spec"]["replicas"] == 0, obj["metadata"]["name"]


def test_external_service_only_when_wanted(make_job: Any) -> None:
    job = make_job()
    assert coordinator.coordinator_external_service(job, Settings(external_service_type="None")) is None
    node_port = coordinator.coordinator_external_service(job, Settings(external_service_type="NodePort"))
    assert node_port is not None and node_port["spec"]["type"] == "NodePort"
    text = "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: solo, namespace: ml}\n"
    assert coordinator.coordinator_external_service(make_job(text), SETTINGS) is None


def test_with_tls_the_coordinator_serves_both_ports_and_the_external_service_only_https(
    make_job: Any,
) -> None:
    plain = make_job()
    tls = inputs.TLSWiring("demo-coordinator-tls", "sha256:" + "ab" * 32, "CA")
    job = dataclasses.replace(plain, tls=tls)
    objs = by_key(children.desired(job, SETTINGS))
    pod = objs[("Deployment", "demo-coordinator")]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    argv = container["command"]
    assert argv[argv.index("--tls-port") + 1] == "8443" and argv[argv.index("--port") + 1] == "8700"
    cert, key = argv[argv.index("--tls-cert") + 1], argv[argv.index("--tls-key") + 1]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "tls")
    assert (
        mount["readOnly"]
        and cert == f"{mount['mountPath']}/tls.crt"
        and key == f"{mount['mountPath']}/tls.key"
    )
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "tls")
    # The pod gets the certificate and its key, never the CA's key.
    assert volume["secret"] == {
        "secretName": "demo-coordinator-tls",
        "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
    }
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8700, "https": 8443}
    external = objs[("Service", "demo-coordinator-external")]["spec"]["ports"]
    assert external == [{"name": "https", "port": 8443, "targetPort": "https", "protocol": "TCP"}]
    inside = objs[("Service", "demo-coordinator")]["spec"]["ports"]
    assert [p["name"] for p in inside] == ["http"]  # pods in the cluster keep the plain port
    # A new certificate restarts the coordinator (it reads its certificate at start-up) ...
    renewed = dataclasses.replace(job, tls=dataclasses.replace(tls, fingerprint="sha256:" + "cd" * 32))
    hash_of = lambda j: by_key(children.desired(j, SETTINGS))[("Deployment", "demo-coordinator")]["spec"][  # noqa: E731
        "template"
    ]["metadata"]["annotations"][names.SPEC_HASH]
    assert hash_of(renewed) != hash_of(job) != hash_of(plain)
    # ... and nothing else: the pools and the trainer do not talk TLS.
    for kind, name in (("Deployment", "demo-cpu"), ("Job", "demo-trainer")):
        before = by_key(children.desired(plain, SETTINGS))[(kind, name)]
        assert by_key(children.desired(renewed, SETTINGS))[(kind, name)] == before


# ---------------------------------------------------------------------------------------------
# Settings


def test_settings_from_env_override_images_and_intervals() -> None:
    s = Settings.from_env(
        {
            "ECHORL_IMAGE_WORKER_CPU": "r/cpu:1",
            "ECHORL_IMAGE_TRAINER": "r/trainer:1",
            "ECHORL_STATUS_INTERVAL": "0.5",
            "ECHORL_COORDINATOR_URL": "http://127.0.0.1:9/{job}",
            "ECHORL_EXTERNAL_SERVICE_TYPE": "NodePort",
        }
    )
    assert s.images.worker("transformers", "cpu") == "r/cpu:1"
    assert s.images.worker("vllm", "cuda") == Images().worker_vllm
    assert s.images.trainer == "r/trainer:1"
    assert s.status_interval_s == 0.5
    assert s.status_url("demo", "ml") == "http://127.0.0.1:9/demo"
    assert Settings().status_url("demo", "ml") == "http://demo-coordinator.ml.svc:8700"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("ECHORL_STATUS_INTERVAL", "soon", "must be a number of seconds"),
        ("ECHORL_RESYNC_INTERVAL", "0", "must be > 0"),
        ("ECHORL_EXTERNAL_SERVICE_TYPE", "Ingress", "LoadBalancer, NodePort or None"),
    ],
)
def test_settings_errors_name_the_variable(key: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        Settings.from_env({key: value})
    assert key in str(info.value)
