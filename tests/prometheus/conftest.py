"""A real Prometheus scraping a real `kuberl run` of the quickstart, through the chart's PodMonitor.

One run per session (Ray and the tiny model take about a minute to start on 2 cores): a few steps
with the critic killed at step 2, so restart and recovery series exist, scraped every second. The panels of the
environment families (spec.environment) read a second, short run of examples/agent.yaml.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.chart.render import Helm, one

from .server import Pod, Prometheus, free_port, http_get, missing_binaries, pod_monitor_scrape

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "charts" / "kuberl" / "files" / "alerts.yaml"
NAMESPACE = "team-a"  # where the job's pods would run; the PodMonitor's discovery labels say so
STEPS, FAULT = 20, "critic:2"  # steps after the recovery last seconds: a 1 s scrape sees them (6 was seen to miss)
SCRAPE = "1s"
AGENT_STEPS = 8  # examples/agent.yaml: about 2 s a step in-process


@pytest.fixture(scope="session")
def promtool() -> str:
    reason = missing_binaries()
    if reason:
        pytest.skip(reason)
    return "promtool"


@dataclass
class Scrape:
    """What one scraped run left behind."""

    prom: Prometheus
    job: str
    namespace: str
    start: float  # unix seconds: before the run started
    end: float  # unix seconds: after its last sample was scraped
    exposition: str  # the driver's /metrics text once recovery series existed
    out: Path
    scrape_interval_s: float = 1.0


def driver_pod(job_name: str, port: int, manifest: Path = REPO / "examples" / "quickstart.yaml") -> Pod:
    """The driver pod the operator would create for `manifest`'s job (its labels and container name), named for
    `job_name`."""
    from kuberl.spec import load_manifest
    from kuberl_operator import builders, names

    job = load_manifest(manifest)
    template = builders.driver_job(job, builders.BuildOptions(namespace=NAMESPACE))["spec"]["template"]
    return Pod(NAMESPACE, f"{names.driver(job_name)}-x7k2p", template["spec"]["containers"][0]["name"],
               f"127.0.0.1:{port}", template["metadata"]["labels"])


def wait_for_text(url: str, needle: str, proc: subprocess.Popen, timeout: float) -> str:
    """Poll a /metrics endpoint until its text contains ``needle`` (or the process ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            text = http_get(url, timeout=2.0)
            if needle in text:
                return text
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never served {needle!r} (run exit code {proc.poll()})")


def scraped_run(helm: Helm, work: Path, manifest: Path, args: list[str], needle: str) -> Iterator[Scrape]:
    """`kuberl run manifest --out work/run *args` scraped by a Prometheus through the chart's PodMonitor, until the
    run ends; its /metrics text is kept once it serves `needle`."""
    port = free_port()
    values = {"podMonitor": {"enabled": True, "interval": SCRAPE, "scrapeTimeout": SCRAPE, "driver": {"port": port}}}
    monitor = one(helm.render(values), "PodMonitor")
    job = yaml.safe_load(manifest.read_text())["metadata"]["name"]
    prom = Prometheus(work, [pod_monitor_scrape(monitor, 0, driver_pod(job, port, manifest))], [ALERTS])
    out = work / "run"
    start = time.time()
    cmd = [sys.executable, "-m", "kuberl.cli", "run", str(manifest), "--out", str(out), *args, "--metrics-port",
           str(port), "--no-progress"]
    log = (work / "run.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        exposition = wait_for_text(f"http://127.0.0.1:{port}/metrics", needle, proc, 600)
        assert proc.wait(timeout=600) == 0, (work / "run.log").read_text()[-4000:]
        end = time.time()
        yield Scrape(prom, job, NAMESPACE, start, end, exposition, out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        prom.stop()


@pytest.fixture(scope="session")
def quickstart_scrape(netns, promtool, helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    yield from scraped_run(helm, tmp_path_factory.mktemp("prometheus"), REPO / "examples" / "quickstart.yaml",
                           ["--steps", str(STEPS), "--fault", FAULT], "kuberl_recovery_seconds")


@pytest.fixture(scope="session")
def agent_scrape(netns, promtool, helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    """examples/agent.yaml (spec.environment) for the panels of its families, on the in-process backend."""
    yield from scraped_run(helm, tmp_path_factory.mktemp("prometheus-agent"), REPO / "examples" / "agent.yaml",
                           ["--steps", str(AGENT_STEPS), "--backend", "local"], "kuberl_env_turns_per_trajectory")
