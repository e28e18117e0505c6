"""Where a role's pods may run on Kubernetes: the scheduling fields of ``spec.roles.<role>``.

Typed copies of the Kubernetes core/v1 shapes (Toleration, Affinity and what it holds), so that a bad
value is refused with its field path before anything is created, and the CRD's schema (generated from
these models) lets the API server check them too. Field names are Kubernetes' own.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from .base import DNS_SUBDOMAIN, Section

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set on each GPU node by NVIDIA's GPU feature discovery
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
LABEL_VALUE = re.compile(rf"^({_NAME})?$")
LABEL_NAME = re.compile(rf"^{_NAME}$")
DNS = re.compile(DNS_SUBDOMAIN)


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label key (``[prefix/]name``), or None."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS.match(prefix)):
        return f"label key {key!r}: the prefix before '/' must be a DNS subdomain such as example.com"
    if len(name) > 63 or not LABEL_NAME.match(name):
        return (f"label key {key!r}: the name must be at most 63 letters, digits, '-', '_' or '.', "
                f"starting and ending with a letter or digit")
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label value, or None."""
    if len(value) > 63 or not LABEL_VALUE.match(value):
        return (f"label value {value!r} must be at most 63 letters, digits, '-', '_' or '.', "
                f"starting and ending with a letter or digit")
    return None


def _check_key(key: str) -> str:
    if (problem := label_key_problem(key)) is not None:
        raise ValueError(problem)
    return key


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """A map of label keys to label values (a nodeSelector, a matchLabels)."""
    for key, value in labels.items():
        _check_key(key)
        if (problem := label_value_problem(value)) is not None:
            raise ValueError(f"{key}: {problem}")
    return labels


class Toleration(Section):
    """core/v1 Toleration: lets the role's pods onto nodes with a matching taint."""

    key: str | None = Field(None, description="Taint key; empty with operator Exists matches every taint.")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal: key and value match; Exists: key.")
    value: str | None = Field(None, description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches every effect.")
    toleration_seconds: int | None = Field(None, description="NoExecute: how long the pod stays once tainted.")

    _key = field_validator("key")(classmethod(lambda cls, v: v if v is None else _check_key(v)))

    @field_validator("toleration_seconds")
    @classmethod
    def _int64(cls, v: int | None) -> int | None:
        """Kubernetes stores it as an int64 (a bound in the CRD would not survive helm's float64 rendering)."""
        if v is not None and not -(2**63) <= v < 2**63:
            raise ValueError(f"{v} does not fit Kubernetes' int64: give a number of seconds such as 300")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value: remove value, or use operator Equal")
        if self.operator == "Equal" and not self.key:
            raise ValueError("operator Equal needs a key (an empty key matches everything only with Exists)")
        if self.value and (problem := label_value_problem(self.value)) is not None:
            raise ValueError(f"value: {problem}")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies to effect NoExecute only")
        return self


class NodeSelectorRequirement(Section):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)

    _key = field_validator("key")(classmethod(lambda cls, v: _check_key(v)))

    @model_validator(mode="after")
    def _values(self) -> NodeSelectorRequirement:
        n = len(self.values)
        if self.operator in ("In", "NotIn") and n == 0:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and n:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (n != 1 or not self.values[0].lstrip("-").isdigit()):
            raise ValueError(f"operator {self.operator} needs exactly one integer value")
        return self


class NodeSelectorTerm(Section):
    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list)


class NodeSelector(Section):
    node_selector_terms: list[NodeSelectorTerm] = Field(..., min_length=1, description="ORed terms.")


class PreferredSchedulingTerm(Section):
    weight: int = Field(..., ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(Section):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(default_factory=list)


class LabelSelectorRequirement(Section):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    _key = field_validator("key")(classmethod(lambda cls, v: _check_key(v)))

    @model_validator(mode="after")
    def _values(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class LabelSelector(Section):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    _labels = field_validator("match_labels")(classmethod(lambda cls, v: check_labels(v)))


class PodAffinityTerm(Section):
    label_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    namespaces: list[str] = Field(default_factory=list)
    topology_key: str = Field(..., min_length=1, description="Node label whose value defines 'together'.")
    match_label_keys: list[str] = Field(default_factory=list)
    mismatch_label_keys: list[str] = Field(default_factory=list)

    _key = field_validator("topology_key")(classmethod(lambda cls, v: _check_key(v)))


class WeightedPodAffinityTerm(Section):
    weight: int = Field(..., ge=1, le=100)
    pod_affinity_term: PodAffinityTerm


class PodAffinity(Section):
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(default_factory=list)
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(default_factory=list)


class Affinity(Section):
    """core/v1 Affinity: node affinity, and (anti-)affinity to other pods."""

    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


KUEUE_TOPOLOGY = "kueue.x-k8s.io/podset-{}-topology"  # Kueue's topology-aware scheduling, per pod set


class KueueTopology(Section):
    """Kueue's topology-aware scheduling for the role's pod set: the topology level (a node label of the cluster's
    Kueue Topology) that all of its pods must share (required) or should (preferred), or none (unconstrained).
    Rendered as Kueue's podset-*-topology annotations on the role's pod template; only a job Kueue admits uses
    them."""

    required: str | None = Field(None, description="Level all the role's pods must share, e.g. a rack's label.")
    preferred: str | None = Field(None, description="Level the role's pods should share, where the quota allows.")
    unconstrained: bool = Field(False, description="Topology-aware, without a level the pods must share.")

    _keys = field_validator("required", "preferred")(classmethod(lambda cls, v: v if v is None else _check_key(v)))

    @model_validator(mode="after")
    def _one(self) -> KueueTopology:
        if sum(x is not None and x is not False for x in (self.required, self.preferred, self.unconstrained)) != 1:
            raise ValueError("set exactly one of required, preferred or unconstrained")
        return self

    def annotations(self) -> dict[str, str]:
        """The pod template's annotations Kueue reads."""
        if self.unconstrained:
            return {KUEUE_TOPOLOGY.format("unconstrained"): "true"}
        kind, level = ("required", self.required) if self.required else ("preferred", self.preferred)
        return {KUEUE_TOPOLOGY.format(kind): str(level)}


class Scheduling(Section):
    """The scheduling fields of a role, rendered into its worker group's pod template on Kubernetes
    (docs/user-guide.md); a local run warns once that it ignores them."""

    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the role's pods need.")
    gpu_product: str | None = Field(
        None, description=f"Shorthand for nodeSelector {GPU_PRODUCT_LABEL}: the GPU model, as GPU feature "
                          f"discovery labels it (e.g. NVIDIA-H100-80GB-HBM3).")
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints the role's pods tolerate.")
    affinity: Affinity | None = Field(None, description="Node and pod (anti-)affinity of the role's pods.")
    priority_class_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN,
                                            description="PriorityClass of the role's pods.")
    runtime_class_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN,
                                           description="RuntimeClass of the role's pods (e.g. nvidia).")
    kueue_topology: KueueTopology | None = Field(
        None, description="Kueue's topology-aware scheduling of the role's pods (a job with a queue-name label).")

    _labels = field_validator("node_selector")(classmethod(lambda cls, v: check_labels(v)))

    @field_validator("gpu_product")
    @classmethod
    def _product(cls, v: str | None) -> str | None:
        if v is not None and (problem := label_value_problem(v)) is not None:
            raise ValueError(problem)
        return v

    def node_labels(self) -> dict[str, str]:
        """nodeSelector with gpuProduct folded in."""
        return {**self.node_selector, **({GPU_PRODUCT_LABEL: self.gpu_product} if self.gpu_product else {})}

    def constrained(self) -> list[str]:
        """The scheduling fields this role sets (YAML names), for a local run's warning."""
        fields = {"nodeSelector": self.node_selector, "gpuProduct": self.gpu_product, "tolerations": self.tolerations,
                  "affinity": self.affinity, "priorityClassName": self.priority_class_name,
                  "runtimeClassName": self.runtime_class_name, "kueueTopology": self.kueue_topology}
        return [name for name, value in fields.items() if value]
