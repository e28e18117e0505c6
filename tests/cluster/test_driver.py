"""The driver on the real stack: its Job's podFailurePolicy (exit codes 1/3 vs 4, eviction), the Ray
token Secret every pod shares, and live progress from a real `kuberl run` on this machine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from localkube.api import JOBS, PODS, RLTJ, SECRETS, Api
from localkube.stack import Cluster

from kuberl.spec.contract import ExitCode

from .faults import EXITS, exit_with, long_ago
from .jobs import condition, describe, manifest, pods_of, status
from .local_driver import driver_env, start_driver
from .operator_process import OperatorProcess
from .waits import wait_for

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.netns


def driver_pods(ns: Api, job: str, phase: str | None = None) -> list[dict]:
    pods = ns.list(PODS, f"batch.kubernetes.io/job-name={job}-driver")
    return [p for p in pods if phase is None or (p.get("status") or {}).get("phase") == phase]


def running_driver(ns: Api, job: str, ctx) -> str:
    return wait_for(
        lambda: (p := driver_pods(ns, job, "Running")) and p[0]["metadata"]["name"], 60, "a running driver pod", ctx
    )


def job_condition(ns: Api, job: str, type_: str) -> dict | None:
    conds = ((ns.get(JOBS, f"{job}-driver") or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == type_ and c["status"] == "True"), None)


def column(table: str, title: str) -> str:
    """One cell of `kubectl get`'s first row, by the header's column offsets (empty cells are blank)."""
    header, row = table.splitlines()[:2]
    start = header.index(title)
    end = min((i for i in (header.find(" ", start + len(title)),) if i > 0), default=len(header))
    end = next((i for i in range(end, len(header)) if header[i] != " "), len(header))
    return row[start:end].strip()


@pytest.mark.parametrize("code", [1, 3])
def test_exit_1_or_3_fails_the_driver_job_at_once(ns: Api, operator: OperatorProcess, job_name: str, code: int) -> None:
    """Fact: `kuberl run` exiting 1 (bad input) or 3 (gave up) ends the Job at once (FailJob), no retry."""
    ns.create(RLTJ, manifest(job_name))
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    exit_with(ns, running_driver(ns, job_name, ctx), code)
    failed = wait_for(lambda: job_condition(ns, job_name, "Failed"), 60, "the driver Job Failed", ctx)
    assert failed["reason"] == "PodFailurePolicy" and f"exit code {code}" in failed["message"], failed
    assert len(driver_pods(ns, job_name)) == 1  # not retried
    wait_for(lambda: status(ns, job_name).get("phase") == "Failed", 60, "the job Failed", ctx)
    assert condition(ns, job_name, "Failed")["reason"] == "DriverFailed"
    assert f"exit code {code}" in condition(ns, job_name, "Failed")["message"]


def test_exit_4_and_eviction_are_retried_within_the_backoff_limit(
    ns: Api, operator: OperatorProcess, job_name: str
) -> None:
    """Fact: exit 4 (no capacity in time) is retried and counts against backoffLimit (2); an evicted
    driver (DisruptionTarget) is retried without counting. Each pod ended an hour ago, as kwok reports it: the Job's
    controller retries it without sitting out its pod failure backoff (10, 20, 40 s)."""
    ns.create(RLTJ, manifest(job_name))
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    first = running_driver(ns, job_name, ctx)
    ns.patch(PODS, first, {"metadata": {"annotations": EXITS["evicted"] | long_ago()}})
    second = wait_for(
        lambda: (
            (p := [x for x in driver_pods(ns, job_name, "Running") if x["metadata"]["name"] != first])
            and p[0]["metadata"]["name"]
        ),
        60,
        "a new driver pod after the eviction",
        ctx,
    )
    job = ns.get(JOBS, f"{job_name}-driver")["status"]
    assert job.get("failed", 0) == 0 and not job_condition(ns, job_name, "Failed")  # the Ignore rule: not counted
    seen = {first, second}
    for attempt in range(3):  # backoffLimit 2: the third counted failure ends the Job
        running = sorted(p["metadata"]["name"] for p in driver_pods(ns, job_name, "Running"))
        exit_with(ns, running[0], 4, ended=long_ago())
        if attempt < 2:
            nxt = wait_for(
                lambda: (
                    (p := [x for x in driver_pods(ns, job_name, "Running") if x["metadata"]["name"] not in seen])
                    and p[0]["metadata"]["name"]
                ),
                60,
                f"driver retry {attempt + 1} after exit 4",
                ctx,
            )
            seen.add(nxt)
            assert status(ns, job_name).get("phase") in ("Running", "Provisioning")
    failed = wait_for(lambda: job_condition(ns, job_name, "Failed"), 60, "the driver Job Failed", ctx)
    assert failed["reason"] == "BackoffLimitExceeded", failed
    wait_for(lambda: status(ns, job_name).get("phase") == "Failed", 60, "the job Failed", ctx)
    assert condition(ns, job_name, "Failed")["reason"] == "DriverFailed"


def test_exit_6_is_retried_without_counting(ns: Api, operator: OperatorProcess, job_name: str) -> None:
    """Fact: a driver whose Ray node or cluster is gone (exit 6, `kuberl.resilience.ownlink`) is retried like an
    evicted one: the Job's failed count stays 0, so a long job's head losses and driver cuts do not spend its
    backoffLimit."""
    ns.create(RLTJ, manifest(job_name))
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    first = running_driver(ns, job_name, ctx)
    exit_with(ns, first, ExitCode.RAY_LOST, ended=long_ago())
    wait_for(lambda: [x for x in driver_pods(ns, job_name, "Running") if x["metadata"]["name"] != first], 60,
             "a new driver pod after exit 6", ctx)
    job = ns.get(JOBS, f"{job_name}-driver")["status"]
    assert job.get("failed", 0) == 0 and not job_condition(ns, job_name, "Failed"), job
    assert status(ns, job_name).get("phase") in ("Running", "Provisioning")


def test_every_pod_of_a_job_shares_one_ray_token(ns: Api, operator: OperatorProcess, job_name: str) -> None:
    """Fact: head, workers and driver read the Ray token from the job's one Secret, mounted as a file
    (RAY_AUTH_TOKEN_PATH), which KubeRay passes through untouched and which survives a role restart."""
    ns.create(RLTJ, manifest(job_name))
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "phase Running", ctx)
    secret = ns.get(SECRETS, f"{job_name}-ray-auth")
    assert secret["type"] == "Opaque" and len(secret["data"]["auth_token"]) > 40
    pods = [*pods_of(ns, job_name), *driver_pods(ns, job_name)]
    assert len(pods) == 1 + 6 + 1
    for pod in pods:
        containers = [c for c in pod["spec"]["containers"] if c["name"] in ("ray-head", "ray-worker", "driver")]
        assert containers, pod["metadata"]["name"]
        (volume,) = [v for v in pod["spec"]["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == f"{job_name}-ray-auth", pod["metadata"]["name"]
        for c in containers:
            env = {e["name"]: e for e in c.get("env", [])}
            assert env["RAY_AUTH_MODE"]["value"] == "token", pod["metadata"]["name"]
            assert env["RAY_AUTH_TOKEN_PATH"]["value"].startswith(
                next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == volume["name"]))
    from .faults import fail_pod

    fail_pod(ns, pods_of(ns, job_name, "actor")[0]["metadata"]["name"], "oom")
    wait_for(
        lambda: (
            status(ns, job_name)["roles"]["actor"]["restarts"] == 1 and status(ns, job_name).get("phase") == "Running"
        ),
        90,
        "the actor restarted",
        ctx,
    )
    assert ns.get(SECRETS, f"{job_name}-ray-auth")["data"] == secret["data"]


def test_a_real_driver_reports_progress_that_the_status_mirrors(
    cluster: Cluster, ns: Api, admin: Api, operator: OperatorProcess, kubectl, tmp_path: Path
) -> None:
    """`kuberl run` on this machine, with the environment its Job's pod would have and the pod's reporter
    sidecar (the one with the ServiceAccount token), patches `<job>-progress`; the operator mirrors step, tokens/s,
    restarts and the trainer status."""
    name = "quickstart"
    kubectl(
        "apply",
        "--server-side",
        "--validate=strict",
        "-n",
        ns.namespace,
        "-f",
        str(REPO / "examples" / "quickstart.yaml"),
    )
    ctx = lambda: describe(ns, name) + operator.tail(30)  # noqa: E731
    env = driver_env(cluster, admin, ns.namespace, name, tmp_path / "serviceaccount", ctx)
    steps = 6
    driver = start_driver(env, REPO / "examples" / "quickstart.yaml", tmp_path / "out", tmp_path / "driver.log",
                          "--steps", str(steps), "--fault", "critic:3")
    seen_status, seen_table = set(), set()
    try:
        deadline = time.monotonic() + 420
        while driver.poll() is None and time.monotonic() < deadline:
            seen_status.add(status(ns, name).get("step"))
            seen_table.add(column(kubectl("get", "rltj", name, "-n", ns.namespace).stdout, "STEP"))
            time.sleep(1)
        assert driver.wait(5) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    st = wait_for(lambda: (s := status(ns, name)).get("step") == steps and s, 30, "the last step mirrored", ctx)
    assert st["totalSteps"] == steps and st["tokensPerSec"] > 0
    trainer = st["trainerStatus"]  # Kubeflow Trainer's block: how far, how long still, the last step's figures
    assert trainer["progressPercentage"] == 100 and trainer["estimatedRemainingSeconds"] == 0, trainer
    assert set(trainer["metrics"]) >= {"rewardMean", "responseLengthMean"} and trainer["lastUpdatedTime"], trainer
    assert st["roles"]["critic"]["restarts"] == 1 and st["restarts"] >= 1  # the driver's own count of the killed critic
    assert len({s for s in seen_status if s}) >= 2, seen_status  # it moved while the driver ran
    assert len(seen_table - {""}) >= 2, seen_table
    log = (tmp_path / "driver.reporter.log").read_text()
    assert "progress report" not in log, log[-2000:]  # no failed report (403, TLS, ...)
