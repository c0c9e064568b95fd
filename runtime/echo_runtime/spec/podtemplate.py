"""``podTemplate``: what a cluster admin adds to the pods the operator builds for a pool or the trainer.

A subset of core/v1 ``PodTemplateSpec``, field names as Kubernetes spells them, so a block can be
pasted from an existing manifest: labels and annotations, ``priorityClassName``,
``serviceAccountName`` (cloud workload identity), ``imagePullSecrets``, ``runtimeClassName``, affinity
and anti-affinity, ``topologySpreadConstraints``, ``volumes``, and on the one Echo container
(``worker`` or ``trainer``) ``env``, ``envFrom`` and ``volumeMounts``. It is merged over the
operator's pod spec: the container keeps the operator's command, image, resources and env, and the
labels the operator selects on stay its own (both are refused here rather than silently overridden).
A mount at ``/tmp``, ``/cache`` or ``/dev/shm`` replaces the operator's scratch volume there (a
model-cache PVC at ``/cache``, for instance).

Every type is spelled out, so the CRD schema stays structural and the CLI refuses what the API server
refuses; volume sources are the common ones (PVC, ConfigMap, Secret, emptyDir, hostPath, CSI, NFS).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from echo_runtime.spec.base import Bool, Int, SpecModel, cel
from echo_runtime.spec.scheduling import NodeSelectorTerm, Placement, Quantity

RESERVED_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
)
"""Labels the operator sets on every pod (with every ``echorl.dev/`` key): not a template's to set."""
RESERVED_PREFIX = "echorl.dev/"
RESERVED_ENV = (
    "POD_NAME",
    "POD_NAMESPACE",
    "HOME",
    "HF_HOME",
    "PYTHONUNBUFFERED",
    "OMP_NUM_THREADS",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NNODES",
    "NPROC_PER_NODE",
    "NODE_RANK",
)
"""Variables the operator sets (with every ``ECHORL_`` one): set ``threads`` rather than
``OMP_NUM_THREADS``; mount a volume at ``/cache`` rather than moving ``HF_HOME``."""
RESERVED_ENV_PREFIX = "ECHORL_"
RESERVED_VOLUMES = ("job", "tmp", "cache", "dshm")
"""Names of the operator's own volumes."""
CONFIG_MOUNT = "/etc/echorl"
"""Where the operator mounts the job manifest; nothing may be mounted there or below."""
SCRATCH_MOUNTS = ("/tmp", "/cache", "/dev/shm")
"""The operator's scratch mounts: a template mount at one of these paths replaces it."""

_LIST = 64
"""Most entries of a template list (the API server's CEL cost budget needs a bound)."""


def _quote(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


class PodTemplateMetadata(SpecModel):
    """Labels and annotations added to the pods."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                f"!has(self.labels) || self.labels.all(k, !k.startsWith('{RESERVED_PREFIX}') "
                f"&& !(k in {_quote(RESERVED_LABELS)}))",
                f"the operator sets the {RESERVED_PREFIX}* and app.kubernetes.io name/instance/component/"
                "part-of/managed-by labels of its pods",
                ".labels",
            ),
            (
                f"!has(self.annotations) || self.annotations.all(k, !k.startsWith('{RESERVED_PREFIX}'))",
                f"the operator sets the {RESERVED_PREFIX}* annotations of its pods",
                ".annotations",
            ),
        )
    )

    labels: dict[str, str] = Field(default_factory=dict, max_length=_LIST)
    """Pod labels (e.g. for cost allocation or a network policy); the operator's own stay its own."""
    annotations: dict[str, str] = Field(default_factory=dict, max_length=_LIST)
    """Pod annotations (e.g. for a service mesh or a log shipper)."""

    @model_validator(mode="after")
    def _reserved(self) -> PodTemplateMetadata:
        taken = [k for k in self.labels if k.startswith(RESERVED_PREFIX) or k in RESERVED_LABELS]
        if taken:
            raise ValueError(
                f"labels: {', '.join(sorted(taken))}: the operator sets the {RESERVED_PREFIX}* and "
                "app.kubernetes.io name/instance/component/part-of/managed-by labels of its pods"
            )
        taken = [k for k in self.annotations if k.startswith(RESERVED_PREFIX)]
        if taken:
            raise ValueError(
                f"annotations: {', '.join(sorted(taken))}: the operator sets the {RESERVED_PREFIX}* "
                "annotations of its pods"
            )
        return self


# ----------------------------------------------------------------------------------------- references
class LocalObjectReference(SpecModel):
    """An object in the job's namespace, by name."""

    name: str = Field(min_length=1, max_length=253)
    """Object name."""


class KeyReference(SpecModel):
    """One key of a ConfigMap or Secret."""

    name: str = Field(min_length=1, max_length=253)
    """ConfigMap or Secret name."""
    key: str = Field(min_length=1, max_length=253)
    """The key whose value is used."""
    optional: Bool | None = None
    """Start the pod even when the object or key is missing."""


class OptionalReference(SpecModel):
    """A whole ConfigMap or Secret, by name."""

    name: str = Field(min_length=1, max_length=253)
    """ConfigMap or Secret name."""
    optional: Bool | None = None
    """Start the pod even when it is missing."""


# ----------------------------------------------------------------------------------------------- env
class FieldReference(SpecModel):
    """A field of the pod (downward API)."""

    field_path: str = Field(min_length=1)
    """e.g. ``metadata.labels['team']`` or ``spec.nodeName``."""
    api_version: str | None = None
    """Version of the schema ``fieldPath`` is written in (default ``v1``)."""


class ResourceFieldReference(SpecModel):
    """A resource request or limit of the container."""

    resource: str = Field(min_length=1)
    """e.g. ``limits.memory``."""
    container_name: str | None = None
    """The container (default: this one)."""
    divisor: Quantity | None = None
    """Unit the value is expressed in (default ``1``)."""


class EnvVarSource(SpecModel):
    """Where an environment variable's value comes from: exactly one source."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "[has(self.fieldRef), has(self.resourceFieldRef), has(self.configMapKeyRef), "
                "has(self.secretKeyRef)].filter(x, x).size() == 1",
                "valueFrom needs exactly one of fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef",
            ),
        )
    )

    field_ref: FieldReference | None = None
    """A field of the pod."""
    resource_field_ref: ResourceFieldReference | None = None
    """A resource of the container."""
    config_map_key_ref: KeyReference | None = None
    """A key of a ConfigMap."""
    secret_key_ref: KeyReference | None = None
    """A key of a Secret."""

    @model_validator(mode="after")
    def _one(self) -> EnvVarSource:
        given = [self.field_ref, self.resource_field_ref, self.config_map_key_ref, self.secret_key_ref]
        if sum(x is not None for x in given) != 1:
            raise ValueError("needs exactly one of fieldRef, resourceFieldRef, configMapKeyRef, secretKeyRef")
        return self


class EnvVar(SpecModel):
    """One environment variable of the Echo container, after the operator's own."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                f"!self.name.startsWith('{RESERVED_ENV_PREFIX}') && !(self.name in {_quote(RESERVED_ENV)})",
                f"the operator sets {RESERVED_ENV_PREFIX}* and {', '.join(RESERVED_ENV)} itself",
                ".name",
            ),
            ("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both", ".valueFrom"),
        )
    )

    name: str = Field(min_length=1, max_length=253)
    """Variable name."""
    value: str | None = None
    """Its value."""
    value_from: EnvVarSource | None = None
    """Or where its value comes from."""

    @model_validator(mode="after")
    def _reserved(self) -> EnvVar:
        if self.name.startswith(RESERVED_ENV_PREFIX) or self.name in RESERVED_ENV:
            raise ValueError(
                f"name: {self.name!r}: the operator sets {RESERVED_ENV_PREFIX}* and "
                f"{', '.join(RESERVED_ENV)} itself"
            )
        if self.value is not None and self.value_from is not None:
            raise ValueError("valueFrom: set value or valueFrom, not both")
        return self


class EnvFromSource(SpecModel):
    """Every key of a ConfigMap or Secret as environment variables: exactly one of the two."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "has(self.configMapRef) != has(self.secretRef)",
                "envFrom needs exactly one of configMapRef, secretRef",
            ),
        )
    )

    prefix: str | None = None
    """Prepended to every key."""
    config_map_ref: OptionalReference | None = None
    """The ConfigMap."""
    secret_ref: OptionalReference | None = None
    """The Secret."""

    @model_validator(mode="after")
    def _one(self) -> EnvFromSource:
        if (self.config_map_ref is None) == (self.secret_ref is None):
            raise ValueError("needs exactly one of configMapRef, secretRef")
        return self


# ------------------------------------------------------------------------------------------- volumes
class KeyToPath(SpecModel):
    """One key of a ConfigMap or Secret volume, as a file."""

    key: str = Field(min_length=1)
    """The key."""
    path: str = Field(min_length=1)
    """Relative path of the file in the volume."""
    mode: Int | None = Field(default=None, ge=0, le=0o777)
    """File mode bits."""


class PersistentVolumeClaimSource(SpecModel):
    """A PersistentVolumeClaim in the job's namespace (a model cache a pool shares, for instance)."""

    claim_name: str = Field(min_length=1, max_length=253)
    """The claim."""
    read_only: Bool | None = None
    """Mount it read-only."""


class ConfigMapSource(SpecModel):
    """A ConfigMap as files."""

    name: str = Field(min_length=1, max_length=253)
    """The ConfigMap."""
    items: list[KeyToPath] = Field(default_factory=list, max_length=_LIST)
    """Only these keys, at these paths (default: every key, as a file of its name)."""
    default_mode: Int | None = Field(default=None, ge=0, le=0o777)
    """File mode bits."""
    optional: Bool | None = None
    """Start the pod even when it is missing."""


class SecretSource(SpecModel):
    """A Secret as files."""

    secret_name: str = Field(min_length=1, max_length=253)
    """The Secret."""
    items: list[KeyToPath] = Field(default_factory=list, max_length=_LIST)
    """Only these keys, at these paths (default: every key, as a file of its name)."""
    default_mode: Int | None = Field(default=None, ge=0, le=0o777)
    """File mode bits."""
    optional: Bool | None = None
    """Start the pod even when it is missing."""


class EmptyDirSource(SpecModel):
    """Scratch space that lives as long as the pod."""

    medium: Literal["", "Memory"] | None = None
    """``Memory`` for a tmpfs."""
    size_limit: Quantity | None = None
    """Most it may hold, e.g. ``20Gi``."""


class HostPathSource(SpecModel):
    """A path on the node (node-local caches; needs an admin's blessing on most clusters)."""

    path: str = Field(min_length=1)
    """Path on the node."""
    type: Literal["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"] | None = None  # fmt: skip
    """What must be there (default: no check)."""


class CSISource(SpecModel):
    """An inline CSI volume (e.g. a secrets-store or an object-store FUSE driver)."""

    driver: str = Field(min_length=1)
    """CSI driver name."""
    read_only: Bool | None = None
    """Mount it read-only."""
    fs_type: str | None = None
    """Filesystem type, where the driver takes one."""
    volume_attributes: dict[str, str] = Field(default_factory=dict)
    """Driver-specific attributes."""
    node_publish_secret_ref: LocalObjectReference | None = None
    """Secret the driver is given."""


class NFSSource(SpecModel):
    """An NFS export."""

    server: str = Field(min_length=1)
    """Server host name or address."""
    path: str = Field(min_length=1)
    """Exported path."""
    read_only: Bool | None = None
    """Mount it read-only."""


_SOURCES = ("persistentVolumeClaim", "configMap", "secret", "emptyDir", "hostPath", "csi", "nfs")


class Volume(SpecModel):
    """A volume of the pod: a name and exactly one source."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "[" + ", ".join(f"has(self.{s})" for s in _SOURCES) + "].filter(x, x).size() == 1",
                f"a volume needs exactly one source: {', '.join(_SOURCES)}",
            ),
            (
                f"!(self.name in {_quote(RESERVED_VOLUMES)})",
                f"{', '.join(RESERVED_VOLUMES)} name the operator's own volumes",
                ".name",
            ),
        )
    )

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """Volume name, referenced by ``volumeMounts``."""
    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    """A PersistentVolumeClaim."""
    config_map: ConfigMapSource | None = None
    """A ConfigMap."""
    secret: SecretSource | None = None
    """A Secret."""
    empty_dir: EmptyDirSource | None = None
    """Scratch space."""
    host_path: HostPathSource | None = None
    """A path on the node."""
    csi: CSISource | None = None
    """An inline CSI volume."""
    nfs: NFSSource | None = None
    """An NFS export."""

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        if self.name in RESERVED_VOLUMES:
            raise ValueError(f"name: {', '.join(RESERVED_VOLUMES)} name the operator's own volumes")
        given = [self.persistent_volume_claim, self.config_map, self.secret, self.empty_dir, self.host_path]
        if sum(x is not None for x in [*given, self.csi, self.nfs]) != 1:
            raise ValueError(f"volume {self.name!r} needs exactly one source: {', '.join(_SOURCES)}")
        return self


class VolumeMount(SpecModel):
    """Where the Echo container sees one of the template's volumes."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                f"self.mountPath != '{CONFIG_MOUNT}' && !self.mountPath.startsWith('{CONFIG_MOUNT}/')",
                f"{CONFIG_MOUNT} holds the job manifest the operator mounts",
                ".mountPath",
            ),
        )
    )

    name: str = Field(min_length=1, max_length=63)
    """A volume of ``podTemplate.spec.volumes``."""
    mount_path: str = Field(pattern=r"^/", max_length=4096)
    """Absolute path in the container; ``/tmp``, ``/cache`` or ``/dev/shm`` replaces the operator's
    scratch volume there."""
    read_only: Bool | None = None
    """Mount it read-only."""
    sub_path: str | None = None
    """A path inside the volume to mount instead of its root."""

    @model_validator(mode="after")
    def _not_config(self) -> VolumeMount:
        path = self.mount_path.rstrip("/") or "/"
        if path == CONFIG_MOUNT or path.startswith(CONFIG_MOUNT + "/"):
            raise ValueError(f"mountPath: {CONFIG_MOUNT} holds the job manifest the operator mounts")
        return self


class ContainerPatch(SpecModel):
    """What is added to the Echo container (``worker`` in a pool, ``trainer`` for the trainer)."""

    name: str = Field(min_length=1)
    """``worker`` in an inference pool, ``trainer`` in the training swarm."""
    env: list[EnvVar] = Field(default_factory=list, max_length=256)
    """Environment variables, after the operator's own."""
    env_from: list[EnvFromSource] = Field(default_factory=list, max_length=_LIST)
    """ConfigMaps and Secrets whose keys become environment variables (the operator's own win)."""
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=_LIST)
    """Mounts of the template's volumes."""


# ------------------------------------------------------------------------------------------ affinity
class LabelSelectorRequirement(SpecModel):
    """One ``matchExpressions`` entry of a label selector."""

    key: str = Field(min_length=1)
    """Label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """How the label's value is compared with ``values``."""
    values: list[str] = Field(default_factory=list)
    """Values for ``In``/``NotIn``."""


class LabelSelector(SpecModel):
    """Pods by label: ``matchLabels`` and ``matchExpressions``, all of which must hold."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    """Labels the pods carry, with these values."""
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)
    """Label requirements."""


class PodAffinityTerm(SpecModel):
    """Pods (by label) in a topology domain (by node label)."""

    label_selector: LabelSelector | None = None
    """The pods."""
    topology_key: str = Field(min_length=1)
    """Node label naming the domain, e.g. ``kubernetes.io/hostname`` or ``topology.kubernetes.io/zone``."""
    namespaces: list[str] = Field(default_factory=list)
    """Namespaces of those pods (default: the job's)."""


class WeightedPodAffinityTerm(SpecModel):
    """A preference, with its weight."""

    weight: Int = Field(ge=1, le=100)
    """Added to a node's score when the term holds there."""
    pod_affinity_term: PodAffinityTerm
    """The term."""


class PodAffinity(SpecModel):
    """Pod (anti-)affinity, as core/v1 spells it."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(default_factory=list)
    """Terms that must hold where the pod is placed."""
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list
    )
    """Terms preferred, by weight."""


class NodeSelector(SpecModel):
    """Nodes, as terms any of which may hold."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1)
    """The terms (ORed)."""


class PreferredNodeTerm(SpecModel):
    """A weighted node preference."""

    weight: Int = Field(ge=1, le=100)
    """Added to a node's score when it matches ``preference``."""
    preference: NodeSelectorTerm
    """The nodes preferred."""


class NativeNodeAffinity(SpecModel):
    """Node affinity, as core/v1 spells it."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes the pod may run on."""
    preferred_during_scheduling_ignored_during_execution: list[PreferredNodeTerm] = Field(
        default_factory=list
    )
    """Nodes preferred, by weight."""


class PodTemplateAffinity(SpecModel):
    """Node affinity, pod affinity and pod anti-affinity (e.g. one GPU worker per node)."""

    node_affinity: NativeNodeAffinity | None = None
    """Node affinity (or the swarm's short ``affinity`` field, not both)."""
    pod_affinity: PodAffinity | None = None
    """Near which pods to run."""
    pod_anti_affinity: PodAffinity | None = None
    """Away from which pods to run."""


class TopologySpreadConstraint(SpecModel):
    """Spread the pods evenly over a topology (zones, nodes)."""

    max_skew: Int = Field(ge=1)
    """Largest allowed difference in matching pods between two domains."""
    topology_key: str = Field(min_length=1)
    """Node label naming the domain."""
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    """Wait for a place (``DoNotSchedule``) or place anyway, preferring less skew."""
    label_selector: LabelSelector | None = None
    """The pods counted (e.g. ``echorl.dev/pool: gpu``)."""
    min_domains: Int | None = Field(default=None, ge=1)
    """Domains counted as existing even when empty (``DoNotSchedule`` only)."""
    match_label_keys: list[str] = Field(default_factory=list)
    """Label keys whose values, taken from the incoming pod, narrow ``labelSelector``."""


# -------------------------------------------------------------------------------------------- the spec
class PodTemplatePodSpec(SpecModel):
    """What the template adds to the operator's pod spec."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "!has(self.containers) || self.containers.all(c, !has(c.volumeMounts) || "
                "c.volumeMounts.all(m, has(self.volumes) && self.volumes.exists(v, v.name == m.name)))",
                "every volumeMounts[].name must name one of podTemplate.spec.volumes",
                ".containers",
            ),
        )
    )

    priority_class_name: str | None = Field(default=None, max_length=253)
    """PriorityClass of the pods (preemption order)."""
    service_account_name: str | None = Field(default=None, max_length=253)
    """ServiceAccount the pods run as (cloud workload identity: IRSA, GKE or Azure workload identity)."""
    automount_service_account_token: Bool | None = None
    """Mount the ServiceAccount's API token (the operator's default is ``false``: no Echo process calls
    the Kubernetes API; workload-identity webhooks project their own token)."""
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list, max_length=_LIST)
    """Secrets for pulling the images from a private registry."""
    runtime_class_name: str | None = Field(default=None, max_length=253)
    """RuntimeClass of the pods (e.g. ``nvidia`` or a sandboxed runtime)."""
    affinity: PodTemplateAffinity | None = None
    """Node affinity, pod affinity and anti-affinity."""
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, max_length=_LIST
    )
    """How the pods spread over zones or nodes."""
    volumes: list[Volume] = Field(default_factory=list, max_length=_LIST)
    """Volumes, mounted by ``containers[].volumeMounts``."""
    containers: list[ContainerPatch] = Field(default_factory=list, max_length=1)
    """At most one entry, naming the Echo container: what is added to it."""

    @model_validator(mode="after")
    def _mounts_named(self) -> PodTemplatePodSpec:
        volumes = [v.name for v in self.volumes]
        twice = sorted({n for n in volumes if volumes.count(n) > 1})
        if twice:
            raise ValueError(f"volumes: {', '.join(twice)} named more than once")
        for c in self.containers:
            for m in c.volume_mounts:
                if m.name not in volumes:
                    raise ValueError(
                        f"containers: volumeMounts {m.name!r} must name one of podTemplate.spec.volumes"
                        f" ({', '.join(volumes) or 'none'})"
                    )
        return self


class PodTemplate(SpecModel):
    """Labels, annotations and pod-spec fields merged over the pods the operator builds."""

    metadata: PodTemplateMetadata = Field(default_factory=PodTemplateMetadata)
    """Labels and annotations."""
    spec: PodTemplatePodSpec = Field(default_factory=PodTemplatePodSpec)
    """Pod-spec fields, volumes, and what the Echo container gets."""


def container_rule(container: str) -> tuple[str, str, str]:
    """CEL rule of a swarm: its template's container entry names ``container``."""
    return (
        f"!has(self.podTemplate) || !has(self.podTemplate.spec) || !has(self.podTemplate.spec.containers) "
        f"|| self.podTemplate.spec.containers.all(c, c.name == '{container}')",
        f"podTemplate.spec.containers[].name must be {container!r}, the Echo container",
        ".podTemplate",
    )


def check_container(template: PodTemplate | None, container: str) -> None:
    """The Python side of :func:`container_rule`."""
    if template is None:
        return
    for c in template.spec.containers:
        if c.name != container:
            raise ValueError(
                f"podTemplate: spec.containers[].name must be {container!r}, the Echo container; got {c.name!r}"
            )


NODE_AFFINITY_RULE = (
    "!(has(self.affinity) && has(self.affinity.nodeAffinity) && has(self.podTemplate) "
    "&& has(self.podTemplate.spec) && has(self.podTemplate.spec.affinity) "
    "&& has(self.podTemplate.spec.affinity.nodeAffinity))",
    "node affinity is set here and in podTemplate.spec.affinity; keep one",
    ".affinity",
)
"""The API server's side of :meth:`TemplatedPlacement._one_node_affinity` (a rule of each swarm kind)."""


class TemplatedPlacement(Placement):
    """Placement plus the pod template: the base of both swarm kinds."""

    pod_template: PodTemplate | None = None
    """Labels, annotations, service account, priority class, volumes, env, pod (anti-)affinity and
    more, merged over the pods the operator builds (docs/operator.md, "Pod templates")."""

    @model_validator(mode="after")
    def _one_node_affinity(self) -> TemplatedPlacement:
        template = self.pod_template
        if (
            self.affinity is not None
            and self.affinity.node_affinity is not None
            and template is not None
            and template.spec.affinity is not None
            and template.spec.affinity.node_affinity is not None
        ):
            raise ValueError("affinity: node affinity is set here and in podTemplate.spec.affinity; keep one")
        return self
