"""``podTemplate`` merged over the pods the operator builds: what is added, what stays the operator's."""

from __future__ import annotations

import json
from typing import Any

from echo_operator import children, names
from echo_operator.children import pods
from echo_operator.config import Settings

SETTINGS = Settings()

TEMPLATED = """
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: demo, namespace: ml}
spec:
  storage: {type: S3, endpoint: "minio:9000", bucket: echorl, credentialsSecret: creds, secure: false}
  trainingSwarm:
    nodeSelector: {pool: train}
    podTemplate:
      metadata: {labels: {team: rl}}
      spec:
        priorityClassName: training
        containers: [{name: trainer, env: [{name: NCCL_DEBUG, value: INFO}]}]
  inferenceSwarms:
  - name: cpu
    threads: 2
    affinity: {nodeAffinity: {required: [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}}
    podTemplate:
      metadata: {labels: {team: rl}, annotations: {sidecar.istio.io/inject: "false"}}
      spec:
        serviceAccountName: echorl-workers
        automountServiceAccountToken: true
        imagePullSecrets: [{name: registry}]
        runtimeClassName: gvisor
        affinity:
          podAntiAffinity:
            requiredDuringSchedulingIgnoredDuringExecution:
            - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {echorl.dev/pool: cpu}}}
        topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
        volumes:
        - {name: models, persistentVolumeClaim: {claimName: model-cache}}
        - {name: extra, configMap: {name: extra-files}}
        containers:
        - name: worker
          env: [{name: TEAM, value: rl}]
          envFrom: [{configMapRef: {name: worker-env}}]
          volumeMounts: [{name: models, mountPath: /cache}, {name: extra, mountPath: /etc/extra, readOnly: true}]
  - name: plain
"""


def objects(make_job: Any, text: str = TEMPLATED) -> dict[tuple[str, str], dict[str, Any]]:
    return {children.key(o): o for o in children.desired(make_job(text), SETTINGS)}


def pod_of(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    template = obj["spec"]["template"]
    (container,) = template["spec"]["containers"]
    return template["metadata"], template["spec"], container


def test_a_pool_template_adds_its_fields_and_keeps_the_operators(make_job: Any) -> None:
    meta, pod, container = pod_of(objects(make_job)[("Deployment", "demo-cpu")])
    assert meta["labels"]["team"] == "rl"
    assert meta["labels"][names.JOB] == "demo" and meta["labels"]["echorl.dev/pool"] == "cpu"
    assert (
        meta["annotations"]["sidecar.istio.io/inject"] == "false" and names.SPEC_HASH in meta["annotations"]
    )
    assert pod["serviceAccountName"] == "echorl-workers" and pod["automountServiceAccountToken"] is True
    assert pod["imagePullSecrets"] == [{"name": "registry"}] and pod["runtimeClassName"] == "gvisor"
    assert pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"
    # The swarm's short node affinity and the template's pod anti-affinity, side by side.
    assert set(pod["affinity"]) == {"nodeAffinity", "podAntiAffinity"}
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    # The container keeps its command and its env first; the template's come after.
    assert container["command"][:2] == ["echorl", "worker"]
    env = [e["name"] for e in container["env"]]
    assert env[-1] == "TEAM" and "ECHORL_TOKEN" in env and env.index("ECHORL_TOKEN") < env.index("TEAM")
    assert container["envFrom"] == [{"configMapRef": {"name": "worker-env"}}]
    assert pod["securityContext"]["runAsNonRoot"] is True  # what the template does not name stays


def test_a_mount_at_cache_replaces_the_scratch_volume_and_the_config_stays(make_job: Any) -> None:
    _, pod, container = pod_of(objects(make_job)[("Deployment", "demo-cpu")])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "cache" not in volumes and volumes["models"] == {
        "name": "models",
        "persistentVolumeClaim": {"claimName": "model-cache"},
    }
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/cache"] == "models" and mounts["/etc/extra"] == "extra"
    assert mounts["/tmp"] == "tmp" and mounts[pods.CONFIG_DIR] == "job"
    assert {m["name"] for m in container["volumeMounts"]} <= set(volumes)  # no mount of a dropped volume


def test_a_pool_without_a_template_is_what_it_was(make_job: Any) -> None:
    plain = objects(make_job)[("Deployment", "demo-plain")]
    untemplated = objects(make_job, TEMPLATED.split("  - name: cpu")[0] + "  - name: plain\n")[
        ("Deployment", "demo-plain")
    ]
    assert plain == untemplated
    meta, pod, _ = pod_of(plain)
    assert "team" not in meta["labels"] and "serviceAccountName" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert {v["name"] for v in pod["volumes"]} == {"job", "tmp", "cache"}


def test_the_trainer_template_is_applied_and_changes_its_jobs_hash(make_job: Any) -> None:
    trainer = objects(make_job)[("Job", "demo-trainer")]
    meta, pod, container = pod_of(trainer)
    assert meta["labels"]["team"] == "rl" and meta["labels"]["echorl.dev/component"] == "trainer"
    assert pod["priorityClassName"] == "training" and pod["nodeSelector"] == {"pool": "train"}
    assert container["env"][-1] == {"name": "NCCL_DEBUG", "value": "INFO"}
    relabelled = objects(
        make_job,
        TEMPLATED.replace(
            "labels: {team: rl}}\n      spec:\n        priorityClassName",
            "labels: {team: ml}}\n      spec:\n        priorityClassName",
        ),
    )
    other = relabelled[("Job", "demo-trainer")]
    assert other["spec"]["template"]["metadata"]["labels"]["team"] == "ml"
    # A Job's pod template is immutable: a changed template is a new Job (its hash).
    assert (
        other["metadata"]["annotations"][names.SPEC_HASH]
        != trainer["metadata"]["annotations"][names.SPEC_HASH]
    )


def hash_of(objs: dict[tuple[str, str], dict[str, Any]], deployment: str) -> str:
    return str(
        objs[("Deployment", deployment)]["spec"]["template"]["metadata"]["annotations"][names.SPEC_HASH]
    )


def test_a_template_change_rolls_its_pool_and_never_reaches_the_processes(make_job: Any) -> None:
    before = objects(make_job)
    after = objects(make_job, TEMPLATED.replace("TEAM, value: rl", "TEAM, value: ml"))
    assert hash_of(before, "demo-cpu") != hash_of(after, "demo-cpu")
    assert hash_of(before, "demo-plain") == hash_of(after, "demo-plain")
    # The job manifest the processes read is the same: no coordinator or trainer restart for it.
    assert before[("ConfigMap", "demo-config")] == after[("ConfigMap", "demo-config")]
    assert "podTemplate" not in json.dumps(before[("ConfigMap", "demo-config")])
