"""Generate the RLTrainingJob CustomResourceDefinition from the pydantic models: the spec's (`model`) and the
status's (`status`, what the operator writes).

pydantic emits JSON Schema (2020-12); Kubernetes wants a *structural* OpenAPI v3.0 schema:
no $ref, no anyOf-with-null (use nullable), boolean exclusive bounds, no additionalProperties
beside properties. `structural()` does that conversion; cross-field rules stay in the model and
are enforced by the operator and `kuberl validate`.
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import GenerateJsonSchema

from .model import GROUP, KIND, PLURAL, SHORT_NAME, VERSION, JobSpec
from .status import JobStatus

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
    {"name": "Tokens/s", "type": "number", "jsonPath": ".status.tokensPerSec"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP = {"title", "$defs"}


def structural(node: Any, defs: dict[str, Any]) -> Any:
    """Convert a pydantic JSON-Schema node into a structural OpenAPI v3.0 schema node."""
    if isinstance(node, list):
        return [structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        return structural({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    if node.get("anyOf") is not None:
        return _nullable(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_keyword(key, value, node, defs))
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def _nullable(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """`anyOf: [X, null]` (pydantic's `X | None`) as X with `nullable: true`; no other anyOf is structural."""
    any_of = node["anyOf"]
    kept = [s for s in any_of if s.get("type") != "null"]
    if len(kept) != 1:
        raise ValueError(f"cannot express anyOf {any_of} structurally")
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    out = structural({**kept[0], **rest}, defs)
    out["nullable"] = True
    if rest.get("default") is None:
        out.pop("default", None)
    return out


def _keyword(key: str, value: Any, node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON-Schema keyword of `node` as the structural keywords it becomes (none where it is dropped)."""
    if key in _DROP or (key == "default" and value is None):
        return {}
    if key == "additionalProperties":  # a map's value schema is kept; `false` (extra="forbid") is not structural
        return {key: structural(value, defs)} if isinstance(value, dict) and "properties" not in node else {}
    if key == "const":
        return {"enum": [value]}
    if key in ("exclusiveMinimum", "exclusiveMaximum"):
        return {"minimum" if key == "exclusiveMinimum" else "maximum": value, key: True}
    if key == "properties":
        return {key: {name: structural(sub, defs) for name, sub in value.items()}}
    return {key: structural(value, defs)}


def spec_schema() -> dict[str, Any]:
    """The structural schema of `.spec`."""
    raw = JobSpec.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}))


class NoneOmitted(GenerateJsonSchema):
    """JSON Schema of a model dumped with ``exclude_none``: a field that is None is left out, never written as
    null, so an optional field's schema is its value's (no ``nullable``)."""

    def nullable_schema(self, schema: Any) -> dict[str, Any]:
        return self.generate_inner(schema["schema"])


def status_schema() -> dict[str, Any]:
    """The structural schema of `.status`: every field the operator writes (`kuberl.spec.status`) and nothing else,
    as a real API server prunes undeclared status fields."""
    raw = JobStatus.model_json_schema(by_alias=True, mode="serialization", schema_generator=NoneOmitted)
    return structural(raw, raw.get("$defs", {}))


def generate_crd() -> dict[str, Any]:
    """The full CustomResourceDefinition object for RLTrainingJob."""
    schema = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "plural": PLURAL, "singular": KIND.lower(), "shortNames": [SHORT_NAME],
                      "categories": ["kuberl"]},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


# YAML 1.1 readers (go-yaml in kubectl and helm) read these bare words as booleans: quote them.
_YAML11_BOOLS = {"y", "yes", "n", "no", "on", "off", "true", "false"}


def crd_yaml() -> str:
    """The CRD as YAML text (what `crds/` holds); strings such as `n` are quoted for YAML 1.1 readers."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def represent_str(dumper: yaml.SafeDumper, value: str):
        style = "'" if value.lower() in _YAML11_BOOLS else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, represent_str)
    header = "# Generated from kuberl.spec by `kuberl crd` (make crds). Do not edit by hand.\n"
    return header + yaml.dump(generate_crd(), Dumper=Dumper, sort_keys=False)
