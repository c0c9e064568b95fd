"""``podTemplate`` in the spec: what it accepts, and each mistake named at its field."""

from __future__ import annotations

import textwrap

import pytest

from echo_runtime import spec

JOB = """
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {name: demo}
spec:
"""

FULL = """
  trainingSwarm:
    podTemplate:
      metadata: {labels: {team: rl}}
      spec:
        priorityClassName: training
        containers: [{name: trainer, env: [{name: NCCL_DEBUG, value: INFO}]}]
  inferenceSwarms:
  - name: cpu
    podTemplate:
      metadata: {labels: {team: rl}, annotations: {sidecar.istio.io/inject: "false"}}
      spec:
        serviceAccountName: echorl-workers
        imagePullSecrets: [{name: registry}]
        runtimeClassName: runc
        affinity:
          podAntiAffinity:
            preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 50
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector: {matchLabels: {echorl.dev/pool: cpu}}
        topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
        volumes:
        - {name: models, persistentVolumeClaim: {claimName: model-cache}}
        - {name: extra, configMap: {name: extra-files, items: [{key: a, path: a.txt}]}}
        containers:
        - name: worker
          env:
          - {name: TEAM, valueFrom: {fieldRef: {fieldPath: "metadata.labels['team']"}}}
          envFrom: [{configMapRef: {name: worker-env}}, {secretRef: {name: worker-secrets}, prefix: S_}]
          volumeMounts: [{name: models, mountPath: /cache}, {name: extra, mountPath: /etc/extra, readOnly: true}]
"""


def problems_of(text: str) -> dict[str, str]:
    with pytest.raises(spec.ManifestError) as info:
        spec.load_documents(textwrap.dedent(text))
    return {p.path: p.message for p in info.value.findings}


def test_a_full_template_loads_with_kubernetes_field_names() -> None:
    (job,) = spec.load_documents(JOB + FULL)
    assert isinstance(job, spec.EchoJob)
    pool = job.spec.inference_swarms[0].pod_template
    assert pool is not None
    assert pool.spec.service_account_name == "echorl-workers"
    assert pool.spec.volumes[0].persistent_volume_claim is not None
    assert pool.spec.volumes[0].persistent_volume_claim.claim_name == "model-cache"
    mounts = pool.spec.containers[0].volume_mounts
    assert [(m.name, m.mount_path) for m in mounts] == [("models", "/cache"), ("extra", "/etc/extra")]
    dumped = pool.to_manifest()
    assert (
        dumped["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
            "podAffinityTerm"
        ]["topologyKey"]
        == "kubernetes.io/hostname"
    )
    trainer = job.spec.training_swarm.pod_template
    assert trainer is not None and trainer.spec.priority_class_name == "training"


POOL = "  inferenceSwarms:\n  - name: cpu\n    podTemplate: "
TRAINER = "  trainingSwarm:\n    podTemplate: "


@pytest.mark.parametrize(
    ("snippet", "path", "needle"),
    [
        (POOL + "{metadata: {labels: {echorl.dev/job: x}}}", "podTemplate.metadata.labels", "operator sets"),
        (
            POOL + "{metadata: {labels: {app.kubernetes.io/name: x}}}",
            "podTemplate.metadata.labels",
            "app.kubernetes.io/name",
        ),
        (
            POOL + "{metadata: {annotations: {echorl.dev/spec-hash: x}}}",
            "podTemplate.metadata.annotations",
            "operator",
        ),
        (
            POOL + "{spec: {containers: [{name: worker, env: [{name: ECHORL_TOKEN, value: x}]}]}}",
            "podTemplate.spec.containers[0].env[0].name",
            "operator sets",
        ),
        (
            POOL + "{spec: {containers: [{name: worker, env: [{name: OMP_NUM_THREADS, value: '4'}]}]}}",
            "podTemplate.spec.containers[0].env[0].name",
            "OMP_NUM_THREADS",
        ),
        (
            POOL
            + "{spec: {containers: [{name: worker, env: [{name: A, value: x, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]}]}}",
            "podTemplate.spec.containers[0].env[0].valueFrom",
            "not both",
        ),
        (
            POOL + "{spec: {containers: [{name: worker, env: [{name: A, valueFrom: {}}]}]}}",
            "podTemplate.spec.containers[0].env[0].valueFrom",
            "exactly one of fieldRef",
        ),
        (
            POOL + "{spec: {containers: [{name: worker, envFrom: [{prefix: X_}]}]}}",
            "podTemplate.spec.containers[0].envFrom[0]",
            "exactly one of configMapRef, secretRef",
        ),
        (
            POOL + "{spec: {volumes: [{name: v, emptyDir: {}, configMap: {name: c}}]}}",
            "podTemplate.spec.volumes[0]",
            "exactly one source",
        ),
        (POOL + "{spec: {volumes: [{name: v}]}}", "podTemplate.spec.volumes[0]", "exactly one source"),
        (
            POOL + "{spec: {volumes: [{name: cache, emptyDir: {}}]}}",
            "podTemplate.spec.volumes[0].name",
            "operator's own",
        ),
        (
            POOL + "{spec: {volumes: [{name: v, gitRepo: {repository: x}}]}}",
            "podTemplate.spec.volumes[0].gitRepo",
            "unknown field; allowed",
        ),
        (
            POOL
            + "{spec: {volumes: [{name: v, emptyDir: {}}], containers: [{name: worker, volumeMounts: [{name: w, mountPath: /w}]}]}}",
            "podTemplate.spec.containers",
            "must name one of podTemplate.spec.volumes (v)",
        ),
        (
            POOL
            + "{spec: {volumes: [{name: v, emptyDir: {}}], containers: [{name: worker, volumeMounts: [{name: v, mountPath: /etc/echorl/job}]}]}}",
            "podTemplate.spec.containers[0].volumeMounts[0].mountPath",
            "job manifest",
        ),
        (POOL + "{spec: {containers: [{name: trainer}]}}", "podTemplate", "must be 'worker'"),
        (TRAINER + "{spec: {containers: [{name: worker}]}}", "podTemplate", "must be 'trainer'"),
        (
            POOL + "{spec: {containers: [{name: worker, command: [sh]}]}}",
            "podTemplate.spec.containers[0].command",
            "unknown field; allowed",
        ),
        (POOL + "{spec: {hostNetwork: true}}", "podTemplate.spec.hostNetwork", "unknown field; allowed"),
        (
            "  inferenceSwarms:\n  - name: cpu\n    affinity: {nodeAffinity: {required: [{matchExpressions: [{key: a, operator: Exists}]}]}}\n"
            "    podTemplate: {spec: {affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, preference: {}}]}}}}",
            "affinity",
            "keep one",
        ),
        (
            POOL
            + "{spec: {topologySpreadConstraints: [{maxSkew: 0, topologyKey: z, whenUnsatisfiable: DoNotSchedule}]}}",
            "podTemplate.spec.topologySpreadConstraints[0].maxSkew",
            "≥ 1",
        ),
        (
            "  inferenceSwarms:\n  - {name: cpu, gpusPerReplica: 2}",
            "spec.inferenceSwarms[0].gpusPerReplica",
            "vllm backend only",
        ),
    ],
)
def test_mistakes_are_named_at_their_field(snippet: str, path: str, needle: str) -> None:
    found = problems_of(JOB + snippet + "\n")
    match = {p: m for p, m in found.items() if p.endswith(path)}
    assert match, found
    assert any(needle in m for m in match.values()), found
