"""The dashboard's operator panels (kuberl_operator_*) return data from a real Debian Prometheus that scraped
a real `kuberl operator` through the chart's ServiceMonitor: the real-cluster suite's operator (the chart
installed, the chart's token, every namespace) reconciling a job on kube-apiserver + KubeRay + kwok, with one
critic restart. (tests/prometheus/test_operator_scrape.py checks the same panels against the operator's
metrics code fed by hand; this is the real reconciler.)"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from localkube.api import NAMESPACES, RLTJ, Api

from kuberl.spec import validate_manifest
from tests.chart.render import Helm
from tests.prometheus.conftest import NAMESPACE, Scrape
from tests.prometheus.panels import OPERATOR_TARGETS, no_data, panel_target, run_query
from tests.prometheus.server import Prometheus, http_get, missing_binaries, service_monitor_scrape
from tests.prometheus.test_operator_scrape import JOB, operator_endpoint, scrape_for

from .faults import fail_pod
from .jobs import describe, manifest, pods_of, status
from .operator_process import OperatorProcess
from .waits import wait_for

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def real_operator_scrape(admin: Api, release: str, operator: OperatorProcess, helm: Helm,
                         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    """The real-cluster suite's `kuberl operator` (the chart installed, the chart's token, every namespace)
    reconciling a job in namespace team-a on kube-apiserver + KubeRay + kwok, with one critic restart;
    Prometheus scrapes it through the chart's ServiceMonitor."""
    if reason := missing_binaries():
        pytest.skip(reason)
    kube, op = admin, operator
    kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}}, namespace=None)
    ns = kube.in_namespace(NAMESPACE)
    monitor, endpoint = operator_endpoint(helm, op.metrics_port)
    work = tmp_path_factory.mktemp("prometheus-real-operator")
    prom = Prometheus(work, [service_monitor_scrape(monitor, 0, endpoint)])
    ctx = lambda: describe(ns, JOB) + op.tail(30)  # noqa: E731
    try:
        start = time.time()
        ns.create(RLTJ, manifest(JOB))
        wait_for(lambda: status(ns, JOB).get("phase") == "Running", 90, "phase Running", ctx)
        fail_pod(ns, pods_of(ns, JOB, "critic")[0]["metadata"]["name"], "exit")
        wait_for(lambda: status(ns, JOB).get("restarts") == 1, 60, "a critic restart", ctx)
        wait_for(lambda: status(ns, JOB).get("phase") == "Running", 120, "Running again", ctx)
        prom.wait_for(f'kuberl_operator_job_phase{{namespace="{NAMESPACE}", job="{JOB}"}}', 60,
                      "the operator's job series")
        assert http_get(op.metrics_url)
        yield scrape_for(prom, start, 5.0)
    finally:
        prom.stop()
        ns.delete(RLTJ, JOB)
        wait_for(lambda: ns.get(RLTJ, JOB) is None, 60, "the job deleted", ctx)
        kube.delete(NAMESPACES, NAMESPACE, namespace=None)


def test_the_real_operator_counts_the_restart(real_operator_scrape: Scrape) -> None:
    roles = validate_manifest(manifest(JOB)).spec.roles
    budgets = {r: roles.get(r).max_restarts - (r == "critic") for r in ("actor", "critic", "ref", "reward")}
    result = run_query(real_operator_scrape, panel_target("Restart budget left per role"))
    left = {series["metric"]["role"]: float(series["values"][-1][1]) for series in result}  # after the restart
    assert left == budgets, left


@pytest.mark.parametrize("target", OPERATOR_TARGETS, ids=str)
def test_operator_panel_returns_data(real_operator_scrape: Scrape, target) -> None:
    assert run_query(real_operator_scrape, target), no_data(real_operator_scrape, target)
