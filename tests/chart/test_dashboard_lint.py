"""The dashboard passes our check of Grafana's dashboard-linter rules (tests/chart/dashboard_lint.py),
with only the exclusions its .lint file gives a one-line reason for, and each check catches what it
is for on a dashboard broken on purpose."""

from __future__ import annotations

import copy
import shutil

import pytest

from .dashboard import DASHBOARD, dashboard
from .dashboard_lint import RULES, UPSTREAM_RULES, Config, lint

CONFIG = Config.load(DASHBOARD.with_name(".lint"))


@pytest.fixture(scope="module", autouse=True)
def needs_promtool() -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed (the PromQL rules use Prometheus' parser): `make prometheus`")


def test_dashboard_passes_every_rule() -> None:
    failing, _ = lint(dashboard(), CONFIG)
    assert not failing, "\n".join(f"{v.rule}: panel {v.panel!r} target {v.target}: {v.message}" for v in failing)


def test_every_exclusion_has_a_one_line_reason_and_is_needed() -> None:
    _, excluded = lint(dashboard(), CONFIG)
    used = {v.rule for v in excluded}
    for rule, ex in CONFIG.exclusions.items():
        reason = ex.get("reason", "")
        assert reason.strip() and "\n" not in reason.strip(), f"{rule}: needs a one-line reason"
        assert rule in UPSTREAM_RULES, f"{rule}: not a rule of the linter"
        if rule in RULES:
            assert rule in used, f"{rule}: excluded, but the dashboard passes it: drop the exclusion"
        for entry in ex.get("entries", []):
            assert any(v.rule == rule and v.panel == entry["panel"] for v in excluded), f"{rule}: {entry} unused"


def test_every_rule_of_the_linter_is_checked_or_excluded_with_a_reason() -> None:
    for rule in UPSTREAM_RULES:
        assert rule in RULES or rule in CONFIG.exclusions, f"{rule}: neither checked nor excluded with a reason"
    assert set(RULES) <= set(UPSTREAM_RULES)


def broken() -> dict:
    """The dashboard with one mistake for every rule."""
    dash = copy.deepcopy(dashboard())
    dash["editable"] = True
    variables = dash["templating"]["list"]
    variables.append({**variables[0], "name": "ds2"})
    for v in variables:
        if v["name"] == "job":
            v.update(allValue=".*", multi=False, refresh=1, label="RLTrainingJob")
        if v["name"] == "namespace":
            v["query"] = {"query": 'label_values(kuberl_step{namespace=~"$namespace", , namespace)', "refId": "ns"}
            v["multi"] = False
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    panels[0]["description"] = ""
    panels[1]["fieldConfig"]["defaults"]["unit"] = "tokens/s"
    panels[2]["targets"] = []
    panels[3]["datasource"] = {"type": "prometheus", "uid": "my-prometheus"}
    panels[4]["targets"][0]["expr"] = "sum(rate(kuberl_operator_reconcile_errors_total[5m]))"
    panels[5]["targets"][0]["expr"] = 'sum(kuberl_operator_role_restarts_total{namespace=~"$namespace", job=~"$job"}'
    panels[6]["targets"][0]["expr"] = 'max(kuberl_reward_mean{job=~"$job"})'
    panels[7]["targets"][0]["expr"] = 'max(kuberl_mfu_ratio{namespace=~"$namespace"})'
    panels[8]["targets"][0]["expr"] = 'sum(kuberl_role_group_restarts_total{namespace=~"$namespace", job=~"$job"})'
    return dash


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_check_catches_its_mistake(rule: str) -> None:
    failing, _ = lint(broken(), Config({}, CONFIG.settings))
    assert any(v.rule == rule for v in failing), f"{rule}: the broken dashboard passed it"
