"""Echo's install on the test cluster: ``manifests/`` with the images ``scripts/images.sh`` built.

:func:`overlay` writes a kustomization over ``manifests/`` and ``manifests/dev/`` (its dev MinIO) that
swaps image names (the local, content-hashed tags) and the pull policy (``Never``: there is no
registry), nothing else. The e2e tier applies it (``tests/e2e/conftest.py``), and so does
``scripts/cluster.sh install`` for a developer's cluster. :func:`chart_values` are the same swaps as
values of the Helm chart (``charts/echorl-operator``), for the e2e test that installs it.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from services.procs import REPO_ROOT

MANIFESTS = REPO_ROOT / "manifests"


CHART = REPO_ROOT / "charts" / "echorl-operator"


def _job_images(images: dict[str, str]) -> dict[str, str]:
    """The operator's settings naming the images of a job's processes, and the pull policy."""
    return {
        "ECHORL_IMAGE_COORDINATOR": images["worker-cpu"],
        "ECHORL_IMAGE_WORKER_CPU": images["worker-cpu"],
        "ECHORL_IMAGE_TRAINER": images["trainer"],
        "ECHORL_IMAGE_PULL_POLICY": "Never",
    }


def chart_values(images: dict[str, str]) -> dict[str, object]:
    """Values of the Helm chart that swap the same images and pull policy as :func:`overlay`."""
    name, _, tag = images["operator"].rpartition(":")
    env = _job_images(images)
    return {
        "image": {"repository": name, "tag": tag, "pullPolicy": "Never"},
        "jobImages": {
            "coordinator": env["ECHORL_IMAGE_COORDINATOR"],
            "workerCpu": env["ECHORL_IMAGE_WORKER_CPU"],
            "trainer": env["ECHORL_IMAGE_TRAINER"],
        },
        "extraEnv": [{"name": "ECHORL_IMAGE_PULL_POLICY", "value": "Never"}],
    }


def overlay(images: dict[str, str], out: Path) -> Path:
    """A kustomization over ``manifests/`` that swaps image names and the pull policy, nothing else."""

    def split(ref: str) -> tuple[str, str]:
        name, _, tag = ref.rpartition(":")
        return name, tag

    swaps = {
        "ghcr.io/echorl/echorl-operator": images["operator"],
        "quay.io/minio/minio": images["test-minio"],
    }
    env = _job_images(images)
    (operator,) = [
        d
        for d in yaml.safe_load_all((MANIFESTS / "common" / "operator.yaml").read_text())
        if d and d["kind"] == "Deployment"
    ]
    names = [e["name"] for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]]
    ops = [
        {"op": "replace", "path": f"/spec/template/spec/containers/0/env/{names.index(k)}/value", "value": v}
        for k, v in env.items()
        if k in names
    ]
    ops += [
        {"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": k, "value": v}}
        for k, v in env.items()
        if k not in names
    ]
    pull = [{"op": "replace", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "Never"}]
    out.mkdir(parents=True, exist_ok=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [
            os.path.relpath(MANIFESTS, out),
            os.path.relpath(MANIFESTS / "dev", out),
        ],  # + dev MinIO
        "images": [
            {"name": old, "newName": split(new)[0], "newTag": split(new)[1]} for old, new in swaps.items()
        ],
        "patches": [
            {
                "target": {"kind": "Deployment", "name": "echorl-operator"},
                "patch": yaml.safe_dump(ops + pull),
            },
            {
                "target": {"kind": "Deployment", "name": "minio"},
                "patch": yaml.safe_dump([{**pull[0], "op": "add"}]),
            },
        ],
    }
    (out / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return out
