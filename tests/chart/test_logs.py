"""The operator's Deployment switches on JSON logs (kopf's and the operator's), which log collectors parse."""

from __future__ import annotations

from .render import Helm, one


def test_the_operator_logs_json_lines(helm: Helm) -> None:
    container = one(helm.render({}), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "KUBERL_LOG_FORMAT", "value": "json"} in container["env"]
