"""Where pods go and what they get: resources, node selection, tolerations, affinity.

These mirror the Kubernetes core types closely enough to be copied into a pod spec verbatim, but
are typed in full so the CRD schema stays structural (no preserve-unknown-fields blobs).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from echo_runtime.spec.base import SpecModel

Quantity = str
"""A Kubernetes resource quantity such as ``"500m"``, ``"4Gi"`` or ``"1"``."""


class Resources(SpecModel):
    """Compute resources of one container (``nvidia.com/gpu`` for GPU pools)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Requested resources, e.g. ``{cpu: "2", memory: "8Gi"}``."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Resource limits, e.g. ``{nvidia.com/gpu: "1"}``."""


class Toleration(SpecModel):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)


class NodeSelectorRequirement(SpecModel):
    """One ``matchExpressions`` entry of a node selector term."""

    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)


class NodeSelectorTerm(SpecModel):
    """Terms are ORed; the requirements inside one term are ANDed."""

    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list)


class PreferredSchedulingTerm(SpecModel):
    """A weighted preference for nodes matching ``preference``."""

    weight: int = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(SpecModel):
    """Node affinity: hard requirements and weighted preferences."""

    required: list[NodeSelectorTerm] = Field(default_factory=list)
    """Becomes ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``."""
    preferred: list[PreferredSchedulingTerm] = Field(default_factory=list)
    """Becomes ``preferredDuringSchedulingIgnoredDuringExecution``."""


class Affinity(SpecModel):
    """Pod affinity rules Echo passes through (node affinity only)."""

    node_affinity: NodeAffinity | None = None


class Placement(SpecModel):
    """Container image, resources and node placement shared by swarms."""

    image: str | None = None
    """Container image; defaults to the Echo image for the backend."""
    resources: Resources = Field(default_factory=Resources)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    affinity: Affinity | None = None
