"""Every dashboard query returns data from a real Prometheus that scraped a real `kuberl run`.

Each target's PromQL, with the dashboard's variables filled in for the scraped job (namespace and
job, as Grafana substitutes them), runs as the range query Grafana would send for the run's window.
A target that returns nothing fails, naming its panel. Targets on the operator's families need a
real operator: tests/prometheus/test_operator_scrape.py.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.chart.dashboard import LABEL_VALUES, Target, fill, variable_queries

from .conftest import FAULT, Scrape
from .panels import AGENT_TARGETS, DASH, RUNTIME_TARGETS, STEP_S, by_label, no_data, panel_target, run_query


@pytest.mark.parametrize("target", RUNTIME_TARGETS, ids=str)
def test_panel_returns_data(quickstart_scrape: Scrape, target: Target) -> None:
    result = run_query(quickstart_scrape, target)
    assert result, no_data(quickstart_scrape, target)
    assert all(series["values"] for series in result), f"{target}: a series without points"


@pytest.mark.parametrize("target", AGENT_TARGETS, ids=str)
def test_environment_panel_returns_data_for_an_agent_job(agent_scrape: Scrape, target: Target) -> None:
    result = run_query(agent_scrape, target)
    assert result, no_data(agent_scrape, target)
    assert all(series["values"] for series in result), f"{target}: a series without points"


def test_an_agent_job_turns_two_turns_a_trajectory_on_the_dashboard(agent_scrape: Scrape) -> None:
    turns = by_label(run_query(agent_scrape, panel_target("Turns and failed trajectories")), "job")
    failed = by_label(run_query(agent_scrape, panel_target("Turns and failed trajectories", "B")), "job")
    assert turns == {agent_scrape.job: 2.0} and failed == {agent_scrape.job: 0.0}, (turns, failed)


def test_dashboard_variables_list_the_job(quickstart_scrape: Scrape) -> None:
    """The namespace and job pickers offer the scraped job (Grafana's label_values -> /api/v1/label/../values)."""
    s = quickstart_scrape
    chosen = {"namespace": s.namespace, "job": s.job}
    for name, query in variable_queries(DASH).items():
        m = LABEL_VALUES.match(query)
        assert m, f"variable {name}: {query!r} is not label_values(selector, label)"
        selector = fill(m.group(1), chosen, STEP_S, s.scrape_interval_s, s.end - s.start)
        values = s.prom.api(f"label/{m.group(2)}/values", **{"match[]": selector, "start": s.start, "end": s.end})
        assert chosen[name] in values, f"variable {name}: {query!r} offers {values}, not {chosen[name]!r}"


def test_restart_and_recovery_panels_show_the_injected_fault(quickstart_scrape: Scrape) -> None:
    faulted = FAULT.split(":")[0]
    restarts = by_label(run_query(quickstart_scrape, panel_target("Restarts per role", "B")), "role")
    assert restarts[faulted] == 1 and all(v == 0 for r, v in restarts.items() if r != faulted), restarts
    recovery = by_label(run_query(quickstart_scrape, panel_target("Recovery time per role")), "role")
    assert set(recovery) == {faulted} and recovery[faulted] > 0, recovery
    parts = run_query(quickstart_scrape, panel_target("Last recovery by part"))
    assert {s["metric"]["part"] for s in parts} == {"detect", "ready", "replay"}


def test_prometheus_scraped_the_driver_through_the_pod_monitor(quickstart_scrape: Scrape) -> None:
    """The PodMonitor's relabelling kept the driver target and named it for the pod's job; the runtime's
    own `job` label is kept beside it as exported_job."""
    s = quickstart_scrape
    up = s.prom.query_range("up", s.start, s.end, STEP_S)
    assert len(up) == 1, up
    healthy = sum(1 for _, v in up[0]["values"] if v == "1")
    assert healthy >= 5, f"only {healthy} successful scrapes of the driver: {up}"
    labels = s.prom.query_range(f'kuberl_step{{namespace="{s.namespace}"}}', s.start, s.end, STEP_S)[0]["metric"]
    assert labels["job"] == s.job and labels["kuberl_io_job"] == s.job and labels["container"] == "driver", labels
    assert labels["exported_job"] == s.job, labels
    steps = by_label(s.prom.query_range(f'kuberl_step{{job="{s.job}"}}', s.start, s.end, STEP_S), "job")
    assert steps[s.job] >= int(FAULT.split(":")[1]) + 1, steps  # it saw steps completed after the recovery


def test_the_runs_metrics_pass_promtool_check_metrics(quickstart_scrape: Scrape, promtool: str) -> None:
    """What the real run served, once its recovery series existed, through Prometheus' own linter."""
    proc = subprocess.run([promtool, "check", "metrics"], input=quickstart_scrape.exposition, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr
    assert "# TYPE kuberl_role_group_restarts_total counter" in quickstart_scrape.exposition
