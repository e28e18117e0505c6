"""The dashboard's targets as Grafana would query them from a test's Prometheus."""

from __future__ import annotations

from kuberl.metrics import PROM_FAMILIES
from tests.chart.dashboard import Target, dashboard, fill, metrics_in, targets

from .conftest import Scrape

STEP_S = 1.0  # the range query's resolution (Grafana's $__interval)
DASH = dashboard()


def source(target: Target) -> str:
    """"runtime" when every metric the target reads is the driver's, "operator" when any is the operator's."""
    names = {n for n, _ in metrics_in(target.expr)}
    assert names, f"{target}: no kuberl metric in {target.expr!r}"
    if any(n.startswith("kuberl_operator_") for n in names):
        return "operator"
    unknown = names - set(PROM_FAMILIES)
    assert not unknown, f"{target}: {sorted(unknown)} are neither the runtime's nor the operator's"
    return "runtime"


def for_agents(target: Target) -> bool:
    """Whether the target reads the families only a job with spec.environment serves (kuberl_env_*)."""
    return any(n.startswith("kuberl_env_") for n, _ in metrics_in(target.expr))


RUNTIME_TARGETS = [t for t in targets(DASH) if source(t) == "runtime" and not for_agents(t)]
AGENT_TARGETS = [t for t in targets(DASH) if for_agents(t)]
OPERATOR_TARGETS = [t for t in targets(DASH) if source(t) == "operator"]


def run_query(scrape: Scrape, target: Target) -> list[dict]:
    """The target's range query over the scrape's window, the dashboard's variables set to its job."""
    variables = {"namespace": scrape.namespace, "job": scrape.job}
    expr = fill(target.expr, variables, STEP_S, scrape.scrape_interval_s, scrape.end - scrape.start)
    return scrape.prom.query_range(expr, scrape.start, scrape.end, STEP_S)


def by_label(result: list[dict], label: str) -> dict[str, float]:
    """label value -> the largest value of that series over the window."""
    return {series["metric"][label]: max(float(v) for _, v in series["values"]) for series in result}


def panel_target(title: str, ref: str = "A") -> Target:
    found = [t for t in targets(DASH) if t.panel == title and t.ref == ref]
    assert found, f"no panel {title!r} with target {ref}"
    return found[0]


def no_data(scrape: Scrape, target: Target) -> str:
    return (f"{target} ({target.legend!r}) returned no data for namespace={scrape.namespace} job={scrape.job}: "
            f"{target.expr}")
