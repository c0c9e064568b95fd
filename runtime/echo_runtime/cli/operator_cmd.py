"""``echorl operator``: run the Kubernetes operator, generate its CRDs, join a job from outside the cluster.

* ``echorl operator run [kopf run options]`` — the operator (the same as ``python -m echo_operator``);
* ``echorl operator crds --out crds/ [--check]`` — write (or check) the CRDs generated from the spec models;
* ``echorl operator join JOB --pool POOL [-n NAMESPACE]`` — on a machine outside the cluster (a Mac),
  read the pool's join Secret with your kubeconfig and start ``echorl worker`` against the job's
  coordinator, verifying its TLS certificate with the fingerprint (or CA) the Secret carries.
  ``--print`` shows the command (token included) instead of running it.
"""

from __future__ import annotations

import base64
import os
import shlex
import sys
from typing import Any

import click

from echo_runtime.models import resolve

_DEFAULT_BACKEND = "mlx" if sys.platform == "darwin" else "transformers"


@click.group(name="operator")
def operator() -> None:
    """The Kubernetes operator: run it, generate its CRDs, join a job's external pool."""


@operator.command(
    name="run",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
)
@click.argument("kopf_args", nargs=-1, type=click.UNPROCESSED)
def run(kopf_args: tuple[str, ...]) -> None:
    """Run the operator (options go to `kopf run`; default: --all-namespaces --standalone)."""
    from echo_operator import __main__ as entry

    raise SystemExit(entry.main(list(kopf_args)))


@operator.command(name="crds")
@click.option(
    "--out", default="crds", show_default=True, type=click.Path(file_okay=False), help="Output folder."
)
@click.option(
    "--chart",
    default=None,
    type=click.Path(file_okay=False),
    help="Also the Helm chart's crds/ (e.g. charts/echorl-operator).",
)
@click.option("--check", is_flag=True, help="Exit 1 if the files in --out differ from the generated ones.")
def crds_cmd(out: str, chart: str | None, check: bool) -> None:
    """Write the CRDs generated from the spec models (what `crds/` and the Helm chart hold)."""
    from echo_operator import crds

    raise SystemExit(
        crds.main(["--out", out, *(["--chart", chart] if chart else []), *(["--check"] if check else [])])
    )


def worker_command(
    url: str,
    job_file: str,
    pool: str,
    backend: str,
    device: str,
    fingerprint: str | None = None,
    ca_file: str | None = None,
) -> list[str]:
    """The ``echorl worker`` command line an external worker runs (its token comes from ``ECHORL_TOKEN``)."""
    argv = [
        "echorl", "worker", "--job", job_file, "--coordinator", url, "--pool", pool,
        "--backend", backend, "--device", device, "--external",
    ]  # fmt: skip
    if fingerprint:
        argv += ["--tls-fingerprint", fingerprint]
    if ca_file:
        argv += ["--ca-file", ca_file]
    return argv


def verification(
    url: str, secret: dict[str, str], verify: str | None, ca_file: str | None
) -> tuple[str, str | None, str | None]:
    """(how, the fingerprint to pin, the CA text to trust) for joining ``url`` with the join ``secret``.

    By default the coordinator's own certificate is pinned when the Secret names one (``fingerprint``):
    that holds on any address of it, also one its certificate does not name. ``ca`` checks the chain
    to the job's CA (``ca.crt``) and the host name instead; ``system`` uses the machine's CAs (an
    Ingress with a public certificate). ``--ca-file`` is ``ca`` with a CA of your own.
    """
    if ca_file:
        if verify not in (None, "ca"):
            raise click.UsageError(f"--ca-file goes with --verify ca, not --verify {verify}")
        return "ca", None, None
    how = verify or ("pin" if secret.get("fingerprint") else "system")
    if how != "system" and not url.startswith("https://"):
        raise click.UsageError(
            f"--verify {how} needs an https:// coordinator, and {url} is not: the job's coordinator serves "
            "TLS on its external Service; an address of your own (--coordinator) must be that port"
        )
    if how == "pin":
        if not secret.get("fingerprint"):
            raise click.UsageError(
                "--verify pin: the join Secret has no 'fingerprint' (the address is not the "
                "coordinator's own TLS port); use --verify ca --ca-file or --verify system"
            )
        return how, secret["fingerprint"], None
    if how == "ca":
        if not secret.get("ca.crt"):
            raise click.UsageError("--verify ca: the join Secret has no 'ca.crt'; pass --ca-file")
        return how, None, secret["ca.crt"]
    return how, None, None


def _read(api: Any, kind: str, namespace: str, name: str) -> dict[str, str] | None:
    """A Secret's (decoded) or a ConfigMap's data; None if it does not exist."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    try:
        if kind == "Secret":
            secret = core.read_namespaced_secret(name, namespace)
            return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        return dict(core.read_namespaced_config_map(name, namespace).data or {})
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise click.ClickException(f"cannot read {kind} {namespace}/{name}: {exc.reason}") from None


@operator.command(name="join")
@click.argument("job")
@click.option("--pool", required=True, help="The job's external pool to join (external: true).")
@click.option("-n", "--namespace", default=None, help="The job's namespace (default: the kubeconfig's).")
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False), help="Default: $KUBECONFIG.")
@click.option(
    "--backend", default=_DEFAULT_BACKEND, show_default=True, help="Inference backend on this machine."
)
@click.option(
    "--device", default="auto", show_default=True, help="Device for the backend (auto, cpu, mps, cuda)."
)
@click.option(
    "--coordinator", "url", default=None, help="Coordinator URL, if the Secret has none (an Ingress)."
)
@click.option("--store-endpoint", default=None, help="S3 endpoint reachable from here, if not the job's own.")
@click.option(
    "--verify",
    type=click.Choice(["pin", "ca", "system"]),
    default=None,
    help="How to trust the coordinator's TLS certificate: pin its fingerprint (default when the Secret has "
    "one), the job's CA with a host-name check, or the system's CAs.",
)
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A CA of your own the coordinator's certificate must chain to (implies --verify ca).",
)
@click.option("--print", "print_only", is_flag=True, help="Print the command instead of running it.")
def join(
    job: str,
    pool: str,
    namespace: str | None,
    kubeconfig: str | None,
    backend: str,
    device: str,
    url: str | None,
    store_endpoint: str | None,
    verify: str | None,
    ca_file: str | None,
    print_only: bool,
) -> None:
    """Join JOB's external POOL from this machine: `echorl operator join my-job --pool macs -n ml`.

    Reads the pool's join Secret (token, coordinator address, the fingerprint and CA of the
    coordinator's certificate), the job's manifest (ConfigMap JOB-config) and, if you may read it, the
    job's read-only store credentials, then runs `echorl worker --external` with them. The worker
    refuses a coordinator whose certificate is not the expected one before it sends the token.
    """
    import yaml
    from kubernetes import config

    path = kubeconfig or os.environ.get("KUBECONFIG")
    try:
        _, active = config.list_kube_config_contexts(config_file=path)
        api = config.new_client_from_config(config_file=path)
    except config.ConfigException as exc:
        raise click.ClickException(f"no usable kubeconfig: {exc}") from exc
    ns = namespace or active.get("context", {}).get("namespace") or "default"
    secret_name = f"{job}-{pool}-join"
    secret = _read(api, "Secret", ns, secret_name)
    manifest = _read(api, "ConfigMap", ns, f"{job}-config")
    if secret is None or manifest is None:
        raise click.ClickException(
            f"Secret {ns}/{secret_name} or ConfigMap {ns}/{job}-config not found: is {job!r} an EchoJob in "
            f"namespace {ns!r} with an external pool {pool!r}? (`kubectl -n {ns} get echojob {job} -o yaml`)"
        )
    url = url or secret.get("coordinator")
    if not url:
        raise click.ClickException(
            f"the job's coordinator has no external address yet (Secret {ns}/{secret_name} has no 'coordinator'): "
            "wait for its LoadBalancer, or pass --coordinator http://HOST:PORT (e.g. an Ingress) and set the "
            "EchoJob annotation echorl.dev/external-url to it"
        )
    how, pin, ca_text = verification(url, secret, verify, ca_file)
    document = yaml.safe_load(manifest["job.yaml"])
    if store_endpoint:
        document["spec"]["storage"]["endpoint"] = store_endpoint
    job_file = resolve.cache_dir() / "jobs" / f"{ns}-{job}.yaml"
    job_file.parent.mkdir(parents=True, exist_ok=True)
    job_file.write_text(yaml.safe_dump(document, sort_keys=False))
    env = {"ECHORL_TOKEN": secret["token"]}
    store = _read(api, "Secret", ns, f"{job}-storage-readonly")
    if store is not None:
        env.update(ECHORL_S3_ACCESS_KEY=store["accessKey"], ECHORL_S3_SECRET_KEY=store["secretKey"])
    if ca_text is not None:
        ca_path = job_file.with_name(f"{ns}-{job}-ca.crt")
        ca_path.write_text(ca_text)
        ca_file = str(ca_path)
    argv = worker_command(url, str(job_file), pool, backend, device, fingerprint=pin, ca_file=ca_file)
    if print_only:
        click.echo(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(argv))
        return
    os.environ.update(env)
    trust = {"pin": f"pinned certificate {pin}", "ca": f"CA {ca_file}", "system": "the system's CAs"}[how]
    click.echo(
        f"joining {ns}/{job} pool {pool} through {url} ({trust if url.startswith('https') else 'no TLS'})",
        err=True,
    )
    os.execvp(argv[0], argv)
