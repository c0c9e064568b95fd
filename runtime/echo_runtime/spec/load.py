"""Reading manifests: YAML → validated models, every problem reported with its field path.

``load_file`` never stops at the first problem: it returns or raises all of them, each as
``<path>: <what is wrong and what is allowed>`` (``spec.syncPolicy.maxStaleness: must be ≥ 0, got -1``).
``resolve`` turns an EchoJob plus the objects it references into one self-contained
:class:`ResolvedJob`, which is what the runtime and the operator consume.

A file may hold documents of other kinds (the Secret an EchoJob's storage names, an HPA): they are
skipped, and :func:`read_documents` lists them. ``cluster=True`` adds the rules that hold only in a
cluster (each kind's ``cluster_problems``), which the CRD's CEL rules enforce on the API server, and
reads ``key: null`` as the API server does (as if the key were absent); without it a file is checked
as ``echorl run`` reads it. Values are read as kubectl sends them: ``1e-5`` is a number (PyYAML's
YAML 1.1 would make it a string) and ``2.0`` the integer 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pydantic
import yaml

from echo_runtime.spec.base import API_GROUP, GROUP_VERSION
from echo_runtime.spec.objects import KINDS, EchoJob, EchoJobSpec, Manifest
from echo_runtime.spec.policy import SyncPolicySpec
from echo_runtime.spec.swarms import InferenceSwarmSpec, TrainingSwarmSpec


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing found wrong with a manifest: where (field path, document), and what is wrong and allowed."""

    path: str
    message: str
    document: int = 0
    """Index of the YAML document in its file (0 for the first)."""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ManifestError(ValueError):
    """A manifest is invalid; ``findings`` lists everything found wrong with it."""

    def __init__(self, findings: Sequence[Finding], source: str = "") -> None:
        self.findings = list(findings)
        self.source = source
        where = f"{source}: " if source else ""
        lines = "\n".join(f"  {p}" for p in self.findings)
        super().__init__(f"{where}{len(self.findings)} problem(s)\n{lines}")


def _join(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _allowed_keys(model: type[pydantic.BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The manifest keys allowed at ``loc`` (the parent of an unknown key), for suggestions."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not (
            isinstance(current, type) and issubclass(current, pydantic.BaseModel)
        ):
            continue
        field = next(
            (f for n, f in current.model_fields.items() if (f.alias or n) == part or n == part), None
        )
        if field is None:
            return []
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, pydantic.BaseModel):
        return [f.alias or n for n, f in current.model_fields.items()]
    return []


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside ``X``, ``X | None`` or ``list[X]``, else the annotation itself."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if isinstance(found, type) and issubclass(found, pydantic.BaseModel):
            return found
    return annotation


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping",
    "list_type": "a list",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _message(err: Any, model: type[pydantic.BaseModel]) -> tuple[tuple[str | int, ...], str]:
    """Turn one pydantic error into (path, message) in the manifest's own words."""
    loc: tuple[str | int, ...] = tuple(err["loc"])
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "missing":
        return loc, "required field is missing"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = (
            f" (did you mean {close[0]!r}?)"
            if close
            else (f"; allowed: {', '.join(allowed)}" if allowed else "")
        )
        return loc, f"unknown field{hint}"
    bounds = {
        "greater_than_equal": ("≥", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("≤", "le"),
        "less_than": ("<", "lt"),
    }
    if kind in bounds:
        symbol, key = bounds[kind]
        return loc, f"must be {symbol} {ctx[key]}, got {got!r}"
    if kind == "literal_error":
        return loc, f"must be one of {ctx['expected']}, got {got!r}"
    if kind in _TYPE_WORDS:
        return loc, f"must be {_TYPE_WORDS[kind]}, got {got!r}"
    if kind in ("too_short", "string_too_short"):
        unit = "item(s)" if kind == "too_short" else "character(s)"
        return loc, f"must have at least {ctx.get('min_length')} {unit}, got {got!r}"
    if kind in ("too_long", "string_too_long"):
        unit = "item(s)" if kind == "too_long" else "character(s)"
        return loc, f"must have at most {ctx.get('max_length')} {unit}"
    if kind == "string_pattern_mismatch":
        return loc, f"must match the pattern {ctx['pattern']!r}, got {got!r}"
    if kind == "value_error":
        text = str(ctx.get("error", err["msg"]))
        # Model-level validators name the offending field first ("refreshThreshold: must be ..."):
        # attach it to the path so every message reads the same way.
        head, sep, rest = text.partition(": ")
        if sep and head and all(part.isidentifier() for part in head.split(".")):
            return (*loc, *head.split(".")), rest
        return loc, text
    return loc, str(err["msg"])


class _Loader(yaml.SafeLoader):
    """A safe loader whose floats are YAML 1.2's (as go-yaml's, which kubectl uses): ``1e-5``, ``2E3``."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _is_ours(doc: Any) -> bool:
    """Whether a document is one of Echo's (or meant to be): any other kind is skipped, not refused."""
    if not isinstance(doc, dict):
        return True
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return True
    return api_version.split("/")[0] == API_GROUP or kind in KINDS


def _as_kubectl_sends(value: Any, cluster: bool, path: tuple[str, ...] = ()) -> Any:
    """``value`` as the API server receives it from kubectl: ``2.0`` becomes the integer 2 (YAML to
    JSON), and with ``cluster`` every ``key: null`` is gone (the API server prunes nulls of non-nullable
    fields, then defaults them). Free-form task options are left as written."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_as_kubectl_sends(v, cluster, path) for v in value]
    if not isinstance(value, dict) or path[-2:] == ("task", "options"):
        return value
    return {
        k: _as_kubectl_sends(v, cluster, (*path, str(k)))
        for k, v in value.items()
        if v is not None or not cluster
    }


def _validate_document(doc: Any, index: int, cluster: bool = False) -> tuple[Manifest | None, list[Finding]]:
    doc = _as_kubectl_sends(doc, cluster)
    if not isinstance(doc, dict):
        return None, [Finding("", f"document {index}: must be a mapping with apiVersion and kind", index)]
    findings: list[Finding] = []
    if doc.get("apiVersion") != GROUP_VERSION:
        findings.append(
            Finding("apiVersion", f"must be {GROUP_VERSION!r}, got {doc.get('apiVersion')!r}", index)
        )
    kind = doc.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        findings.append(Finding("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}", index))
        return None, findings
    try:
        obj = cls.model_validate(doc)
    except pydantic.ValidationError as exc:
        for err in exc.errors():
            loc, message = _message(err, cls)
            if loc and loc[0] in ("apiVersion", "kind") and findings:
                continue  # already reported above in plainer words
            findings.append(Finding(_join(loc), message, index))
        return None, findings
    if cluster and not findings:
        findings = [Finding(path, message, index) for path, message in obj.cluster_problems()]
    return obj, findings


@dataclasses.dataclass(frozen=True)
class Documents:
    """The validated Echo objects of a file, and the documents of other kinds it skipped."""

    manifests: list[Manifest]
    skipped: list[str]
    """``Kind/name`` of each skipped document (a Secret, an HPA), in file order."""


def read_documents(text: str, source: str = "", *, cluster: bool = False) -> Documents:
    """Parse and validate every Echo document in ``text`` (``cluster``: with the cluster-only rules).

    Raises ManifestError with every problem; documents of other kinds are skipped and listed.
    """
    try:
        docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError([Finding("", f"not valid YAML: {exc}")], source) from exc
    if not docs:
        raise ManifestError([Finding("", "no YAML documents found")], source)
    manifests: list[Manifest] = []
    skipped: list[str] = []
    findings: list[Finding] = []
    for index, doc in enumerate(docs):
        if not _is_ours(doc):
            meta = doc.get("metadata")
            name = meta.get("name") if isinstance(meta, dict) else None
            skipped.append(f"{doc['kind']}/{name}" if name else doc["kind"])
            continue
        obj, found = _validate_document(doc, index, cluster)
        findings.extend(found)
        if obj is not None and not found:
            manifests.append(obj)
    if findings:
        raise ManifestError(findings, source)
    return Documents(manifests, skipped)


def load_documents(text: str, source: str = "", *, cluster: bool = False) -> list[Manifest]:
    """The validated Echo objects in ``text`` (see :func:`read_documents`); other kinds are skipped."""
    return read_documents(text, source, cluster=cluster).manifests


def read_file(path: str | Path, *, cluster: bool = False) -> Documents:
    """Read and validate a manifest file (one or more YAML documents); see :func:`read_documents`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError([Finding("", f"cannot read {path}: {exc.strerror}")], str(path)) from exc
    return read_documents(text, str(path), cluster=cluster)


def load_file(path: str | Path, *, cluster: bool = False) -> list[Manifest]:
    """The validated Echo objects of a manifest file; documents of other kinds are skipped."""
    return read_file(path, cluster=cluster).manifests


@dataclasses.dataclass(frozen=True)
class ResolvedJob:
    """An EchoJob with every reference replaced by the object it names: what the runtime runs."""

    name: str
    namespace: str | None
    spec: EchoJobSpec
    sync_policy: SyncPolicySpec
    training_swarm: TrainingSwarmSpec
    inference_pools: tuple[tuple[str, InferenceSwarmSpec], ...]
    """(pool name, pool spec) for every inference pool, in manifest order."""


def resolve(job: EchoJob, others: Iterable[Manifest] = ()) -> ResolvedJob:
    """Resolve ``job``'s references against ``others``; raise ManifestError naming each missing one."""
    by_kind: dict[tuple[str, str], Manifest] = {(o.kind, o.metadata.name): o for o in others}
    findings: list[Finding] = []

    def lookup(kind: str, name: str, path: str) -> Any:
        found = by_kind.get((kind, name))
        if found is None:
            findings.append(Finding(path, f"refers to {kind} {name!r}, which is not defined"))
            return None
        return found.spec

    spec = job.spec
    sync = spec.sync_policy or SyncPolicySpec()
    if spec.sync_policy_ref is not None:
        sync = lookup("SyncPolicy", spec.sync_policy_ref, "spec.syncPolicyRef") or sync
    training = spec.training_swarm or TrainingSwarmSpec()
    if spec.training_swarm_ref is not None:
        training = lookup("TrainingSwarm", spec.training_swarm_ref, "spec.trainingSwarmRef") or training
    pools: list[tuple[str, InferenceSwarmSpec]] = []
    for i, pool in enumerate(spec.inference_swarms):
        if pool.swarm_ref is not None:
            ref = lookup("InferenceSwarm", pool.swarm_ref, f"spec.inferenceSwarms[{i}].swarmRef")
            if ref is not None:
                pools.append((pool.name, ref))
        else:
            fields = {k: getattr(pool, k) for k in InferenceSwarmSpec.model_fields}
            pools.append((pool.name, InferenceSwarmSpec.model_validate(fields)))
    if findings:
        raise ManifestError(findings, job.metadata.name)
    return ResolvedJob(
        name=job.metadata.name,
        namespace=job.metadata.namespace,
        spec=spec,
        sync_policy=sync,
        training_swarm=training,
        inference_pools=tuple(pools),
    )


def seeded(document: dict[str, Any], seed: int) -> dict[str, Any]:
    """A copy of an EchoJob document (plain YAML data) with ``spec.algorithm.seed`` set to ``seed``: the
    one way ``echorl run --seed`` and ``echorl bench sync`` override a manifest's seed."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be an integer ≥ 0, got {seed!r}")
    out: dict[str, Any] = json.loads(json.dumps(document))  # a deep copy of plain YAML data
    spec = out.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise ValueError("spec: must be a mapping")
    algorithm = spec.setdefault("algorithm", {})
    if not isinstance(algorithm, dict):
        raise ValueError("spec.algorithm: must be a mapping")
    algorithm["seed"] = seed
    return out


def load_job(path: str | Path, name: str | None = None) -> ResolvedJob:
    """Load the EchoJob in ``path`` (the one named ``name`` if there are several) and resolve it."""
    manifests = load_file(path)
    jobs = [m for m in manifests if isinstance(m, EchoJob)]
    if name is not None:
        jobs = [j for j in jobs if j.metadata.name == name]
    if len(jobs) != 1:
        what = f"an EchoJob named {name!r}" if name else "exactly one EchoJob"
        raise ManifestError([Finding("", f"expected {what}, found {len(jobs)}")], str(path))
    return resolve(jobs[0], manifests)
