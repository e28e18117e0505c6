"""Per-role failures in pods, for real: one training job on the real node, hit four times in turn.

The job is the quickstart with a checkpoint claim (a hostPath volume of the node, `localkube.volumes`), so that
every pod sees the per-step snapshots and a restart loses no completed step. The cases, each once the one
before has recovered: the critic's pod deleted; the critic's Ray worker process killed inside its container;
that process OOM-killed by the kernel under the container's memory limit; the actor's pod deleted. After each,
only the failed role's pod is replaced (none for a process: the runtime makes the role's Ray actor anew in the
same pod), the recovery record names the role with `steps_lost` 0, the status and one Event count it, and the
job completes. The time from the failure to the next completed step is printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from localkube import volumes

from kuberl.spec.contract import PROGRESS_KEY, ProgressDocument
from kuberl_operator import names
from tests.chart.dashboard import Target, targets
from tests.chart.render import Helm, one
from tests.cluster.waits import wait_for
from tests.prometheus.conftest import ALERTS, SCRAPE, Scrape
from tests.prometheus.panels import DASH, for_agents, no_data, run_query
from tests.prometheus.server import (
    Prometheus,
    endpoint_targets,
    missing_binaries,
    pod_monitor_discovery,
    pod_targets,
    service_monitor_discovery,
)

from .conftest import Kubectl
from .test_real_pods import QUICKSTART, ROLES, describe, events_of, others_gone, pods_by_role, running, status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]
JOB, CLAIM = "failures", "failures-checkpoints"

# Inside a role's container: the pid of its Ray worker (the actor process, `ray::<Role>Worker`; Ray's agents and idle
# workers aside).
FIND_WORKER = """
import os
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')[0].decode()
    except OSError:
        continue
    if cmd.startswith('ray::') and 'Worker' in cmd and 'IDLE' not in cmd:
        print(pid, cmd)
"""

# Inside the critic's container: make its worker the kernel's choice (oom_score_adj 1000; raising it needs no
# privilege), then fill memory until the container's memory cgroup counts an OOM kill (its limit reached: the kernel
# kills the worker), free it, and wait for the worker to be gone. The filling is done by children of 128 MiB each:
# the kernel picks the largest rss + oom_score_adj share, and every process of a Burstable pod has an adj near 1000
# already (the kubelet's 1000 less the pod's memory request as a share of the node's), so one filler holding GiBs
# outranked the worker and was killed instead (ci-local 2026-12-05).
OOM = """
import os, signal, sys, time
pid = int(sys.argv[1])
def kills():
    for path in ('/sys/fs/cgroup/memory.events', '/sys/fs/cgroup/memory/memory.oom_control'):
        try:
            for line in open(path):
                if line.startswith('oom_kill '):
                    return int(line.split()[1])
        except OSError:
            pass
    return 0
before = kills()
open(f'/proc/{pid}/oom_score_adj', 'w').write('1000')
children = []
while os.path.exists(f'/proc/{pid}') and kills() == before and len(children) < 64:
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        hog = [b'\\1' * (32 << 20) for _ in range(4)]
        os.write(w, b'x')
        time.sleep(600)
        os._exit(0)
    os.close(w)
    os.read(r, 1)  # filled, or killed on the way (end of file)
    os.close(r)
    children.append(child)
for child in children:
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
deadline = time.monotonic() + 30
while os.path.exists(f'/proc/{pid}') and time.monotonic() < deadline:
    time.sleep(0.1)
print('worker gone' if not os.path.exists(f'/proc/{pid}') else 'worker alive', len(children) * 128, 'MiB',
      kills() - before, 'kills')
"""


def worker_pid(k: Kubectl, pod: str) -> int:
    out = k.exec(pod, "python3", "-c", FIND_WORKER)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert out.returncode == 0 and len(lines) == 1, (out.stdout, out.stderr)
    return int(lines[0].split()[0])


@dataclass
class Case:
    name: str
    role: str
    pod_replaced: bool
    inject: Callable[[Kubectl, dict[str, Any]], None]  # (kubectl, the role's pod)


def delete_pod(k: Kubectl, pod: dict[str, Any]) -> None:
    k.delete("pod", pod["metadata"]["name"])


def kill_worker(k: Kubectl, pod: dict[str, Any]) -> None:
    name = pod["metadata"]["name"]
    out = k.exec(name, "sh", "-c", f"kill -9 {worker_pid(k, name)}")
    assert out.returncode == 0, out.stderr


def oom_kill_worker(k: Kubectl, pod: dict[str, Any]) -> None:
    name = pod["metadata"]["name"]
    out = k.exec(name, "python3", "-c", OOM, str(worker_pid(k, name)))
    assert "worker gone" in out.stdout, (out.returncode, out.stdout, out.stderr)


CASES = (
    Case("critic pod deleted", "critic", True, delete_pod),
    Case("critic's Ray worker killed", "critic", False, kill_worker),
    Case("critic's Ray worker OOM-killed", "critic", False, oom_kill_worker),
    Case("actor pod deleted", "actor", True, delete_pod),
)
FIRST_AT, EVERY = 8, 12  # a case starts at step FIRST_AT, the next once its recovery is EVERY steps behind
# 0.2 to 0.3 s a step here (status lags, pods start meanwhile): under Kubernetes' 30 s grace period the last case
# was seen to start as late as step 290; with the role pods' 5 s (WORKER_GRACE_S) at step 116 (2026-12-06)
STEPS = 300
TRAINS_ON = 10  # steps the standby job runs after its take-over before the test deletes it


def uids(k: Kubectl) -> dict[str, str]:
    """uid -> role (or component) of the job's live pods."""
    return {p["metadata"]["uid"]: role for role, ps in pods_by_role(k, JOB).items() for p in ps}


def recoveries(metrics: Path) -> list[dict[str, Any]]:
    if not metrics.is_file():
        return []
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [r for row in rows for r in row.get("recoveries", [])]


def role_status(k: Kubectl, role: str) -> dict[str, Any]:
    return status(k, JOB).get("roles", {}).get(role, {})


def event_count(k: Kubectl, reason: str, role: str) -> int:
    return sum(1 for e in events_of(k, JOB, reason) if e["message"].startswith(f"role {role}"))


def job_folder(k: Kubectl, claim: str, job: str) -> Path:
    """The job's folder on the host: its claim's volume, the subPath its pods mount (`names.claim_folder`)."""
    pvc = k.get("pvc", claim)
    return Path(k.get("pv", pvc["spec"]["volumeName"])["spec"]["hostPath"]["path"]) / names.claim_folder(job)


def hit(k: Kubectl, case: Case, at: int, metrics: Path) -> tuple[int, float, float, str]:
    """At step `at`, inject `case` and check what follows; (the step it hit, seconds from the injection to the
    completion of the step it interrupted, the runtime's own recovery seconds, where the state came back from)."""
    wait_for(lambda: (status(k, JOB).get("step") or 0) >= at, 600, f"step {at}", lambda: describe(k, JOB), interval=1)
    assert status(k, JOB).get("phase") not in ("Succeeded", "Failed"), f"the job ended before {case.name}: raise STEPS"
    before, rs, seen = uids(k), role_status(k, case.role), len(recoveries(metrics))
    events = {r: event_count(k, r, case.role) for r in ("RoleRestart", "RoleFailed")}
    pod = k.list("pods", f"kuberl.io/job={JOB},{names.LABEL_ROLE}={case.role}")[0]
    t0 = time.monotonic()
    case.inject(k, pod)
    # A deleted pod's processes live on through its grace period: the record comes once the role's restart is done
    # and the step it interrupted has completed (metrics.jsonl gets a step's row when the step ends).
    wait_for(lambda: len(recoveries(metrics)) > seen, 400, f"the recovery in metrics.jsonl: {case.name}",
             lambda: describe(k, JOB), interval=0.5)
    seconds = time.monotonic() - t0
    new = recoveries(metrics)[seen:]
    assert [(r["role"], r["steps_lost"]) for r in new] == [(case.role, 0)], (case.name, new)
    assert new[0]["restored_from"].startswith("snapshot"), (case.name, new)
    after = uids(k)
    assert {u: r for u, r in before.items() if r != case.role} == {u: r for u, r in after.items() if r != case.role}
    role_pods = [u for u, r in after.items() if r == case.role]
    assert (pod["metadata"]["uid"] not in role_pods) == case.pod_replaced and len(role_pods) == 1, case.name
    wait_for(lambda: all(map(running, pods_by_role(k, JOB)[case.role])), 300, "the role's pod Running",
             lambda: describe(k, JOB), interval=1)

    def mirrored() -> dict[str, Any] | None:
        """The role's status once the driver's report of the recovery is in it: the report goes through the
        driver pod's reporter sidecar, so it can come a moment after the step's row in metrics.jsonl."""
        now = role_status(k, case.role)
        reported = case.pod_replaced or event_count(k, "RoleFailed", case.role) > events["RoleFailed"]
        return now if now.get("restarts", 0) > rs.get("restarts", 0) and reported else None

    now = wait_for(mirrored, 60, f"the recovery in the job's status: {case.name}", lambda: describe(k, JOB),
                   interval=0.5)
    assert now["podRestarts"] == rs.get("podRestarts", 0) + case.pod_replaced, (case.name, rs, now)
    counted = {r: event_count(k, r, case.role) - n for r, n in events.items()}
    # One Event for the failure: the operator's RoleRestart for a pod, the driver's RoleFailed for a process
    # (a pod's failure is the driver's to report too, with where the state came back from).
    assert counted["RoleRestart"] == int(case.pod_replaced) and counted["RoleFailed"] <= 1, (case.name, counted)
    assert case.pod_replaced or counted["RoleFailed"] == 1, (case.name, counted)
    return new[0]["step"], seconds, new[0]["total_s"], new[0]["restored_from"]


def quickstart_with_claim(k: Kubectl, job: str, claim: str, interval: int, steps: int) -> dict[str, Any]:
    """Once the earlier jobs' pods are gone: the namespace `k` works in, a `kuberl-local` claim in it, bound; and
    the quickstart named `job`, `steps` long, checkpointing every `interval` steps to that claim (not applied)."""
    wait_for(lambda: others_gone(k), 180, "the earlier jobs' pods gone", lambda: describe(k, ""), interval=2)
    k("create", "namespace", k.namespace)
    k.apply(volumes.claim(claim))
    wait_for(lambda: (k.get("pvc", claim) or {}).get("status", {}).get("phase") == "Bound", 60, "the claim bound",
             lambda: k("get", "pvc,pv", "-o", "wide"), interval=1)
    spec = yaml.safe_load(QUICKSTART.read_text())
    spec["metadata"]["name"] = job
    spec["spec"]["trainer"].update(steps=steps, checkpoint={"interval": interval, "volumeClaim": claim,
                                                            "path": "/checkpoints"})
    return spec


@dataclass
class Failures:
    """The failures job, watched from its apply to its end, and what Prometheus scraped of it meanwhile."""

    final: dict[str, Any]
    timings: list[tuple[str, int, float, float, str]]  # (case, the step it hit, seconds, recovery seconds, restored)
    scrape: Scrape


class Discovery(threading.Thread):
    """Writes what Kubernetes discovery would find (pods; the Services' Endpoints) into two file_sd files every
    second, from the real cluster's API: Debian's Prometheus has no Kubernetes discovery of its own."""

    def __init__(self, k: Kubectl, folder: Path):
        super().__init__(daemon=True, name="discovery")
        self.k, self.pods, self.endpoints = k, folder / "pods.json", folder / "endpoints.json"
        self.done = threading.Event()
        self.refresh()

    def refresh(self) -> None:
        def every(kind: str) -> list[dict[str, Any]]:
            return json.loads(self.k("get", kind, "-A", "-o", "json"))["items"]

        pods = every("pods")
        for path, groups in ((self.pods, pod_targets(pods)),
                             (self.endpoints, endpoint_targets(every("services"), every("endpoints"), pods))):
            path.with_suffix(".tmp").write_text(json.dumps(groups))
            path.with_suffix(".tmp").rename(path)

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                self.refresh()
            except (RuntimeError, subprocess.TimeoutExpired):
                pass  # the API busy for a moment: the files keep the last view, as discovery would

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)


@pytest.fixture(scope="module")
def prometheus(installed: Kubectl, helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Debian's Prometheus beside the cluster, scraping the job's pods and the operator as the chart's own
    PodMonitor (driver and Ray endpoints) and ServiceMonitor select them, over what discovery finds."""
    if why := missing_binaries():
        pytest.skip(why)
    work = tmp_path_factory.mktemp("e2e-prometheus")
    discovery = Discovery(installed, work)
    every = {"interval": SCRAPE, "scrapeTimeout": SCRAPE}
    objects = helm.render({"podMonitor": {"enabled": True, **every}, "serviceMonitor": {"enabled": True, **every}})
    pods, service = one(objects, "PodMonitor"), one(objects, "ServiceMonitor")
    endpoints = range(len(pods["spec"]["podMetricsEndpoints"]))
    configs = [*(pod_monitor_discovery(pods, i, discovery.pods) for i in endpoints),
               service_monitor_discovery(service, 0, discovery.endpoints)]
    discovery.start()
    prom = Prometheus(work, configs, [ALERTS])
    yield prom
    prom.stop()
    discovery.stop()


@pytest.fixture(scope="module")
def failures(installed: Kubectl, prometheus: Prometheus) -> Failures:
    """The quickstart with a checkpoint claim, hit by CASES in turn, run to its end."""
    k = installed.in_namespace(JOB)
    job = quickstart_with_claim(k, JOB, CLAIM, interval=2, steps=STEPS)
    start = time.time()
    k.apply(job)
    metrics = job_folder(k, CLAIM, JOB) / "runs" / JOB / "metrics.jsonl"  # the driver's --out on the claim
    at, timings = FIRST_AT, []
    for case in CASES:
        timings.append((case.name, *hit(k, case, at, metrics)))
        at = status(k, JOB)["step"] + EVERY
    wait_for(lambda: status(k, JOB).get("phase") in ("Succeeded", "Failed"), 900, "the job to end",
             lambda: describe(k, JOB), interval=5)
    time.sleep(3)  # the last scrapes
    return Failures(status(k, JOB), timings, Scrape(prometheus, JOB, JOB, start, time.time(), "", metrics.parent))


def test_each_role_failure_restarts_only_that_role_and_loses_no_step(failures: Failures) -> None:
    """What `hit` checked after each case held (the fixture fails otherwise), and the job completed."""
    assert failures.final["phase"] == "Succeeded", failures.final
    assert (failures.scrape.out / "reward_curve.png").is_file()
    assert [t[0] for t in failures.timings] == [c.name for c in CASES]
    for name, step, seconds, recovery_s, restored in failures.timings:
        print(f"{name} in step {step}: that step done {seconds:.1f}s after (the runtime's recovery {recovery_s:.1f}s, "
              f"restored from {restored})")


def test_kuberl_export_reads_the_jobs_checkpoints_on_the_volume(failures: Failures, tmp_path: Path) -> None:
    """The claim's folder on the host holds the checkpoints (docs/operations.md): `kuberl export` makes a model."""
    folder, out = failures.scrape.out.parents[1], tmp_path / "model"
    done = subprocess.run([sys.executable, "-m", "kuberl.cli", "export", str(folder), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and f"exported step {STEPS}" in done.stdout, (done.stdout, done.stderr)
    assert (out / "config.json").is_file() and list(out.glob("*.safetensors"))


@pytest.mark.parametrize("target", [t for t in targets(DASH) if not for_agents(t)], ids=str)
def test_every_dashboard_panel_returns_data_for_the_job(failures: Failures, target: Target) -> None:
    """Every panel but those of spec.environment's families, which this job does not serve (tests/prometheus
    checks them on an agent job)."""
    result = run_query(failures.scrape, target)
    assert result, no_data(failures.scrape, target)


def test_prometheus_scraped_the_driver_and_every_ray_pod(failures: Failures) -> None:
    """Through the PodMonitor's two endpoints: the driver's (kuberl_* with the job's name) and Ray's metrics port on
    the head and each role's pods, the driver not twice."""
    s = failures.scrape
    up = s.prom.query_range(f'up{{namespace="{JOB}"}} == 1', s.start, s.end, 5)
    seen = {(series["metric"]["endpoint"], series["metric"].get("kuberl_io_role", "")) for series in up}
    assert {series["metric"]["container"] for series in up if series["metric"]["endpoint"] == "0"} == {"driver"}, up
    assert {role for endpoint, role in seen if endpoint == "metrics"} >= {"", *ROLES}, seen


def progress(k: Kubectl, job: str) -> ProgressDocument:
    cm = k.get("configmap", names.progress_configmap(job)) or {}
    return ProgressDocument.parse((cm.get("data") or {}).get(PROGRESS_KEY))


def standby_ready(k: Kubectl, job: str, role: str) -> bool:
    entry = progress(k, job).roles.get(role)
    return bool(entry and entry.standby_ready)


def test_a_running_standby_pod_takes_a_deleted_critic_pods_place(installed: Kubectl) -> None:
    """With spec.roles.critic.standby the critic has a second pod, Running and set up; delete its active pod and
    its standby takes over (the recovery says so, no step lost), while a new standby pod is made. Only the critic
    keeps a standby and the ref role is off (no KL term): five Ray pods on the 2-core node (in CI of 2026-12-03 a
    standby for every role, ten Ray pods, starved the head)."""
    name, claim = "standby", "standby-checkpoints"
    k = installed.in_namespace(name)
    job = quickstart_with_claim(k, name, claim, interval=2, steps=STEPS)
    job["spec"]["roles"]["critic"]["standby"] = True
    job["spec"]["roles"]["ref"]["enabled"] = False
    for role, memory in (("actor", "1536Mi"), ("critic", "1536Mi"), ("reward", "1Gi")):
        job["spec"]["roles"][role]["resources"] = {"cpu": "50m", "memory": memory}  # light pods on 2 cores
    k.apply(job)

    def active_and_spares() -> tuple[dict[str, Any], set[str]] | None:
        """The critic's active pod and the Running pods it does not run on, once its standby is ready: one of them
        is the standby (a pod that failed at start-up under load, and its replacement, can be there too)."""
        if (status(k, name).get("step") or 0) < 6 or not standby_ready(k, name, "critic"):
            return None
        critics = [p for p in pods_by_role(k, name).get("critic", []) if running(p)]
        active = progress(k, name).hosts_of("critic")
        victims = [p for p in critics if p["metadata"]["name"] in active]
        spares = [p for p in critics if p["metadata"]["name"] not in active]
        return (victims[0], {p["metadata"]["name"] for p in spares}) if victims and spares else None

    victim, spares = wait_for(active_and_spares, 600, "step 6 with the critic's standby pod ready",
                               lambda: describe(k, name), interval=1)
    metrics = job_folder(k, claim, name) / "runs" / name / "metrics.jsonl"
    seen = recoveries(metrics)  # earlier ones (a restart under load at start-up) are not this test's
    t0 = time.monotonic()
    k.delete("pod", victim["metadata"]["name"])
    wait_for(lambda: len(recoveries(metrics)) > len(seen), 400, "the take-over in metrics.jsonl",
             lambda: describe(k, name), interval=0.5)
    seconds = time.monotonic() - t0
    rec, *others = recoveries(metrics)[len(seen):]
    assert (rec["role"], rec["standby"], rec["steps_lost"], rec["attempts"]) == ("critic", True, 0, 1), rec
    assert set(rec["hosts"]) <= spares, (spares, rec)  # a pod Running before the delete took over
    assert others == [], (seen, others)
    # Training goes on with the standby as the critic. The job is not run to its end: completing after a deleted
    # critic pod is the failures job's claim, and the ~120 s of steps left cost CI time for nothing new.
    wait_for(lambda: (status(k, name).get("step") or 0) >= rec["step"] + TRAINS_ON, 300,
             f"{TRAINS_ON} steps past the take-over", lambda: describe(k, name), interval=1)
    # (its phase may still say Restarting: the operator makes the critic a new standby pod meanwhile)
    assert status(k, name)["phase"] in ("Running", "Restarting"), status(k, name)
    assert recoveries(metrics)[len(seen) + 1:] == [], recoveries(metrics)
    k.delete("rltj", name, wait=True)  # its pods go with it (owner references); the next job waits for that
    print(f"critic pod deleted with a standby, in step {rec['step']}: that step done {seconds:.1f}s after (the "
          f"runtime's recovery {rec['total_s']:.1f}s, restored from {rec['restored_from']})")
