"""values.schema.json: `helm template` refuses bad values, and says which key and why."""

from __future__ import annotations

import json

import pytest

from .render import CHART, Helm, HelmFailed

BAD = {
    "unknown key (typo)": ({"replicaCount": 2}, "additional properties 'replicaCount' not allowed"),
    "nested typo": ({"serviceMonitor": {"enable": True}}, "additional properties 'enable' not allowed"),
    "pull policy": ({"image": {"repository": "r", "pullPolicy": "Sometimes"}},
                    "'/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'"),
    "toggle as a string": ({"podMonitor": {"enabled": "yes"}}, "'/podMonitor/enabled': got string, want boolean"),
    "port out of range": ({"metrics": {"enabled": True, "port": 70000}}, "'/metrics/port': maximum"),
    "glob namespace": ({"watchNamespaces": ["team-*"]}, "'/watchNamespaces/0': 'team-*' does not match pattern"),
    "duplicate namespace": ({"watchNamespaces": ["a", "a"]}, "'/watchNamespaces'"),
    "writable root fs": ({"securityContext": {"readOnlyRootFilesystem": False}},
                         "'/securityContext/readOnlyRootFilesystem': value must be true"),
    "root user": ({"podSecurityContext": {"runAsNonRoot": False}},
                  "'/podSecurityContext/runAsNonRoot': value must be true"),
    "no requests": ({"resources": {"limits": {"memory": "1Gi"}, "requests": None}}, "missing property 'requests'"),
    "no memory request": ({"resources": {"requests": {"cpu": "100m", "memory": None}}}, "missing property 'memory'"),
    "bad quantity": ({"resources": {"requests": {"cpu": "lots", "memory": "1Gi"}}}, "'/resources/requests/cpu'"),
    "bad interval": ({"serviceMonitor": {"enabled": True, "interval": "30 seconds"}}, "'/serviceMonitor/interval'"),
    "release label": ({"podMonitor": {"enabled": True, "release": "a/b"}}, "'/podMonitor/release'"),
    "dashboard label value": ({"dashboard": {"enabled": True, "label": "grafana_dashboard", "labelValue": 1}},
                              "'/dashboard/labelValue': got number, want string"),
    "image tag": ({"image": {"repository": "r", "tag": "has space"}}, "'/image/tag'"),
    "unknown alert": ({"prometheusRule": {"enabled": True, "disabled": ["KuberlJobFialed"]}},
                      "'/prometheusRule/disabled/0': value must be one of"),
    "alert label name": ({"prometheusRule": {"enabled": True, "additionalAlertLabels": {"team-name": "ml"}}},
                         "invalid propertyName 'team-name'"),
}


@pytest.mark.parametrize("case", BAD)
def test_schema_rejects(helm: Helm, case: str) -> None:
    values, message = BAD[case]
    with pytest.raises(HelmFailed) as failed:
        helm.render(values)
    assert "values don't meet the specifications of the schema" in failed.value.stderr
    assert message in failed.value.stderr, failed.value.stderr


def test_schema_is_a_closed_draft7_schema() -> None:
    import jsonschema
    import yaml

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(defaults)
    assert set(schema["properties"]) - {"global"} == set(defaults), "every value is in the schema, and only those"
