"""Generate the RLTrainingJob CustomResourceDefinition from the pydantic spec model.

pydantic emits JSON Schema (2020-12); Kubernetes wants a *structural* OpenAPI v3.0 schema:
no $ref, no anyOf-with-null (use nullable), boolean exclusive bounds, no additionalProperties
beside properties. `structural()` does that conversion; cross-field rules stay in the model and
are enforced by the operator and `kuberl validate`.
"""

from __future__ import annotations

from typing import Any

from .model import GROUP, KIND, PLURAL, SHORT_NAME, VERSION, JobSpec

STATUS_SCHEMA: dict[str, Any] = {
    # Every field the operator writes is declared (and nothing else is kept): a real API server
    # prunes undeclared status fields, so a field missing here would silently vanish.
    "type": "object",
    "properties": {
        "phase": {"type": "string", "enum": ["Pending", "Provisioning", "Running", "Restarting", "Succeeded", "Failed",
                                             "Suspended"]},
        "phaseSince": {"type": "string", "format": "date-time",
                       "description": "When the job entered its phase: Restarting and Provisioning have deadlines "
                                      "(spec.resilience.restartTimeoutSeconds, startTimeoutSeconds)."},
        "step": {"type": "integer", "description": "Last training step the driver reported."},
        "totalSteps": {"type": "integer"},
        "tokensPerSec": {"type": "number"},
        "resumedFrom": {"type": "integer", "description": "The checkpoint step the running driver resumed from (after "
                                                          "a head failure or a lost driver pod)."},
        "stepsLost": {"type": "integer", "description": "Steps the driver before it had completed past that "
                                                        "checkpoint, trained again."},
        "restarts": {"type": "integer", "description": "Restarts summed over roles."},
        "rayCluster": {"type": "string", "description": "Name of the live RayCluster."},
        "rayClusterUID": {"type": "string",
                          "description": "UID of the live RayCluster: pods of another cluster never count."},
        "observedGeneration": {"type": "integer"},
        "message": {"type": "string"},
        "pendingChanges": {"type": "array", "items": {"type": "string"},
                           "description": "Spec fields changed since the running RayCluster and driver were made: "
                                          "applied by a suspend and resume."},
        "conditions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "status"],
                "properties": {
                    "type": {"type": "string"},
                    "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                    "reason": {"type": "string"},
                    "message": {"type": "string"},
                    "observedGeneration": {"type": "integer"},
                    "lastTransitionTime": {"type": "string", "format": "date-time"},
                },
            },
        },
        "head": {
            "type": "object",
            "description": "The Ray head pod: its failure restarts the whole Ray cluster (docs/operator.md).",
            "properties": {
                "ready": {"type": "boolean"},
                "restarts": {"type": "integer", "description": "Whole-cluster restarts after the head pod failed."},
                "lastFailure": {"type": "string"},
                "members": {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "Head pods seen alive, uid -> name."},
                "handledUIDs": {"type": "array", "items": {"type": "string"},
                                "description": "Head pods whose failure is already counted."},
            },
        },
        "roles": {
            "type": "object",
            "description": "Per role: health, restarts, worst GPU link, and the operator's pod bookkeeping.",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "desired": {"type": "integer", "description": "The role's pods (replicas, and its standby)."},
                    "replicas": {"type": "integer", "description": "Replicas the driver's WorkerGroup runs now, as "
                                                                "it reported (a live resize shows here once applied)."},
                    "colocatedWith": {"type": "string",
                                      "description": "spec.roles.<role>.colocateWith: the role whose pods run this "
                                                     "role's ranks (desired and ready count those pods)."},
                    "standby": {"type": "integer", "description": "Standby pods (a role's warm standby)."},
                    "ready": {"type": "integer"},
                    "restarts": {"type": "integer", "description": "max(podRestarts, the driver's count)."},
                    "podRestarts": {"type": "integer",
                                    "description": "Restarts the operator counted from pod failures."},
                    "lastFailure": {"type": "string",
                                    "description": "The newest failure: a pod's, or the one the driver reported."},
                    "driverFailure": {"type": "string", "description": "The newest failure the driver reported "
                                                                      "(a hang's diagnosis, a process that died)."},
                    "worstLink": {"type": "string", "description": "Worst GPU link inside the role's groups "
                                                                  "(NV#, PIX, PXB, PHB, NODE, SYS)."},
                    "unschedulable": {"type": "string",
                                      "description": "Why the role's pods wait for a node, in the scheduler's words."},
                    "unschedulableSince": {"type": "string", "description": "When the role began to wait for a node "
                                                                          "(startTimeoutSeconds bounds the wait)."},
                    "imageWaiting": {"type": "string", "description": "Why a pod of the role cannot start from its "
                                                                    "image (ImagePullBackOff, ErrImageNeverPull)."},
                    "members": {"type": "object", "additionalProperties": {"type": "string"},
                                "description": "Pods seen alive, uid -> name (a member that vanishes was deleted)."},
                    "handledUIDs": {"type": "array", "items": {"type": "string"},
                                    "description": "Pods whose failure is already counted."},
                },
            },
        },
    },
}

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
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return structural(merged, defs)
    any_of = node.get("anyOf")
    if any_of is not None:
        kept = [s for s in any_of if s.get("type") != "null"]
        if len(kept) != 1:
            raise ValueError(f"cannot express anyOf {any_of} structurally")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        out = structural({**kept[0], **rest}, defs)
        out["nullable"] = True
        out.pop("default", None) if rest.get("default") is None else None
        return out
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "additionalProperties":  # a map's value schema is kept; `false` (extra="forbid") is not structural
            if isinstance(value, dict) and "properties" not in node:
                out[key] = structural(value, defs)
            continue
        if key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "default" and value is None:
            continue
        else:
            out[key] = structural(value, defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def spec_schema() -> dict[str, Any]:
    """The structural schema of `.spec`."""
    raw = JobSpec.model_json_schema(by_alias=True, mode="validation")
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
            "status": STATUS_SCHEMA,
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
