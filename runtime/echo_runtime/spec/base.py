"""Shared building blocks of the manifest models: the camelCase convention and Kubernetes metadata.

Every spec model is a pydantic model whose Python attributes are snake_case and whose manifest keys
are camelCase (the Kubernetes convention). Unknown keys are errors, so a typo never silently falls
back to a default. These models are the single source of the CRD schemas, so every field carries a
description, and bounds and enums live in the type (``Field(ge=...)``, ``Literal[...]``).

Scalars are as strict as the CRD schema, so a file the API server refuses is refused here too:
:data:`Int` takes an integer only (not ``"2"``, ``2.5`` or ``true``), :data:`Bool` takes ``true`` or
``false`` only (not ``"false"`` or ``0``), :data:`Number` takes an integer or a float (not ``"1e-5"``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict
from pydantic.alias_generators import to_camel

API_GROUP = "echorl.dev"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"


Int = Annotated[int, Strict()]
"""An integer field (schema ``type: integer``): strings, booleans and fractions are refused (the loader
reads ``2.0`` as ``2``, as kubectl sends it)."""
Bool = Annotated[bool, Strict()]
"""A boolean field (schema ``type: boolean``): only ``true`` and ``false``."""
Number = Annotated[float, Strict()]
"""A number field (schema ``type: number``): an integer or a float, never a string."""

LOCAL_DEFAULT: dict[str, Any] = {"x-echorl-local-default": True}
"""``json_schema_extra`` of a field whose default holds for ``echorl run`` only: the CRD gets no default
for it, so that a cluster rule can require it."""

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class SpecModel(BaseModel):
    """Base of every manifest model: camelCase keys, unknown keys forbidden, validated on assignment."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        use_attribute_docstrings=True,
    )

    def to_manifest(self) -> dict[str, Any]:
        """The manifest form: camelCase keys, defaults omitted only where they were never set."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS1123.match(value):
        raise ValueError(
            "must be a DNS-1123 label: at most 63 lowercase letters, digits or '-', "
            f"starting and ending with a letter or digit, got {value!r}"
        )
    return value


def cel(*rules: tuple[str, str] | tuple[str, str, str]) -> dict[str, Any]:
    """CEL validation rules for the CRD schema (``x-kubernetes-validations``), as ``json_schema_extra``.

    Each rule is ``(rule, message)`` or ``(rule, message, fieldPath)``. They restate, for the
    Kubernetes API server, what the model's validators check in Python, plus transition rules
    (``oldSelf``) that only an API server can enforce. The models stay the single source.
    """
    out: list[dict[str, str]] = []
    for rule in rules:
        entry = {"rule": rule[0], "message": rule[1]}
        if len(rule) == 3:
            entry["fieldPath"] = rule[2]
        out.append(entry)
    return {"x-kubernetes-validations": out}


DnsLabel = Annotated[str, AfterValidator(_dns_label), Field(min_length=1, max_length=63)]
"""A Kubernetes object or pool name (DNS-1123 label)."""


class ObjectMeta(BaseModel):
    """The part of Kubernetes ``metadata`` Echo reads; server-set fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, alias_generator=to_camel)

    name: DnsLabel
    """Object name; for an EchoJob also the job's name in the snapshot store and in ``runs/``."""
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None
