"""Reading manifests: YAML → validated models, every problem reported with its field path.

``load_file`` never stops at the first problem: it returns or raises all of them, each as
``<path>: <what is wrong and what is allowed>`` (``spec.syncPolicy.maxStaleness: must be ≥ 0, got -1``).
``resolve`` turns an EchoJob plus the objects it references into one self-contained
:class:`ResolvedJob`, which is what the runtime and the operator consume.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pydantic
import yaml

from echo_runtime.spec.base import GROUP_VERSION
from echo_runtime.spec.objects import KINDS, EchoJob, EchoJobSpec, Manifest
from echo_runtime.spec.policy import SyncPolicySpec
from echo_runtime.spec.swarms import InferenceSwarmSpec, TrainingSwarmSpec


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest: where, and what."""

    path: str
    message: str
    document: int = 0
    """Index of the YAML document in its file (0 for the first)."""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ManifestError(ValueError):
    """A manifest is invalid; ``problems`` lists every problem found."""

    def __init__(self, problems: Sequence[Problem], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        where = f"{source}: " if source else ""
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{where}{len(self.problems)} problem(s)\n{lines}")


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
        if sep and head.isidentifier():
            return (*loc, head), rest
        return loc, text
    return loc, str(err["msg"])


def _validate_document(doc: Any, index: int) -> tuple[Manifest | None, list[Problem]]:
    if not isinstance(doc, dict):
        return None, [Problem("", f"document {index}: must be a mapping with apiVersion and kind", index)]
    problems: list[Problem] = []
    if doc.get("apiVersion") != GROUP_VERSION:
        problems.append(
            Problem("apiVersion", f"must be {GROUP_VERSION!r}, got {doc.get('apiVersion')!r}", index)
        )
    kind = doc.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        problems.append(Problem("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}", index))
        return None, problems
    try:
        obj = cls.model_validate(doc)
    except pydantic.ValidationError as exc:
        for err in exc.errors():
            loc, message = _message(err, cls)
            if loc and loc[0] in ("apiVersion", "kind") and problems:
                continue  # already reported above in plainer words
            problems.append(Problem(_join(loc), message, index))
        return None, problems
    return obj, problems


def load_documents(text: str, source: str = "") -> list[Manifest]:
    """Parse and validate every YAML document in ``text``; raise ManifestError with all problems."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError([Problem("", f"not valid YAML: {exc}")], source) from exc
    if not docs:
        raise ManifestError([Problem("", "no YAML documents found")], source)
    manifests: list[Manifest] = []
    problems: list[Problem] = []
    for index, doc in enumerate(docs):
        obj, found = _validate_document(doc, index)
        problems.extend(found)
        if obj is not None:
            manifests.append(obj)
    if problems:
        raise ManifestError(problems, source)
    return manifests


def load_file(path: str | Path) -> list[Manifest]:
    """Read and validate a manifest file (one or more YAML documents)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError([Problem("", f"cannot read {path}: {exc.strerror}")], str(path)) from exc
    return load_documents(text, str(path))


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
    problems: list[Problem] = []

    def lookup(kind: str, name: str, path: str) -> Any:
        found = by_kind.get((kind, name))
        if found is None:
            problems.append(Problem(path, f"refers to {kind} {name!r}, which is not defined"))
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
    if problems:
        raise ManifestError(problems, job.metadata.name)
    return ResolvedJob(
        name=job.metadata.name,
        namespace=job.metadata.namespace,
        spec=spec,
        sync_policy=sync,
        training_swarm=training,
        inference_pools=tuple(pools),
    )


def load_job(path: str | Path, name: str | None = None) -> ResolvedJob:
    """Load the EchoJob in ``path`` (the one named ``name`` if there are several) and resolve it."""
    manifests = load_file(path)
    jobs = [m for m in manifests if isinstance(m, EchoJob)]
    if name is not None:
        jobs = [j for j in jobs if j.metadata.name == name]
    if len(jobs) != 1:
        what = f"an EchoJob named {name!r}" if name else "exactly one EchoJob"
        raise ManifestError([Problem("", f"expected {what}, found {len(jobs)}")], str(path))
    return resolve(jobs[0], manifests)
