"""Validate objects against real schemas: Kubernetes' own, KubeRay's CRD, and our generated CRD.

- Core kinds go through ``kubernetes_validate`` (strict: unknown fields are errors).
- Custom resources go through their CRD's ``openAPIV3Schema`` (OpenAPI 3.0 is JSON Schema draft 4
  plus ``nullable``), plus the check a real API server makes silently: fields that the structural
  schema does not know would be pruned, so for us they are errors. Their ``metadata`` is checked as
  an ObjectMeta by ``kubernetes_validate``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

K8S_VERSION = "1.33"
# resource.k8s.io/v1 (DRA, GA) is served from Kubernetes 1.34; kubernetes-validate ships its schemas
# from 1.34 on (1.33 has only the v1beta1/v1beta2 ResourceClaimTemplate). spec.placement.mode dra
# needs such a cluster anyway.
DRA_K8S_VERSION = "1.34"
DRA_KINDS = {("resource.k8s.io/v1", "ResourceClaimTemplate")}
CORE_KINDS = {
    ("v1", "ConfigMap"), ("v1", "Secret"), ("v1", "ServiceAccount"), ("v1", "Pod"), ("v1", "Event"),
    ("v1", "Namespace"), ("batch/v1", "Job"),
    ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
}


def draft4(node: Any) -> Any:
    """OpenAPI 3.0 schema -> JSON Schema draft 4: ``nullable`` becomes a ``null`` type."""
    if isinstance(node, list):
        return [draft4(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: draft4(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields a structural schema would prune: not in ``properties`` and not preserved."""
    problems: list[str] = []
    if isinstance(obj, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            where = f"{path}.{key}" if path else key
            if props is not None and key in props:
                problems += unknown_fields(value, props[key], where)
            elif isinstance(extra, dict):
                problems += unknown_fields(value, extra, where)
            elif props is not None and not schema.get("x-kubernetes-preserve-unknown-fields") and not extra:
                problems.append(f"{where}: unknown field (a real API server would prune it)")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            problems += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return problems


def object_meta_problems(meta: Any) -> list[str]:
    """Check a custom resource's metadata as an ObjectMeta (kubernetes_validate has no CR schemas)."""
    carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    try:
        kubernetes_validate.validate(carrier, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(str(p) for p in exc.path)}: {exc.message}"]
    return []


class CrdSchema:
    """One served version of a CRD, ready to check objects."""

    def __init__(self, crd: dict[str, Any], version: str):
        served = [v for v in crd["spec"]["versions"] if v["name"] == version]
        if not served:
            raise ValueError(f"{crd['metadata']['name']} has no version {version}")
        self.schema = served[0]["schema"]["openAPIV3Schema"]
        self.validator = jsonschema.Draft4Validator(draft4(self.schema))

    def problems(self, obj: dict[str, Any]) -> list[str]:
        found = [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
                 for e in self.validator.iter_errors(obj)]
        return found + unknown_fields(obj, self.schema) + object_meta_problems(obj.get("metadata", {}))


def core_problems(obj: dict[str, Any], version: str = K8S_VERSION) -> list[str]:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(str(p) for p in exc.path) or '(root)'}: {exc.message}"]
    return []


def make_validator(kuberay_dir: Path) -> Callable[[dict[str, Any]], list[str]]:
    """A validator for every kind the operator (or a test posing as KubeRay) writes."""
    from kuberl.spec import generate_crd

    raycluster = CrdSchema(yaml.safe_load((kuberay_dir / "ray.io_rayclusters.yaml").read_text()), "v1")
    rltj = CrdSchema(generate_crd(), "v1alpha1")
    custom = {("ray.io/v1", "RayCluster"): raycluster, ("kuberl.io/v1alpha1", "RLTrainingJob"): rltj}

    def validate(obj: dict[str, Any]) -> list[str]:
        key = (obj.get("apiVersion"), obj.get("kind"))
        if key in custom:
            return custom[key].problems(obj)
        if key in CORE_KINDS:
            return core_problems(obj)
        if key in DRA_KINDS:
            return core_problems(obj, DRA_K8S_VERSION)
        return [f"no schema for {key[0]}/{key[1]}: the test server accepts only known kinds"]

    return validate
