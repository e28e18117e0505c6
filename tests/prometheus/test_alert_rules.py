"""The chart's alerts (charts/kuberl/files/alerts.yaml) through Prometheus' own tools: `promtool check
rules`, `promtool test rules` with a firing and a silent case for every alert, and a real Prometheus
evaluating them against a real run's series without an error."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from .conftest import ALERTS, Scrape

CASES = Path(__file__).with_name("alerts-test.yaml")


def alert_names() -> list[str]:
    return [r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def test_rules_pass_promtool_check_rules(promtool: str) -> None:
    proc = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in proc.stdout, proc.stdout


def test_rules_pass_promtool_test_rules(promtool: str) -> None:
    proc = subprocess.run([promtool, "test", "rules", CASES.name], capture_output=True, text=True, timeout=120,
                          cwd=CASES.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases = yaml.safe_load(CASES.read_text())
    assert [str((CASES.parent / f).resolve()) for f in cases["rule_files"]] == [str(ALERTS)]
    fires: dict[str, list[str]] = {}
    silent: dict[str, list[str]] = {}
    for case in cases["tests"]:
        checks: dict[str, list[bool]] = {}
        for check in case.get("alert_rule_test", []):
            checks.setdefault(check["alertname"], []).append(bool(check["exp_alerts"]))
        for alert, fired in checks.items():
            (fires if any(fired) else silent).setdefault(alert, []).append(case["name"])
    for alert in alert_names():
        assert alert in fires, f"{alert}: no promtool case fires it"
        assert alert in silent, f"{alert}: no promtool case shows it silent on a healthy series"
    assert set(fires) | set(silent) <= set(alert_names()), "a case names an alert the rules do not have"


def test_real_prometheus_evaluates_every_rule_on_a_real_run(quickstart_scrape: Scrape) -> None:
    """Loaded into the Prometheus that scraped the quickstart (one injected fault): every rule evaluates
    without an error, and none fires for that healthy run."""
    groups = quickstart_scrape.prom.api("rules", type="alert")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert sorted(rules) == sorted(alert_names())
    for name, r in rules.items():
        assert r["health"] == "ok" and not r.get("lastError"), f"{name}: {r.get('lastError')}"
        assert r["state"] == "inactive" and not r["alerts"], f"{name} fired on a healthy run: {r['alerts']}"
