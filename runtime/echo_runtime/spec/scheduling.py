"""Where pods go and what they get: resources, node selection, tolerations, affinity.

These mirror the Kubernetes core types closely enough to be copied into a pod spec verbatim, but
are typed in full so the CRD schema stays structural (no preserve-unknown-fields blobs).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from echo_runtime.spec.base import Int, SpecModel

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
    """Taint key the toleration matches; empty with ``Exists`` matches every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """``Equal`` matches ``value``; ``Exists`` matches any value."""
    value: str | None = None
    """Taint value to match (with ``Equal``)."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches every effect."""
    toleration_seconds: Int | None = Field(default=None, ge=0)
    """``NoExecute`` only: how long the pod stays bound after the taint appears."""


class NodeSelectorRequirement(SpecModel):
    """One ``matchExpressions`` entry of a node selector term."""

    key: str = Field(min_length=1)
    """Node label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """How the label's value is compared with ``values``."""
    values: list[str] = Field(default_factory=list)
    """Values for ``In``/``NotIn`` (one integer for ``Gt``/``Lt``; none for ``Exists``)."""


class NodeSelectorTerm(SpecModel):
    """Terms are ORed; the requirements inside one term are ANDed."""

    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    """Node label requirements, all of which must hold."""


class PreferredSchedulingTerm(SpecModel):
    """A weighted preference for nodes matching ``preference``."""

    weight: Int = Field(ge=1, le=100)
    """Added to a node's score when it matches ``preference``."""
    preference: NodeSelectorTerm
    """The node selector term to prefer."""


class NodeAffinity(SpecModel):
    """Node affinity: hard requirements and weighted preferences."""

    required: list[NodeSelectorTerm] = Field(default_factory=list)
    """Becomes ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``."""
    preferred: list[PreferredSchedulingTerm] = Field(default_factory=list)
    """Becomes ``preferredDuringSchedulingIgnoredDuringExecution``."""


class Affinity(SpecModel):
    """Pod affinity rules Echo passes through (node affinity only)."""

    node_affinity: NodeAffinity | None = None
    """Node affinity of the pods."""


class Placement(SpecModel):
    """Container image, resources and node placement shared by swarms."""

    image: str | None = None
    """Container image; defaults to the Echo image for the backend."""
    resources: Resources = Field(default_factory=Resources)
    """Requests and limits of the main container (``nvidia.com/gpu`` for GPUs)."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the pods require, e.g. ``{echorl.dev/pool: gpu}``."""
    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the pods tolerate (e.g. ``nvidia.com/gpu`` on GPU nodes)."""
    affinity: Affinity | None = None
    """Node affinity, passed through to the pods."""
