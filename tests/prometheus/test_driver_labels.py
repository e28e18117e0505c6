"""A driver's series belong to the job whose pod was scraped, whatever its code labels them: a real
Prometheus scrapes, through the chart's PodMonitor, a "driver" of job `attacker` that serves series
labelled with another job and namespace (docs/security.md, "User code in the driver")."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.chart.render import Helm, one

from .conftest import NAMESPACE, SCRAPE, driver_pod
from .server import Prometheus, pod_monitor_scrape

FORGED = b'# TYPE kuberl_step gauge\nkuberl_step{job="victim",namespace="team-b"} 7\n'


class Forger(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(FORGED)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def forged(netns, promtool, helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Forger)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    values = {"podMonitor": {"enabled": True, "interval": SCRAPE, "scrapeTimeout": SCRAPE, "driver": {"port": port}}}
    monitor = one(helm.render(values), "PodMonitor")
    pod = driver_pod("attacker", port)
    pod = dataclasses.replace(pod, labels={**pod.labels, "kuberl.io/job": "attacker"})  # its job's pod
    prom = Prometheus(tmp_path_factory.mktemp("prometheus-forged"), [pod_monitor_scrape(monitor, 0, pod)])
    try:
        prom.wait_for("sum_over_time(up[1m]) >= 2", 30, "two successful scrapes of the forging driver")
        yield prom
    finally:
        prom.stop()
        server.shutdown()
        server.server_close()


def test_a_driver_cannot_report_for_another_job(forged: Prometheus) -> None:
    series = forged.query("kuberl_step", at=time.time())
    assert len(series) == 1, series
    labels = series[0]["metric"]
    assert (labels["job"], labels["namespace"]) == ("attacker", NAMESPACE), labels  # where it was scraped
    assert (labels["exported_job"], labels["exported_namespace"]) == ("victim", "team-b"), labels  # what it said
    assert forged.query('kuberl_step{job="victim"}', at=time.time()) == []
