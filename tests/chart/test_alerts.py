"""The chart's PrometheusRule: behind its own toggle, files/alerts.yaml verbatim, with the chart's
extra alert labels and disabled alerts, and every rendered rule passing `promtool check rules`."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .render import CHART, Helm, by_kind, one

ALERTS = CHART / "files" / "alerts.yaml"


def rules_file() -> dict:
    return yaml.safe_load(ALERTS.read_text())


def alert_names() -> list[str]:
    return [r["alert"] for g in rules_file()["groups"] for r in g["rules"]]


def rendered_rules(objects: list[dict]) -> dict[str, dict]:
    rule = one(objects, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_off_by_default_and_on_by_its_own_toggle(helm: Helm) -> None:
    assert not by_kind(helm.render(), "PrometheusRule")
    objects = helm.render({"prometheusRule": {"enabled": True}})
    assert len(by_kind(objects, "PrometheusRule")) == 1
    assert not by_kind(objects, "ServiceMonitor") and not by_kind(objects, "PodMonitor")


def test_rendered_rules_are_the_rules_file(helm: Helm) -> None:
    """One source: the PrometheusRule's groups are files/alerts.yaml, rule for rule."""
    rule = one(helm.render({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    assert rule["spec"]["groups"] == rules_file()["groups"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_extra_labels_and_disabled_alerts(helm: Helm) -> None:
    values = {"prometheusRule": {"enabled": True, "release": "", "labels": {"team": "ml"},
                                 "additionalAlertLabels": {"team": "ml", "severity": "page"},
                                 "disabled": ["KuberlTrainThroughputDropped", "KuberlOperatorReconcileErrors",
                                              "KuberlOperatorApiRequestsHigh"]}}
    objects = helm.render(values)
    rule = one(objects, "PrometheusRule")
    assert "release" not in rule["metadata"]["labels"] and rule["metadata"]["labels"]["team"] == "ml"
    got = rendered_rules(objects)
    assert set(got) == set(alert_names()) - {"KuberlTrainThroughputDropped", "KuberlOperatorReconcileErrors",
                                             "KuberlOperatorApiRequestsHigh"}
    assert [g["name"] for g in rule["spec"]["groups"]] == ["kuberl.jobs"]  # an emptied group is left out
    source = {r["alert"]: r for g in rules_file()["groups"] for r in g["rules"]}
    for name, r in got.items():
        assert r["labels"] == {"team": "ml", **source[name]["labels"]}, name  # the alert's severity wins
        assert {k: v for k, v in r.items() if k != "labels"} == {k: v for k, v in source[name].items() if k != "labels"}


def test_schema_lists_exactly_the_alerts() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["prometheusRule"]["properties"]["disabled"]["items"]["enum"] == alert_names()


def test_every_alert_carries_severity_summary_and_description() -> None:
    for group in rules_file()["groups"]:
        for r in group["rules"]:
            assert r["labels"]["severity"] in {"warning", "critical"}, r["alert"]
            assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
            assert r["alert"].startswith("Kuberl"), r["alert"]


def test_rendered_rules_pass_promtool_check_rules(helm: Helm, tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed: `make prometheus` installs Debian's prometheus")
    rule = one(helm.render({"prometheusRule": {"enabled": True, "additionalAlertLabels": {"team": "ml"}}}),
               "PrometheusRule")
    path = tmp_path / "rendered-rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in proc.stdout, proc.stdout
