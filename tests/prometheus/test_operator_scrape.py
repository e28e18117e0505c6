"""The dashboard's operator panels (kuberl_operator_*) return data from a real Prometheus that scraped
the operator through the chart's ServiceMonitor.

Two sources of operator metrics:

- a real `kuberl operator` against the real control plane: tests/cluster/test_operator_scrape.py, beside
  the real-cluster suite's session fixtures (one control plane per session), with these helpers;
- the operator's own metrics code (``kuberl_operator.metrics.Metrics``, what `kuberl operator` serves),
  fed by this test with the statuses a reconcile writes for the quickstart (one critic restart) and
  timed reconciles, one in four failing. It checks the operator panels' PromQL and the ServiceMonitor
  against Prometheus' real evaluation; it does not check the reconciler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.render import NAMESPACE as RELEASE_NAMESPACE
from tests.chart.render import Helm, one

from .conftest import NAMESPACE, REPO, SCRAPE, Scrape
from .panels import OPERATOR_TARGETS, STEP_S, by_label, no_data, panel_target, run_query
from .server import Endpoint, Pod, Prometheus, free_port, service_monitor_scrape

JOB = "quickstart"


def operator_endpoint(helm: Helm, port: int) -> tuple[dict, Endpoint]:
    """The chart's ServiceMonitor and the endpoint of its metrics Service, for an operator serving on ``port``."""
    objects = helm.render({"serviceMonitor": {"enabled": True, "interval": SCRAPE, "scrapeTimeout": SCRAPE}})
    monitor, service, deployment = one(objects, "ServiceMonitor"), one(objects, "Service"), one(objects, "Deployment")
    template = deployment["spec"]["template"]
    pod = Pod(RELEASE_NAMESPACE, f"{deployment['metadata']['name']}-6c9f7d-q2x5z",
              template["spec"]["containers"][0]["name"], f"127.0.0.1:{port}", template["metadata"]["labels"])
    return monitor, Endpoint(service, pod, service["spec"]["ports"][0]["name"])


def scrape_for(prom: Prometheus, start: float, seconds: float) -> Scrape:
    """Let Prometheus scrape for ``seconds``, then describe the window."""
    time.sleep(seconds)
    prom.wait_for('count_over_time(up[1m]) >= 5', 30, "five scrapes of the operator")
    return Scrape(prom, JOB, NAMESPACE, start, time.time(), "", Path(prom.workdir))


@pytest.fixture(scope="module")
def registry_scrape(netns, promtool, helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    from kuberl.spec import load_manifest
    from kuberl_operator.metrics import Metrics

    spec = load_manifest(REPO / "examples" / "quickstart.yaml").spec
    metrics, port = Metrics(), free_port()
    server = metrics.serve(port, "127.0.0.1")
    roles = {r: {"desired": 1, "ready": 1, "restarts": 1 if r == "critic" else 0}
             for r in ("actor", "critic", "ref", "reward")}
    metrics.observe(NAMESPACE, JOB, {"phase": "Running", "roles": roles}, spec)
    metrics.cache_sizes = lambda: {"rltrainingjobs": 1, "rayclusters": 1}
    stop = threading.Event()

    def reconciles() -> None:
        n = 0
        while not stop.wait(0.25):
            n += 1
            metrics.request("patch", "rltrainingjobs/status", 200)  # what each reconcile sends, as the trace counts
            if n % 8 == 0:
                metrics.request("watch", "pods", 200)
            try:
                with metrics.reconcile():
                    if n % 4 == 0:
                        raise RuntimeError("an API call failed")
            except RuntimeError:
                pass

    worker = threading.Thread(target=reconciles, daemon=True)
    worker.start()
    monitor, endpoint = operator_endpoint(helm, port)
    prom = Prometheus(tmp_path_factory.mktemp("prometheus-operator"), [service_monitor_scrape(monitor, 0, endpoint)])
    try:
        yield scrape_for(prom, time.time(), 8.0)
    finally:
        stop.set()
        worker.join()
        prom.stop()
        server.shutdown()


def test_operator_panels_show_the_job(registry_scrape: Scrape) -> None:
    from kuberl.spec import load_manifest

    budget = load_manifest(REPO / "examples" / "quickstart.yaml").spec.roles.critic.max_restarts
    left = by_label(run_query(registry_scrape, panel_target("Restart budget left per role")), "role")
    assert left == {"actor": budget, "critic": budget - 1, "ref": budget, "reward": budget}, left
    running = run_query(registry_scrape, panel_target("Running jobs"))
    assert max(float(v) for _, v in running[0]["values"]) == 1
    errors = run_query(registry_scrape, panel_target("Reconcile errors"))
    assert max(float(v) for _, v in errors[0]["values"]) > 0, errors  # one reconcile in four failed


def test_service_monitor_keeps_the_jobs_labels(registry_scrape: Scrape) -> None:
    """honorLabels: the operator's `namespace`/`job` are the RLTrainingJob's, not the Service's."""
    s = registry_scrape
    series = s.prom.query_range("kuberl_operator_role_ready_replicas", s.start, s.end, STEP_S)
    assert {(x["metric"]["namespace"], x["metric"]["job"]) for x in series} == {(NAMESPACE, JOB)}
    info = s.prom.query_range("kuberl_build_info", s.start, s.end, STEP_S)
    assert [x["metric"]["component"] for x in info] == ["operator"], info
    assert info[0]["metric"]["namespace"] == RELEASE_NAMESPACE and info[0]["metric"]["service"].endswith("-metrics")


@pytest.mark.parametrize("target", OPERATOR_TARGETS, ids=str)
def test_operator_panel_returns_data(registry_scrape: Scrape, target) -> None:
    assert run_query(registry_scrape, target), no_data(registry_scrape, target)
