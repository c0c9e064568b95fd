"""What the images run, tested without a container engine: every command line the operator writes into a
pod parses against the real command, and every image's entry point exists.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from echo_operator import __main__ as entry
from echo_operator import children
from echo_operator.children import pods
from echo_operator.config import Settings
from echo_runtime.cli import main as echorl_main
from echo_runtime.cli.operator_cmd import operator as operator_group
from echo_runtime.cli.operator_cmd import verification, worker_command

REPO = pathlib.Path(__file__).resolve().parents[3]
IMAGES = REPO / "images"


def commands(make_job: Any) -> list[tuple[str, list[str], dict[str, str]]]:
    """(workload, argv, env names) of every container the operator would create."""
    out = []
    for obj in children.desired(make_job(), Settings()):
        if obj["kind"] in ("Deployment", "Job"):
            (c,) = obj["spec"]["template"]["spec"]["containers"]
            out.append((obj["metadata"]["name"], list(c["command"]), {e["name"]: "x" for e in c["env"]}))
    return out


def split_torchrun(argv: list[str]) -> tuple[list[str], list[str]]:
    if argv[0] != "torchrun":
        return [], argv
    at = argv.index("echorl")
    return argv[1:at], argv[at:]


def test_every_pod_command_parses_against_the_real_cli(
    make_job: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {pods.JOB_FILE: tmp_path / "job.yaml", pods.TOKENS_FILE: tmp_path / "tokens.yaml"}
    for path in files.values():
        path.write_text("{}\n")
    seen = set()
    for name, argv, env in commands(make_job):
        _, echorl = split_torchrun(argv)
        assert echorl[0] == "echorl", name
        command = echorl_main.commands[echorl[1]]
        assert command.params, f"`echorl {echorl[1]}` is a placeholder"
        args = [str(files.get(a, a)) for a in echorl[2:]]
        for var in env:  # the Secrets the pod gets as environment variables
            monkeypatch.setenv(var, "token-from-a-secret")
        ctx = command.make_context(f"echorl {echorl[1]}", args)
        assert ctx.params, name
        for var in env:
            monkeypatch.delenv(var)
        seen.add(echorl[1])
    assert seen == {"coordinator", "worker", "trainer"}


def test_torchrun_accepts_the_trainer_launch_options(make_job: Any) -> None:
    run = pytest.importorskip("torch.distributed.run")
    (trainer,) = [argv for name, argv, _ in commands(make_job) if name.endswith("-trainer")]
    launch, echorl = split_torchrun(trainer)
    expanded = [re.sub(r"\$\((\w+)\)", "1", a) for a in launch]  # Kubernetes expands $(VAR) from env
    parsed = run.get_args_parser().parse_args([*expanded, *echorl])
    assert parsed.no_python and parsed.training_script == "echorl"


def test_the_join_command_parses_against_the_worker_cli(tmp_path: pathlib.Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("{}\n")
    argv = worker_command("http://1.2.3.4:8700", str(job), "macs", "mlx", "mps")
    ctx = echorl_main.commands["worker"].make_context("echorl worker", [*argv[2:], "--token", "t"])
    assert ctx.params["external"] is True and ctx.params["pool"] == "macs"


def test_the_join_command_passes_the_pin_or_the_ca_to_the_worker(tmp_path: pathlib.Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("{}\n")
    ca = tmp_path / "ca.crt"
    ca.write_text("pem")
    pin = "sha256:" + "ab" * 32
    argv = worker_command(
        "https://1.2.3.4:8443", str(job), "macs", "mlx", "mps", fingerprint=pin, ca_file=str(ca)
    )
    ctx = echorl_main.commands["worker"].make_context("echorl worker", [*argv[2:], "--token", "t"])
    assert ctx.params["tls_fingerprint"] == pin and ctx.params["ca_file"] == str(ca)


def test_join_pins_by_default_and_says_what_is_missing_for_the_other_ways() -> None:
    pin = "sha256:" + "ab" * 32
    secret = {"token": "t", "fingerprint": pin, "ca.crt": "PEM"}
    url = "https://203.0.113.7:8443"
    assert verification(url, secret, None, None) == ("pin", pin, None)
    assert verification(url, secret, "ca", None) == ("ca", None, "PEM")
    assert verification(url, secret, "system", None) == ("system", None, None)
    assert verification(url, secret, None, "/my/ca.pem") == ("ca", None, None)  # the user's CA file
    assert verification("https://echo.example.com", {"token": "t"}, None, None) == ("system", None, None)
    with pytest.raises(click.UsageError, match="no 'fingerprint'"):
        verification(url, {"token": "t"}, "pin", None)
    with pytest.raises(click.UsageError, match=re.escape("no 'ca.crt'; pass --ca-file")):
        verification(url, {"token": "t", "fingerprint": pin}, "ca", None)
    with pytest.raises(click.UsageError, match="needs an https:// coordinator"):
        verification("http://203.0.113.7:8700", secret, None, None)
    with pytest.raises(click.UsageError, match="--ca-file goes with --verify ca"):
        verification(url, secret, "pin", "/my/ca.pem")


def test_python_m_echo_operator_is_kopf_run_for_the_handlers() -> None:
    assert entry.kopf_argv([]) == ["run", "--standalone", "-m", "echo_operator.handlers", "--all-namespaces"]
    assert "--all-namespaces" not in entry.kopf_argv(["--namespace=ml"])
    proc = subprocess.run(
        [sys.executable, "-m", "echo_operator", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "--all-namespaces" in proc.stdout and "--liveness" in proc.stdout


def test_the_operator_deployment_runs_valid_kopf_options() -> None:
    from kopf import cli as kopf_cli

    docs = list(yaml.safe_load_all((REPO / "manifests" / "common" / "operator.yaml").read_text()))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    argv = entry.kopf_argv(container["args"])
    run_cmd = kopf_cli.main.commands["run"]
    assert isinstance(run_cmd, click.Command)
    ctx = run_cmd.make_context("kopf run", argv[1:])
    assert ctx.params["clusterwide"] and ctx.params["standalone"]
    assert ctx.params["liveness_endpoint"] == "http://0.0.0.0:8080/healthz"


def test_the_operator_runs_replicas_that_elect_a_leader_and_keep_one_through_a_drain() -> None:
    docs = list(yaml.safe_load_all((REPO / "manifests" / "common" / "operator.yaml").read_text()))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    spec = deployment["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert spec["replicas"] >= 2 and spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert env["ECHORL_LEADER_ELECTION"] == "true"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # each replica's identity
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def entrypoint(dockerfile: pathlib.Path) -> tuple[list[str], list[str]]:
    text = dockerfile.read_text()
    found: dict[str, list[str]] = {}
    for key in ("ENTRYPOINT", "CMD"):
        match = re.search(rf"^{key} (\[.*\])$", text, re.MULTILINE)
        assert match, f"{dockerfile.name}: no exec-form {key}"
        found[key] = yaml.safe_load(match.group(1))
    assert "USER 1000:1000" in text, f"{dockerfile.name}: must not run as root"
    return found["ENTRYPOINT"], found["CMD"]


def test_every_image_has_an_entry_point_that_exists() -> None:
    dockerfiles = sorted(IMAGES.glob("*.Dockerfile"))
    assert {d.name for d in dockerfiles} == {
        "operator.Dockerfile", "worker-cpu.Dockerfile", "worker-vllm.Dockerfile", "trainer.Dockerfile",
    }  # fmt: skip
    for dockerfile in dockerfiles:
        ep, cmd = entrypoint(dockerfile)
        if dockerfile.name == "operator.Dockerfile":
            assert ep == ["python", "-m", "echo_operator"]
            continue
        assert ep == ["echorl"]
        result = CliRunner().invoke(echorl_main, [*cmd])
        assert result.exit_code == 0, (dockerfile.name, result.output)


def test_echorl_operator_crds_check_passes_on_the_committed_crds() -> None:
    result = CliRunner().invoke(operator_group, ["crds", "--out", str(REPO / "crds"), "--check"])
    assert result.exit_code == 0, result.output


class _Reviews:
    """Answers SelfSubjectAccessReviews from a set of allowed (verb, group, resource)."""

    def __init__(self, allowed: set[tuple[str, str, str]], fail: bool = False) -> None:
        self.allowed, self.fail, self.asked = allowed, fail, []  # type: ignore[var-annotated]

    def may(self, verb: str, group: str, resource: str, namespace: str | None = None) -> bool:
        from echo_operator.kube import KubeError

        self.asked.append((verb, group, resource))
        if self.fail:
            raise KubeError(0, "connection refused", "review")
        return (verb, group, resource) in self.allowed


@pytest.mark.parametrize(
    ("allowed", "fail", "scans"),
    [
        (
            {("watch", "", "namespaces"), ("watch", "apiextensions.k8s.io", "customresourcedefinitions")},
            False,
            True,
        ),
        ({("watch", "", "namespaces")}, False, False),
        ({("watch", "apiextensions.k8s.io", "customresourcedefinitions")}, False, False),
        (set(), False, False),
        (set(), True, True),  # cannot ask: kopf's default, scanning on
    ],
)
def test_kopf_scans_namespaces_and_crds_only_where_it_may(
    allowed: set[tuple[str, str, str]], fail: bool, scans: bool
) -> None:
    from echo_operator import handlers

    reviews = _Reviews(allowed, fail)
    assert handlers._may_scan(reviews) is scans  # type: ignore[arg-type]
    assert reviews.asked[0] == ("watch", "", "namespaces")


def test_the_operator_image_installs_every_library_the_operator_imports() -> None:
    """What echo_operator imports from outside the project (at module level or inside functions) must be
    in the operator image's pip line: the image installs no dependency of pyproject.toml by itself."""
    import ast
    import importlib.metadata
    import sys

    text = (IMAGES / "operator.Dockerfile").read_text()
    installed = {m.lower().replace("_", "-") for m in re.findall(r'"([A-Za-z0-9_.-]+)(?:[=<>][^"]*)?"', text)}
    distributions = importlib.metadata.packages_distributions()
    needed: dict[str, set[str]] = {}
    for path in (REPO / "operator" / "echo_operator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in ("echo_operator", "echo_runtime") or top in sys.stdlib_module_names:
                    continue
                for dist in distributions.get(top, [top]):
                    needed.setdefault(dist.lower().replace("_", "-"), set()).add(path.name)
    # With what they install in turn (pydantic brings pydantic-core; minio, urllib3 and certifi).
    todo = list(installed)
    while todo:
        try:
            requires = importlib.metadata.requires(todo.pop()) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            dep = re.split(r"[ ;\[<>=!~(]", req, maxsplit=1)[0].lower().replace("_", "-")
            if dep not in installed:
                installed.add(dep)
                todo.append(dep)
    missing = {d: sorted(files) for d, files in needed.items() if d not in installed}
    assert not missing, f"imported by the operator but not installed in images/operator.Dockerfile: {missing}"
