"""The CRDs: generated from the spec models, committed as generated, structural, and in step with the models."""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from echo_operator import crds
from echo_runtime import spec

REPO = pathlib.Path(__file__).resolve().parents[3]
CRDS = REPO / "crds"


def schema(kind: str) -> dict[str, Any]:
    found = next(k for k in crds.KINDS if k.kind == kind)
    version = crds.crd(found)["spec"]["versions"][0]
    return dict(version["schema"]["openAPIV3Schema"])


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")


def test_committed_crds_equal_the_generated_ones() -> None:
    generated = crds.generated_files()
    committed = {p.name: p.read_text(encoding="utf-8") for p in CRDS.iterdir() if p.is_file()}
    assert sorted(committed) == sorted(generated), "run `python -m echo_operator.crds --out crds/`"
    for name, text in generated.items():
        assert committed[name] == text, (
            f"crds/{name} is stale: run `python -m echo_operator.crds --out crds/`"
        )


def test_the_helm_chart_carries_the_same_crds() -> None:
    chart = CRDS.parent / "charts" / "echorl-operator" / "crds"
    committed = {p.name: p.read_text(encoding="utf-8") for p in chart.iterdir() if p.is_file()}
    assert committed == crds.chart_files(), (
        "charts/echorl-operator/crds is stale: run `python -m echo_operator.crds --out crds/ --chart charts/echorl-operator`"
    )
    assert "Kustomization" not in committed


def test_check_mode_reports_stale_files(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crds.main(["--check", "--out", str(tmp_path)]) == 1
    assert "out of date" in capsys.readouterr().out
    assert crds.main(["--out", str(tmp_path)]) == 0
    assert crds.main(["--check", "--out", str(tmp_path)]) == 0


@pytest.mark.parametrize("kind", [k.kind for k in crds.KINDS])
def test_schemas_are_structural_and_described(kind: str) -> None:
    root = schema(kind)
    undocumented = []
    for path, node in walk(root):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path}: no type"
        for banned in ("anyOf", "oneOf", "allOf", "$ref", "title", "const", "nullable"):
            assert banned not in node, f"{path}: {banned}"
        assert node.get("additionalProperties") is not False, path
        if "properties" in node and "additionalProperties" in node:
            pytest.fail(f"{path}: properties and additionalProperties together")
        top = path.split(".")[1] if path.count(".") else ""
        if top in ("spec", "status") and not node.get("description") and not path.endswith(("[]", ".*")):
            undocumented.append(path)
    assert not undocumented, f"fields without a description: {undocumented}"


def test_task_options_are_the_only_free_form_field() -> None:
    free = [p for p, n in walk(schema("EchoJob")) if n.get("x-kubernetes-preserve-unknown-fields")]
    assert free == [".spec.task.options"]


def test_subresources_names_and_columns() -> None:
    by_kind = {k.kind: crds.crd(k) for k in crds.KINDS}
    for kind, crd in by_kind.items():
        version = crd["spec"]["versions"][0]
        assert version["subresources"]["status"] == {}, kind
        assert crd["spec"]["names"]["categories"] == ["echorl"]
        assert crd["spec"]["names"]["shortNames"]
        assert crd["spec"]["group"] == "echorl.dev" and version["name"] == "v1alpha1"
    scale = by_kind["InferenceSwarm"]["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "scale" not in by_kind["EchoJob"]["spec"]["versions"][0]["subresources"]
    columns = [c["name"] for c in by_kind["EchoJob"]["spec"]["versions"][0]["additionalPrinterColumns"]]
    for wanted in ("Mode", "Δmax", "Version", "Staleness", "Reward", "Ready", "Age"):
        assert wanted in columns
    status = schema("EchoJob")["properties"]["status"]["properties"]
    for column in by_kind["EchoJob"]["spec"]["versions"][0]["additionalPrinterColumns"]:
        field = column["jsonPath"].split(".")[2].split("[")[0]
        root = "metadata" if column["jsonPath"].startswith(".metadata") else "status"
        assert root == "metadata" or field in status, column


def test_inferenceswarm_replicas_are_optional_for_gitops_and_autoscalers() -> None:
    s = schema("InferenceSwarm")["properties"]["spec"]
    assert "default" not in s["properties"]["replicas"]
    assert "replicas" not in s.get("required", [])
    assert "selector" in schema("InferenceSwarm")["properties"]["status"]["properties"]


def test_inline_pools_carry_no_defaults_so_swarm_ref_can_stand_alone() -> None:
    pool = schema("EchoJob")["properties"]["spec"]["properties"]["inferenceSwarms"]
    assert pool["x-kubernetes-list-type"] == "map" and pool["x-kubernetes-list-map-keys"] == ["name"]
    assert not [n for n, p in pool["items"]["properties"].items() if "default" in p]
    rules = [r["rule"] for r in pool["items"]["x-kubernetes-validations"]]
    assert any("has(self.swarmRef)" in r and "has(self.backend)" in r for r in rules)


def rules_of(kind: str) -> dict[str, str]:
    return {
        r["message"]: r["rule"] for _, n in walk(schema(kind)) for r in n.get("x-kubernetes-validations", [])
    }


def test_cel_rules_restate_the_model_validators() -> None:
    messages = " | ".join(rules_of("EchoJob"))
    for expected in (
        "refreshThreshold must be ≤ maxStaleness",
        "minLearningRate must be ≤ learningRate",
        "bufferSize is only allowed in Async mode",
        "syncPolicyRef cannot be combined",
        "trainingSwarmRef cannot be combined",
        "swarmRef cannot be combined",
        "the vllm backend needs CUDA",
        "the mlx backend runs on Apple Silicon",
        "external pools create no pods",
        "endpoint is required when type is S3",
        "bucket is required when type is S3",
        "processesPerNode must be ≤ gpusPerNode",
        "model is immutable",
        "storage type, bucket, prefix and path are immutable",
        "must be S3 in a cluster",
        "must start with a letter and have at most 40 characters in a cluster",
        "model to train",
        "mode Colocated is local-only",
        "pool names 'trainer' and 'coordinator', and names starting with 'scorer-', are reserved",
    ):
        assert expected in messages
    assert "self == oldSelf" in rules_of("EchoJob").values()
    assert any("maxStaleness" in m for m in rules_of("SyncPolicy"))


def test_cluster_rules_say_what_the_python_rules_say() -> None:
    # `echorl validate` (without --local) and the API server word each cluster-only rule the same way.
    from echo_runtime.spec import objects, policy

    messages = set(rules_of("EchoJob"))
    for text in (
        objects.JOB_NAME_IN_CLUSTER,
        objects.S3_IN_CLUSTER,
        objects.STORAGE_IN_CLUSTER,
        objects.MODEL_PATH_IN_CLUSTER,
        objects.RESERVED_POOL_NAMES,
        policy.COLOCATED_IN_CLUSTER,
    ):
        assert text in messages
    assert policy.COLOCATED_IN_CLUSTER in rules_of("SyncPolicy")
    paths = {r["message"]: r.get("fieldPath") for r in schema("EchoJob")["x-kubernetes-validations"]}
    assert paths[objects.JOB_NAME_IN_CLUSTER] == ".metadata.name"
    assert paths[objects.MODEL_PATH_IN_CLUSTER] == ".spec.model.path"


def test_cross_field_rules_wait_for_the_field_they_compare_with() -> None:
    # A negative maxStaleness (or learningRate) is its own field's error, not also refreshThreshold's.
    rules = rules_of("SyncPolicy")
    refresh = next(r for m, r in rules.items() if m.startswith("refreshThreshold must be ≤ maxStaleness"))
    assert refresh.startswith("self.maxStaleness < 0 ||")
    lr = next(r for m, r in rules_of("EchoJob").items() if m.startswith("minLearningRate must be ≤"))
    assert lr.startswith("self.learningRate <= 0.0 ||")


def test_the_model_path_has_no_default_in_a_cluster() -> None:
    model = schema("EchoJob")["properties"]["spec"]["properties"]["model"]
    assert "default" not in model["properties"]["path"]
    assert "path" not in model["default"] and model["default"]["dtype"] == "float32"
    assert "Required in a cluster" in model["properties"]["path"]["description"]


def test_descriptions_show_defaults_and_bounds_for_kubectl_explain() -> None:
    sync = schema("SyncPolicy")["properties"]["spec"]["properties"]
    assert sync["maxStaleness"]["description"].endswith("Must be ≥ 0 and ≤ 1024. Default: `1`.")
    assert sync["mode"]["description"].endswith("Default: `Async`.")
    algo = schema("EchoJob")["properties"]["spec"]["properties"]["algorithm"]["properties"]
    assert "Must be > 0 and ≤ 1." in algo["learningRate"]["description"]
    assert algo["gradientCheckpointing"]["description"].endswith("Default: `false`.")
    pools = schema("EchoJob")["properties"]["spec"]["properties"]["inferenceSwarms"]
    assert "1 to 64 items" in pools["description"]
    for _, node in walk(schema("EchoJob")):
        default = node.get("default")
        if isinstance(default, (int, float, str)) and default != "" and "description" in node:
            assert "Default:" in node["description"], node["description"]


def _apply_defaults(node: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: defaults of absent fields, recursively."""
    if not isinstance(value, dict) or "properties" not in node:
        if isinstance(value, list) and isinstance(node.get("items"), dict):
            return [_apply_defaults(node["items"], v) for v in value]
        return value
    out = dict(value)
    for name, sub in node["properties"].items():
        if name not in out and "default" in sub:
            out[name] = copy.deepcopy(sub["default"])
        if name in out:
            out[name] = _apply_defaults(sub, out[name])
    return out


@pytest.mark.parametrize(
    ("kind", "model"),
    [
        ("EchoJob", spec.EchoJobSpec),
        ("InferenceSwarm", spec.InferenceSwarmSpec),
        ("TrainingSwarm", spec.TrainingSwarmSpec),
        ("SyncPolicy", spec.SyncPolicySpec),
    ],
)
def test_schema_defaults_agree_with_the_model_defaults(kind: str, model: type[spec.SpecModel]) -> None:
    node = schema(kind)["properties"]["spec"]
    defaulted = _apply_defaults(node, {})
    parsed = model.model_validate(defaulted)
    assert parsed == model(), "a CRD default differs from the model's default"
    assert model.model_validate(defaulted).to_manifest() == model().to_manifest()


def test_crd_files_are_valid_yaml_with_a_header() -> None:
    for name, text in crds.generated_files().items():
        assert text.startswith("# Generated by `python -m echo_operator.crds")
        doc = yaml.safe_load(text)
        if name == "Kustomization":
            assert doc["resources"] == [k.file_name for k in crds.KINDS]
        else:
            assert doc["kind"] == "CustomResourceDefinition"
