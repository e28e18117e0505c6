"""The operator under load on the real local control plane (cluster/localkube): N jobs applied at once.

Starts etcd, kube-apiserver, controller-manager, scheduler, kwok (GPU nodes enough for every job)
and KubeRay from the build cache, installs the chart, runs `kuberl operator -A` with the chart's
ServiceAccount token, then creates N RLTrainingJobs concurrently. Prints, as JSON lines and text:
the cluster's warm start time and memory at rest, the time until every job is Running (all roles
ready), the operator's reconcile latency p50/p99 (its own histogram), its memory and CPU, the API
requests it sent (counted from the API server's audit log) during the burst and at rest, etcd's size, and
whether any job was lost or any child duplicated.

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python bench/operator_load.py --jobs 50'
    .venv/bin/python bench/operator_load.py --jobs 1000 --timeout 3600 --rest 300
    .venv/bin/python bench/operator_load.py --quick     # 5 jobs (what tests/cluster/test_bench.py runs)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "cluster"), str(REPO)]

from localkube import build, pki  # noqa: E402
from localkube.api import JOBS, NAMESPACES, PODS, RAYCLUSTERS, RLTJ, Api, ApiError  # noqa: E402
from localkube.nodes import NodeSpec, gpu_node  # noqa: E402
from localkube.stack import Cluster  # noqa: E402

from tests.chart.render import Helm, find_helm  # noqa: E402
from tests.cluster.conftest import OPERATOR_USER  # noqa: E402
from tests.cluster.jobs import manifest  # noqa: E402
from tests.cluster.operator_process import OperatorProcess, http_get  # noqa: E402
from tests.cluster.rbac import requests_between  # noqa: E402

GPUS_PER_JOB, PODS_PER_JOB = 5, 8  # actor 2 + critic 2 + ref 1 GPUs; head + 6 workers + driver
NAMESPACE = "load"


def by_verb(requests: Counter[str]) -> Counter[str]:
    """`verb resource` counts summed by verb."""
    out: Counter[str] = Counter()
    for key, n in requests.items():
        out[key.split()[0]] += n
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets, seconds."""
    total = buckets[-1][1]
    rank, prev_bound, prev_count = q * total, 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / max(count - prev_count, 1e-9)
        prev_bound, prev_count = bound, count
    return prev_bound


def histogram(text: str, family: str) -> tuple[list[tuple[float, float]], float, float]:
    """(buckets, count, sum) of histogram `family` in a /metrics page."""
    buckets, count, total = [], 0.0, 0.0
    for line in text.splitlines():
        if line.startswith(f"{family}_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound), float(line.split()[-1])))
        elif line.startswith(f"{family}_count"):
            count = float(line.split()[-1])
        elif line.startswith(f"{family}_sum"):
            total = float(line.split()[-1])
    return buckets, count, total


def share_within(buckets: list[tuple[float, float]], bound: float) -> float | None:
    """The fraction of observations at most `bound` seconds, exact when `bound` is a bucket's edge."""
    total = buckets[-1][1] if buckets else 0.0
    within = [count for le, count in buckets if le == bound]
    return within[0] / total if total and within else None


def busy(exc: Exception) -> bool:
    """An API server too loaded to answer in time (a timeout, 429 or 5xx): the bench waits and asks again."""
    return not isinstance(exc, ApiError) or exc.status == 429 or exc.status >= 500


def create_job(admin: Api, name: str) -> None:
    """Create one job; asked again while the API server is too busy (a create that timed out but was made
    answers 409 the second time: done)."""
    while True:
        try:
            admin.create(RLTJ, manifest(name))
            return
        except (OSError, ApiError) as exc:
            if isinstance(exc, ApiError) and exc.status == 409:
                return
            if not busy(exc):
                raise
            time.sleep(1)


def phases_now(admin: Api) -> dict[str, str | None] | None:
    """Every job's phase by name; None when the API server did not answer in time."""
    try:
        return {j["metadata"]["name"]: (j.get("status") or {}).get("phase") for j in admin.list(RLTJ)}
    except (OSError, ApiError) as exc:
        if not busy(exc):
            raise
        print(f"listing the jobs: {exc}; asked again", file=sys.stderr, flush=True)
        return None


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="5 jobs")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for every job Running")
    parser.add_argument("--rest", type=float, default=90, help="seconds at rest after, requests counted (>= 60)")
    args = parser.parse_args()
    n = 5 if args.quick else args.jobs
    helm_bin = find_helm()
    if helm_bin is None:
        print("error: no helm (make helm)", file=sys.stderr)
        return 1
    gpu_nodes = math.ceil(n * GPUS_PER_JOB / 8)
    nodes = [
        *(NodeSpec(f"cpu-{i}") for i in range(max(1, math.ceil(n * 3 / 60)))),
        *(gpu_node(f"gpu-{i}") for i in range(gpu_nodes)),
    ]
    with tempfile.TemporaryDirectory(prefix="kuberl-load-") as tmp:
        work = Path(tmp)
        cluster = Cluster(work / "cluster", build.ensure_built(), tie_to_parent=True, log=lambda line: None)
        t0 = time.monotonic()
        cluster.start(nodes=nodes)
        start_s = time.monotonic() - t0
        time.sleep(20)  # at rest: caches filled, nothing to do
        rest = cluster.memory()
        emit(
            {
                "metric": "cluster_warm_start_s",
                "value": round(start_s, 2),
                "nodes": len(nodes),
                "phases": cluster.phases,
            }
        )
        emit({"metric": "cluster_rss_at_rest_mib", "value": round(sum(rest.values()), 1), "per_component": rest})
        operator = None
        try:
            helm = Helm(helm_bin, work / "helm")
            helm.install(cluster.kubeconfig)
            admin = cluster.admin(NAMESPACE)
            admin.timeout = 120  # a list of 1,000 jobs from an API server under the burst
            kubeconfig = work / "operator.kubeconfig"
            kubeconfig.write_text(
                pki.kubeconfig(cluster.server, cluster.pki, token=admin.token("kuberl-system", "kuberl"))
            )
            (work / "operator").mkdir()
            operator = OperatorProcess(kubeconfig, work / "operator", resync_seconds=30, secret_probe_seconds=900,
                                       verbose=False)  # as the chart runs it: the default periods, no debug log
            operator.start()
            admin.create(NAMESPACES, {"metadata": {"name": NAMESPACE}}, namespace=None)
            names = [f"load-{i:03d}" for i in range(n)]
            rss_idle = operator.rss_mib()
            burst_from, cpu0 = cluster.audit_log.stat().st_size, cpu_seconds(operator.proc.pid)
            t1 = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda name: create_job(admin, name), names))
            applied_s = time.monotonic() - t1
            peak, done_s, phases, shown = rss_idle, None, {}, 0.0
            poll_s = max(0.5, n / 200)  # listing every job is itself a load on the API server at 1,000 jobs
            while time.monotonic() - t1 < args.timeout:
                peak = max(peak, operator.rss_mib())
                phases = phases_now(admin) or phases
                if len(phases) == n and all(p == "Running" for p in phases.values()):
                    done_s = time.monotonic() - t1
                    break
                if time.monotonic() - shown >= 60:
                    shown = time.monotonic()
                    print(f"[{shown - t1:.0f}s] phases {dict(Counter(phases.values()))}; operator RSS {peak:.0f} MiB, "
                          f"CPU {(cpu_seconds(operator.proc.pid) - cpu0) / (shown - t1):.2f} cores", file=sys.stderr,
                          flush=True)
                time.sleep(poll_s)
            page = http_get(operator.metrics_url)[1]
            buckets, count, total = histogram(page, "kuberl_operator_reconcile_duration_seconds")
            waits = histogram(page, "kuberl_operator_reconcile_queue_seconds")[0]
            burst_s, burst_to, cpu1 = time.monotonic() - t1, cluster.audit_log.stat().st_size, cpu_seconds(
                operator.proc.pid)
            time.sleep(30)  # the last events settle, then a rest of --rest seconds
            rest_from, cpu2, t2 = cluster.audit_log.stat().st_size, cpu_seconds(operator.proc.pid), time.monotonic()
            time.sleep(args.rest)
            rest_s, cpu3 = time.monotonic() - t2, cpu_seconds(operator.proc.pid)
            burst = by_verb(requests_between(cluster.audit_log, OPERATOR_USER, burst_from, burst_to))
            codes = requests_between(cluster.audit_log, OPERATOR_USER, burst_from, burst_to, by_code=True)
            at_rest = by_verb(requests_between(cluster.audit_log, OPERATOR_USER, rest_from))
            rss_after = operator.rss_mib()
            clusters = admin.list(RAYCLUSTERS)
            drivers = admin.list(JOBS)
            pods = admin.list(PODS)
            per_job = {name: sum(1 for c in clusters if c["metadata"]["name"] == name) for name in names}
            lost = sorted(set(names) - set(phases))
            duplicated = sorted(name for name, k in per_job.items() if k != 1)
            emit(
                {
                    "metric": "jobs_all_running_s",
                    "value": round(done_s, 2) if done_s else None,
                    "jobs": n,
                    "apply_s": round(applied_s, 2),
                    "not_running": sorted(k for k, v in phases.items() if v != "Running"),
                }
            )
            emit(
                {
                    "metric": "reconcile_latency_s",
                    "p50": round(quantile(buckets, 0.5), 4),
                    "p99": round(quantile(buckets, 0.99), 4),
                    "mean": round(total / count, 4) if count else None,
                    "reconciles": int(count),
                    "within_2s": share_within(buckets, 2.0),  # the goal's share: exact (a bucket edge)
                    "turn_wait_p50": round(quantile(waits, 0.5), 4),  # before a pass: its job's lock, a free pass
                    "turn_wait_p99": round(quantile(waits, 0.99), 4),
                }
            )
            emit(
                {
                    "metric": "api_requests_per_s",
                    "burst": round(sum(burst.values()) / burst_s, 2),
                    "rest": round(sum(at_rest.values()) / rest_s, 3),
                    "burst_by_verb": dict(burst),
                    "burst_by_code": dict(codes),  # 429: throttled by API Priority and Fairness
                    "rest_by_verb": dict(at_rest),
                    "burst_s": round(burst_s, 1),
                    "rest_s": round(rest_s, 1),
                }
            )
            emit(
                {
                    "metric": "operator_cpu_cores",
                    "burst": round((cpu1 - cpu0) / burst_s, 3),
                    "rest": round((cpu3 - cpu2) / rest_s, 3),
                }
            )
            emit({"metric": "etcd_mib", "value": round(folder_mib(cluster.state / "etcd"), 1)})
            emit(
                {
                    "metric": "operator_rss_mib",
                    "idle": round(rss_idle, 1),
                    "peak": round(peak, 1),
                    "after": round(rss_after, 1),
                }
            )
            emit(
                {
                    "metric": "jobs_lost_or_duplicated",
                    "lost": lost,
                    "duplicated": duplicated,
                    "rayclusters": len(clusters),
                    "driver_jobs": len(drivers),
                    "pods": len(pods),
                    "expected_pods": n * PODS_PER_JOB,
                }
            )
            print(
                f"\n{n} jobs on {platform.node()} ({platform.machine()}): warm start {start_s:.1f}s, "
                f"control plane at rest {sum(rest.values()):.0f} MiB; "
                f"all Running after {done_s and round(done_s, 1)}s; "
                f"reconcile p50 {quantile(buckets, 0.5) * 1000:.0f} ms, "
                f"p99 {quantile(buckets, 0.99) * 1000:.0f} ms over {int(count)} reconciles, "
                f"{(share_within(buckets, 2.0) or 0):.2%} within 2 s (their wait for a turn: p50 "
                f"{quantile(waits, 0.5) * 1000:.0f} ms, p99 {quantile(waits, 0.99) * 1000:.0f} ms); "
                f"API requests {sum(burst.values()) / burst_s:.1f}/s in the burst, "
                f"{sum(at_rest.values()) / rest_s:.3f}/s at rest ({dict(at_rest) or 'none'}); operator CPU "
                f"{(cpu1 - cpu0) / burst_s:.2f} cores in the burst, {(cpu3 - cpu2) / rest_s:.3f} at rest; "
                f"etcd {folder_mib(cluster.state / 'etcd'):.0f} MiB; "
                f"operator RSS {rss_idle:.0f} -> peak {peak:.0f} MiB; lost {lost or 'none'}, "
                f"duplicated {duplicated or 'none'}; {len(pods)}/{n * PODS_PER_JOB} pods"
            )
            ok = done_s is not None and not lost and not duplicated and len(drivers) == n
            return 0 if ok else 1
        finally:
            if operator is not None:
                operator.stop()
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
