"""Faults the way clusters break, on the real node, during training of the CPU job (issue 28's scenarios).

One job (the quickstart with a checkpoint claim, so every pod sees the per-step snapshots) is hit in turn, each
hit once the one before has settled:

- the critic's Ray worker frozen (SIGSTOP) past the hang bound, then continued;
- the critic's pod cut off from everything (head, other roles, API server) for 20 s, then healed;
- the actor pod's packets sent with 200 ms delay and 5 % loss for 40 s;
- the critic's pod cut off for 120 s, then healed;
- the driver's pod cut off (from the head and every role) for 20 s, then healed;
- etcd and kube-apiserver stopped for 20 s, then started again;
- the ref pod's containers killed, and while its restart is in flight etcd and kube-apiserver stopped for 20 s;
- the reward pod deleted, and while its restart is in flight the KubeRay operator stopped for 10 s and the kuberl
  operator's pod deleted;
- the Ray head's container killed: the whole Ray cluster and the driver start again, and the driver resumes from
  the last checkpoint, the steps lost in status;
- the driver's pod cut off 90 s, past Ray's 60 s limit for a driver to reconnect: a new driver pod resumes;
- the node lost: its kubelet stopped until the node is NotReady, the job's containers killed, the kubelet started
  again 20 s later; the job resumes from its last checkpoint.

Faults come from the host into the pod's own namespaces (`tests/e2e/chaos.py`). After each, what the docs
(docs/operations.md, "Chaos") promise is checked: which role restarted (only the hit one, or none), the cause the
recovery names, the seconds to detect and to recover, and that no completed step was lost. The figures are printed.

Marked slow (18 minutes on this machine, so `make test-all`, not `make test`); see docs/operations.md, "Chaos on the
real node", for what is not yet understood. Real pods' role restarts stay in the default run (test_role_failures.py).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from localkube import pki

from kuberl_operator import names
from tests.cluster.waits import wait_for

from . import chaos
from .conftest import OPERATOR_NAMESPACE, RELEASE, Kubectl, operator_ready
from .test_real_pods import describe, events_of, pods_by_role, status
from .test_role_failures import job_folder, quickstart_with_claim, recoveries

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]
JOB, CLAIM = "chaos", "chaos-checkpoints"
STEPS = 5000  # far more than the hits need: the job is deleted once they are done
SETTLE = 10  # steps of calm training between two hits


@dataclass
class Hit:
    """What followed one fault: the recoveries it caused, the pods it replaced, steps and seconds."""

    name: str
    role: str
    step: int  # the job's step when the fault began
    recoveries: list[dict[str, Any]]
    replaced: set[str]  # roles (or components) whose pods were made anew
    last_failure: str | None  # the role's status.roles.<role>.lastFailure afterwards
    resent: int  # calls the driver sent again to the same ranks after their link broke
    step_s: dict[str, float] = field(default_factory=dict)  # seconds measured: median steps before and during, ...


RestartBlink = tuple[Hit, dict[str, Any], dict[str, Any], dict[str, int]]  # the hit, the role's status before and
# after, its RoleRestart Events before and after with the job's children counted afterwards
Resumed = tuple[Hit, dict[str, Any], dict[str, Any]]  # the hit, the job's status before and after


def uids(k: Kubectl) -> dict[str, str]:
    return {p["metadata"]["uid"]: role for role, ps in pods_by_role(k, JOB).items() for p in ps}


def pod_pids(cluster, k: Kubectl, role: str) -> list[int]:
    (pod,) = pods_by_role(k, JOB)[role]
    pids = chaos.pod_pids(cluster.state, pod["metadata"]["uid"])
    assert pids, f"no process of the {role} pod on the node"
    return pids


def ray_worker(pids: list[int]) -> int:
    """The role's Ray worker among a pod's processes (`ray::<Role>Worker...`; Ray's agents and idle workers aside)."""
    found = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if cmd.startswith("ray::") and "Worker" in cmd and "IDLE" not in cmd:
            found.append(pid)
    assert len(found) == 1, found
    return found[0]


def metric_rows(metrics: Path) -> list[dict[str, Any]]:
    """The job's metrics.jsonl rows, read from the volume on the host (no API server needed)."""
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def step_seconds(metrics: Path, first: int, last: int) -> list[float]:
    return [r["time_step_s"] for r in metric_rows(metrics) if first <= r["step"] <= last and "time_step_s" in r]


class Chaos:
    """The chaos job and the way to hit it."""

    def __init__(self, cluster, k: Kubectl):
        self.cluster, self.k = cluster, k
        self.metrics = job_folder(k, CLAIM, JOB) / "runs" / JOB / "metrics.jsonl"

    def step(self) -> int:
        return status(self.k, JOB).get("step") or 0

    def resent(self) -> int:
        """Calls the driver sent again after their link broke: its log's lines that say so
        (kuberl.controller.proxies)."""
        log = self.k("logs", "--tail=-1", "-l", f"{names.LABEL_JOB}={JOB},{names.LABEL_COMPONENT}=driver")
        return log.count("so it is sent again")

    def calm(self, at: int) -> None:
        """Wait for step `at`, with every pod of the job Running."""
        wait_for(lambda: self.step() >= at, 900, f"step {at}", lambda: describe(self.k, JOB), interval=1)
        assert status(self.k, JOB).get("phase") not in ("Succeeded", "Failed"), status(self.k, JOB)

    def hit(self, name: str, role: str, fault: Callable[[], None], settle_steps: int = SETTLE) -> Hit:
        """Apply `fault` (it returns once the fault is over), then wait for `settle_steps` more completed steps."""
        self.calm(self.step() + 2)
        before, seen, step, resent = uids(self.k), len(recoveries(self.metrics)), self.step(), self.resent()
        fault()
        self.calm(self.step() + settle_steps)
        after = uids(self.k)
        replaced = {r for u, r in before.items() if u not in after}
        role_status = status(self.k, JOB).get("roles", {}).get(role, {})
        out = Hit(name, role, step, recoveries(self.metrics)[seen:], replaced, role_status.get("lastFailure"),
                  self.resent() - resent)
        print(f"[chaos] {name}: at step {step}, recoveries {out.recoveries}, pods replaced {replaced or 'none'}, "
              f"calls sent again {out.resent}")
        return out


@pytest.fixture(scope="module")
def job(real_cluster, installed: Kubectl) -> Iterator[Chaos]:
    k = installed.in_namespace(JOB)
    spec = quickstart_with_claim(k, JOB, CLAIM, interval=5, steps=STEPS)
    for role in ("actor", "critic"):  # hit up to five times each: more than the default budget of 3 restarts
        spec["spec"]["roles"][role]["maxRestarts"] = 10
    k.apply(spec)
    c = Chaos(real_cluster, k)
    c.calm(8)
    yield c
    k.delete("rltj", JOB, wait=True)


@pytest.fixture(scope="module")
def frozen(job: Chaos) -> Hit:
    """The critic's Ray worker SIGSTOPped past the hang bound of its call in flight (30 s, or 10 x the slowest such
    call: a first call slowed by a loaded machine raises it), until its recovery is recorded, then continued."""
    def fault() -> None:
        pid, seen = ray_worker(pod_pids(job.cluster, job.k, "critic")), len(recoveries(job.metrics))
        chaos.freeze(pid)
        try:
            wait_for(lambda: len(recoveries(job.metrics)) > seen, 600, "the stopped critic's recovery",
                     lambda: describe(job.k, JOB), interval=1)
        finally:
            chaos.thaw(pid)

    return job.hit("critic's Ray worker stopped until it is restarted", "critic", fault)


@pytest.fixture(scope="module")
def short_cut(job: Chaos, frozen: Hit) -> Hit:
    return job.hit("critic's pod cut off 20 s", "critic", cut(job, "critic", 20))


@pytest.fixture(scope="module")
def slow_link(job: Chaos, short_cut: Hit) -> Hit:
    def fault() -> None:
        with chaos.slow(pod_pids(job.cluster, job.k, "actor")[0], delay_ms=200, loss=5):
            time.sleep(40)

    first = job.step()
    hit = job.hit("actor's pod sends with 200 ms delay and 5 % loss for 40 s", "actor", fault, settle_steps=2)
    hit.step_s = {"before": statistics.median(step_seconds(job.metrics, first - 10, first - 1)),
                  "during": statistics.median(step_seconds(job.metrics, hit.step + 1, job.step() - 2))}
    return hit


@pytest.fixture(scope="module")
def long_cut(job: Chaos, slow_link: Hit) -> Hit:
    # 30 steps after: a second restart of the critic was seen once soon after a long cut (its old pod's raylet
    # ended when the head had declared its node dead, and a call's connection broke), and belongs to this hit
    return job.hit("critic's pod cut off 120 s", "critic", cut(job, "critic", 120), settle_steps=30)


def cut(job: Chaos, role: str, seconds: float) -> Callable[[], None]:
    def fault() -> None:
        pid = pod_pids(job.cluster, job.k, role)[0]
        chaos.cut(pid)
        try:
            time.sleep(seconds)
        finally:
            chaos.heal(pid)

    return fault


def assert_alone(hit: Hit) -> None:
    """Every recovery is the hit role's, with no completed step lost, and no other role's pod was replaced."""
    assert all(r["role"] == hit.role and r["steps_lost"] == 0 for r in hit.recoveries), hit
    assert hit.replaced <= {hit.role}, hit


def test_a_stopped_worker_is_named_stopped_and_its_role_alone_restarts(frozen: Hit) -> None:
    assert_alone(frozen)
    (rec,) = frozen.recoveries
    assert rec["reason"] == "WorkerHung" and "critic rank 0 stopped: its process" in rec["diagnosis"], rec
    assert frozen.replaced == set(), frozen  # the role's Ray actor is made anew in the same pod
    assert frozen.last_failure and "stopped" in frozen.last_failure, frozen
    print(f"stopped worker: detected in {rec['detect_s']:.1f}s, recovered in {rec['total_s']:.1f}s")


def assert_at_most_one_unreachable(hit: Hit) -> None:
    """A cut shorter than the hang bound: a call whose link broke is sent again to the same ranks (every call of a
    step is repeatable: an update is applied once per step), so no restart; at most one, named unreachable, when
    the call sent again broke too. No pod is replaced and no step lost."""
    assert len(hit.recoveries) <= 1 and all(r["steps_lost"] == 0 for r in hit.recoveries), hit
    assert all(r["reason"] == "WorkerUnreachable" for r in hit.recoveries), hit
    assert hit.replaced == set(), hit
    print(f"{hit.name}: {hit.resent} calls sent again, {len(hit.recoveries)} restarts")
    for rec in hit.recoveries:
        print(f"{hit.name}: role {rec['role']} restarted, detected in {rec['detect_s']:.1f}s, recovered in "
              f"{rec['total_s']:.1f}s")


def test_a_short_cut_heals_with_at_most_one_restart_of_that_role(short_cut: Hit) -> None:
    assert_alone(short_cut)
    assert_at_most_one_unreachable(short_cut)


def test_a_slow_lossy_link_slows_training_and_kills_nothing(slow_link: Hit) -> None:
    """Every step waits on the actor at least once: its median time grows by the delay at least, and nothing is
    declared dead."""
    assert slow_link.recoveries == [] and slow_link.replaced == set(), slow_link
    assert slow_link.step_s["during"] >= slow_link.step_s["before"] + 0.2, slow_link
    print(f"200 ms delay and 5 % loss on the actor: median step {slow_link.step_s['before']:.2f}s before, "
          f"{slow_link.step_s['during']:.2f}s during")


def test_a_long_cut_is_named_unreachable_and_its_role_alone_restarts(long_cut: Hit) -> None:
    assert_alone(long_cut)
    assert 1 <= len(long_cut.recoveries) <= 2, long_cut
    rec = long_cut.recoveries[0]
    assert all(r["reason"] == "WorkerUnreachable" for r in long_cut.recoveries), long_cut
    # the hang timeout of the call in flight (30 s, or callTimeoutSeconds for a method not seen yet), or Ray's own
    # verdict on the pod's node (five missed health checks: about 65 s), whichever comes first
    assert rec["detect_s"] <= 75, rec
    assert "WorkerUnreachable at step" in (long_cut.last_failure or ""), long_cut
    print(f"120 s cut: detected in {rec['detect_s']:.1f}s, recovered in {rec['total_s']:.1f}s "
          f"({long_cut.last_failure})")


@pytest.fixture(scope="module")
def driver_cut(job: Chaos, long_cut: Hit) -> Hit:
    return job.hit("driver's pod cut off 20 s", "driver", cut(job, "driver", 20))


def test_a_driver_cut_off_for_a_moment_goes_on(driver_cut: Hit) -> None:
    """Every role looks cut off from the driver: the calls in flight are sent again; at most one restart."""
    assert_at_most_one_unreachable(driver_cut)


def last_trained(metrics: Path) -> int:
    """The newest step in the job's metrics.jsonl."""
    return max((r["step"] for r in metric_rows(metrics) if "step" in r), default=0)


def restart_events(job: Chaos, role: str) -> int:
    return sum(1 for e in events_of(job.k, JOB, "RoleRestart") if e["message"].startswith(f"role {role}"))


def children(job: Chaos) -> dict[str, int]:
    """How many of each kind the operator made for the job: a child made twice shows here."""
    rayclusters = [c for c in job.k.list("rayclusters") if c["metadata"].get("labels", {}).get(names.LABEL_JOB) == JOB]
    live = {role: len(ps) for role, ps in pods_by_role(job.k, JOB).items()}
    return {"rayclusters": len(rayclusters), **live}


@pytest.fixture(scope="module")
def api_blink(job: Chaos, driver_cut: Hit) -> Hit:
    """etcd and kube-apiserver stopped for 20 s and started again: the steps trained meanwhile (from the volume)
    and the seconds until the status shows them are in the hit's `step_s`."""
    seconds: dict[str, float] = {}

    def fault() -> None:
        first = last_trained(job.metrics)
        t0 = time.monotonic()
        job.cluster.restart("etcd", "kube-apiserver", down_s=20)
        back, trained = time.monotonic(), last_trained(job.metrics)
        seconds.update(down=back - t0, trained=trained - first)
        wait_for(lambda: job.step() >= trained, 120, f"the status at step {trained}", lambda: describe(job.k, JOB),
                 interval=0.5)
        seconds["caught_up"] = time.monotonic() - back

    before = children(job)
    hit = job.hit("etcd and kube-apiserver down 20 s", "api", fault)
    hit.step_s = {**seconds, "children_same": float(children(job) == before)}
    return hit


def test_training_goes_on_while_the_api_server_and_etcd_are_down(api_blink: Hit) -> None:
    """Nothing in the pods needs the API server to train: steps complete while it is down, no role restarts, no
    pod is made anew nor any child twice, and the status catches up once it is back."""
    assert api_blink.recoveries == [] and api_blink.replaced == set(), api_blink
    assert api_blink.step_s["trained"] > 0 and api_blink.step_s["children_same"] == 1.0, api_blink
    print(f"etcd and kube-apiserver down {api_blink.step_s['down']:.1f}s (stopped, 20 s, started, ready): "
          f"{api_blink.step_s['trained']:.0f} steps trained meanwhile, the status caught up "
          f"{api_blink.step_s['caught_up']:.1f}s after")


def restart_in_flight(job: Chaos, role: str, name: str, fail: Callable[[], None],
                      blink: Callable[[], None]) -> RestartBlink:
    """`fail` the role's pod, and while its restart is in flight `blink` part of the control plane; wait for the
    role's recovery. Returns the hit, the role's status before and after (once the pod's failure is counted in
    it), and the role's RoleRestart Events before and after with the job's children counted afterwards."""
    before = {"status": status(job.k, JOB)["roles"][role], "events": restart_events(job, role)}

    def fault() -> None:
        seen = len(recoveries(job.metrics))
        fail()
        blink()
        wait_for(lambda: len(recoveries(job.metrics)) > seen, 400, f"the {role} role's recovery",
                 lambda: describe(job.k, JOB), interval=1)

    hit = job.hit(name, role, fault)

    def mirrored() -> dict[str, Any] | None:
        now = status(job.k, JOB)["roles"][role]
        return now if now.get("restarts", 0) > before["status"].get("restarts", 0) else None

    wait_for(mirrored, 120, f"the {role} role's restart in status", lambda: describe(job.k, JOB), interval=1)
    time.sleep(5)  # a second count, if one were coming, lands meanwhile
    after = status(job.k, JOB)["roles"][role]
    counts = {"before": before["events"], "after": restart_events(job, role)}
    return hit, before["status"], after, {**counts, **children(job)}


def assert_restarted_once(blinked: RestartBlink, pod_seen: bool = True) -> None:
    """The role's restart completes exactly once: one recovery, no pod but the role's made anew, counted once in
    status (`restarts`), one RayCluster and one pod per role afterwards. With `pod_seen`, the operator saw the
    pod's failure too: `podRestarts` and one RoleRestart Event; without, at most that."""
    hit, before, after, seen = blinked
    assert_alone(hit)
    assert len(hit.recoveries) == 1 and hit.replaced <= {hit.role}, hit
    assert after["restarts"] == before.get("restarts", 0) + 1, (before, after)
    pod_counts = after.get("podRestarts", 0) - before.get("podRestarts", 0), seen["after"] - seen["before"]
    assert pod_counts == (1, 1) if pod_seen else pod_counts in ((0, 0), (1, 1)), (before, after, seen)
    assert seen["rayclusters"] == 1 and all(seen[r] == 1 for r in ("head", "actor", "critic", "ref", "reward")), seen
    rec = hit.recoveries[0]
    print(f"{hit.name}: recovered once in {rec['total_s']:.1f}s (detected in {rec['detect_s']:.1f}s), one "
          f"RoleRestart Event, pods replaced {hit.replaced or 'none'}, {seen}")


@pytest.fixture(scope="module")
def api_blink_in_restart(job: Chaos, api_blink: Hit) -> RestartBlink:
    """The ref pod's containers killed (no API call needed), then etcd and kube-apiserver stopped for 20 s at once:
    the pod's failure, the operator's delete of it and KubeRay's new pod all wait for the API server."""
    def fail() -> None:
        assert chaos.kill_containers(pod_pids(job.cluster, job.k, "ref"))

    return restart_in_flight(job, "ref", "ref pod's containers killed, then etcd and kube-apiserver down 20 s", fail,
                             lambda: job.cluster.restart("etcd", "kube-apiserver", down_s=20))


def test_a_restart_in_flight_while_the_api_server_and_etcd_are_down_completes_once(
        api_blink_in_restart: RestartBlink) -> None:
    """Counted once by the driver; the operator, which learns of the pod's failure only once the API server is back,
    counted it as a pod restart in one run and not in another (01:33 UTC, 2026-12-05: no podRestarts, no RoleRestart
    Event, though its resyncs ran after the API server was back; not yet understood): at most once, never twice."""
    assert_restarted_once(api_blink_in_restart, pod_seen=False)


@pytest.fixture(scope="module")
def operators_blink(job: Chaos, api_blink_in_restart: RestartBlink) -> RestartBlink:
    """The reward pod deleted, and while its restart is in flight the KubeRay operator stopped for 10 s and the
    kuberl operator's pod deleted (its Deployment makes another)."""
    operator = job.k.in_namespace(OPERATOR_NAMESPACE)

    def fail() -> None:
        (pod,) = pods_by_role(job.k, JOB)["reward"]
        job.k.delete("pod", pod["metadata"]["name"])

    def blink() -> None:
        operator("delete", "pod", "-l", f"app.kubernetes.io/instance={RELEASE}", "--wait=false")
        job.cluster.restart("ray-operator", down_s=10)
        wait_for(lambda: operator_ready(operator), 240, "the operator's new pod Ready",
                 lambda: operator("get", "pods", "-o", "wide"), interval=1)

    return restart_in_flight(job, "reward", "reward pod deleted while both operators restart", fail, blink)


def test_a_restart_in_flight_while_both_operators_restart_completes_once(operators_blink: RestartBlink) -> None:
    assert_restarted_once(operators_blink)
    assert operators_blink[0].replaced == {"reward"}, operators_blink[0]


@pytest.fixture(scope="module")
def head_lost(job: Chaos, operators_blink: RestartBlink) -> Resumed:
    """The head's container killed (every process of its pod but the sandbox): returns the hit and the job's status
    before and after. The fault lasts until the resumed driver is past the step the head was lost at; the seconds
    to the failure counted in status and to that step are in the hit's `step_s`."""
    before = status(job.k, JOB)
    seconds: dict[str, float] = {}

    def fault() -> None:
        t0, at = time.monotonic(), job.step()
        assert chaos.kill_containers(pod_pids(job.cluster, job.k, "head"))
        wait_for(lambda: status(job.k, JOB)["head"]["restarts"] > before["head"]["restarts"], 120,
                 "the head's failure counted", lambda: describe(job.k, JOB), interval=0.5)
        seconds["counted"] = time.monotonic() - t0
        wait_for(lambda: status(job.k, JOB).get("resumedFrom") is not None and job.step() > at, 900,
                 f"the resumed driver past step {at}", lambda: describe(job.k, JOB), interval=1)
        seconds["past"] = time.monotonic() - t0

    hit = job.hit("Ray head's container killed", "head", fault, settle_steps=SETTLE)
    hit.step_s = seconds
    return hit, before, status(job.k, JOB)


def test_a_lost_head_restarts_the_whole_cluster_and_the_driver_resumes_saying_what_it_lost(
        job: Chaos, head_lost: Resumed) -> None:
    """docs/operator.md, "The Ray head is the whole cluster": every pod of the Ray cluster is made anew, and the
    driver's next pod (the first one crashes on the new cluster's ID and exits 6, which its Job retries) resumes
    from the newest complete checkpoint, its status saying from which step and how many completed steps it trains
    again (at most about one checkpoint interval: 5 steps, and the steps done while the checkpoint after it was
    written). The docs say no role's budget is charged: in some runs actor, ref and reward each counted one restart
    as well (a new pod of theirs exiting 1 after the head's loss, cause not known); printed, with the roles' last
    failure, not yet asserted."""
    hit, before, after = head_lost
    assert {"head", "actor", "critic", "ref", "reward"} <= hit.replaced, hit
    assert after["head"]["restarts"] == before["head"]["restarts"] + 1, after["head"]
    counted = {r: s["restarts"] - before["roles"][r]["restarts"] for r, s in after["roles"].items()}
    resumed, lost = after.get("resumedFrom"), after.get("stepsLost")
    # the driver trains on after the head is gone (its calls to the roles need no GCS) until one needs it: the
    # checkpoint it resumes from can be newer than the step the status showed at the kill, never an old one
    assert resumed is not None and resumed % 5 == 0 and resumed >= hit.step - 10, (hit.step, after)
    assert lost is not None and 0 <= lost <= 10, after
    print(f"head container killed at step {hit.step}: counted in status after {hit.step_s['counted']:.1f}s, the "
          f"driver resumed from step {resumed}, {lost} steps lost, past the step of the loss after "
          f"{hit.step_s['past']:.1f}s ({after['head'].get('lastFailure')}); role restarts counted meanwhile {counted}"
          + "".join(f"; {r}: {after['roles'][r].get('lastFailure')}, its raylets' last words "
                    f"{raylet_last_words(job, r)}" for r, n in counted.items() if n))


def raylet_last_words(job: Chaos, role: str) -> list[str]:
    """The lines of the role's pods' logs (every pod it had, from the node's pod-logs folder) where a raylet or
    `ray start --block` said why it ended: what a role's pod that exited after the head's loss died of."""
    logs = (job.cluster.state / "node" / "pod-logs").glob(f"{JOB}_{JOB}-{role}-worker-*/ray-worker/*.log")
    marks = ("Exiting because", "marked as dead", "Raylet is terminated")
    lines = [line for log in sorted(logs) for line in log.read_text(errors="replace").splitlines()]
    return [line.split(" ", 3)[-1][:300] for line in lines if any(m in line for m in marks)]


def resumed(job: Chaos, before: dict[str, Any], at: int) -> bool:
    """A driver resumed since the status `before` (from another checkpoint) and trained past step `at`."""
    now = status(job.k, JOB)
    return now.get("resumedFrom") not in (None, before.get("resumedFrom")) and (now.get("step") or 0) > at


def running_pids(job: Chaos, role: str) -> list[int]:
    """The processes of the role's running pod (a driver's failed pods of earlier attempts aside)."""
    (pod,) = [p for p in pods_by_role(job.k, JOB)[role] if p["status"].get("phase") == "Running"]
    return chaos.pod_pids(job.cluster.state, pod["metadata"]["uid"])


@pytest.fixture(scope="module")
def driver_lost(job: Chaos, head_lost: Resumed) -> Resumed:
    """The driver's pod cut off 90 s: longer than Ray lets a driver reconnect to its GCS (60 s). The fault lasts
    until a driver trains past the step of the cut; the seconds until the driver's pod was replaced and until that
    step are in the hit's `step_s`."""
    before = status(job.k, JOB)
    seconds: dict[str, float] = {}

    def fault() -> None:
        t0, at, pid = time.monotonic(), job.step(), running_pids(job, "driver")[0]
        first = {p["metadata"]["uid"] for p in pods_by_role(job.k, JOB)["driver"]}
        chaos.cut(pid)
        try:
            time.sleep(90)
        finally:
            chaos.heal(pid)
        wait_for(lambda: resumed(job, before, at) or None, 900, f"a driver past step {at}",
                 lambda: describe(job.k, JOB), interval=1)
        seconds["past"] = time.monotonic() - t0
        seconds["drivers_made"] = len({p["metadata"]["uid"] for p in pods_by_role(job.k, JOB)["driver"]} - first)

    hit = job.hit("driver's pod cut off 90 s", "driver", fault)
    hit.step_s = seconds
    return hit, before, status(job.k, JOB)


def test_a_driver_cut_off_past_rays_reconnect_limit_is_replaced_and_resumes(driver_lost: Resumed) -> None:
    """Ray ends a driver that cannot reach its GCS for 60 s: the driver Job's next pod resumes from the newest
    complete checkpoint, on the same Ray cluster (no pod of it made anew), saying how many steps it trains again. No
    role is restarted: the old driver exits once it learns that the head declared its node dead, before it blames a
    role (before, it restarted the actor into a job Ray had ended, whose placement group then held the actor's pod
    from the next driver, and the fixture timed out)."""
    hit, before, after = driver_lost
    assert hit.step_s["drivers_made"] >= 1, hit
    assert not hit.replaced & {"head", "actor", "critic", "ref", "reward"}, hit
    assert after["head"]["restarts"] == before["head"]["restarts"], after["head"]
    resumed_from, lost = after.get("resumedFrom"), after.get("stepsLost")
    assert resumed_from is not None and resumed_from % 5 == 0 and resumed_from >= hit.step - 10, (hit.step, after)
    assert lost is not None and 0 <= lost <= 10, after
    counted = {r: s["restarts"] - before["roles"][r]["restarts"] for r, s in after["roles"].items()}
    assert hit.recoveries == [] and not any(counted.values()), (hit, counted)
    print(f"driver cut off 90 s at step {hit.step}: {hit.step_s['drivers_made']:.0f} driver pods made, resumed from "
          f"step {resumed_from}, {lost} steps lost, past the step of the cut {hit.step_s['past']:.1f}s after it "
          f"began; role restarts counted {counted}")


def node_ready(job: Chaos) -> bool:
    node = json.loads(job.k("get", "node", pki.NODE_NAME, "-o", "json"))
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))


@pytest.fixture(scope="module")
def node_lost(job: Chaos, driver_lost: Resumed) -> tuple[Hit, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The node's kubelet stopped; once the node is NotReady, every container of the job's pods killed (the
    operator's pod is spared, as on a system node of its own); 20 s later the kubelet started again (the node
    comes back, as after a reboot). The fault lasts until a driver trains past the step of the kill. Returns the
    hit, the job's status before, while the node was NotReady with the job's containers dead, and after."""
    before = status(job.k, JOB)
    seconds: dict[str, float] = {}
    down: dict[str, Any] = {}

    def fault() -> None:
        t0, first = time.monotonic(), last_trained(job.metrics)
        job.cluster.halt("kubelet")
        wait_for(lambda: not node_ready(job), 180, "the node NotReady", interval=1)
        seconds["not_ready"], at = time.monotonic() - t0, job.step()
        seconds["trained"] = last_trained(job.metrics) - first
        pods = [p for ps in pods_by_role(job.k, JOB).values() for p in ps if p["status"].get("phase") == "Running"]
        for pod in pods:
            chaos.kill_containers(chaos.pod_pids(job.cluster.state, pod["metadata"]["uid"]))
        time.sleep(20)
        down.update(status(job.k, JOB))
        t1 = time.monotonic()
        job.cluster.resume("kubelet")
        seconds["kubelet_back"] = time.monotonic() - t1
        wait_for(lambda: resumed(job, before, at) or None, 900, f"a driver past step {at}",
                 lambda: describe(job.k, JOB), interval=1)
        seconds["past"] = time.monotonic() - t1

    hit = job.hit("node's kubelet stopped, then the job's containers killed", "node", fault)
    hit.step_s = seconds
    return hit, before, down, status(job.k, JOB)


def test_a_lost_node_that_returns_resumes_the_job_from_its_checkpoint(
        node_lost: tuple[Hit, dict[str, Any], dict[str, Any], dict[str, Any]]) -> None:
    """docs/operations.md, "Node loss": training goes on while only the kubelet is gone; with the node's containers
    dead nothing can tell (the kubelet reports pods), so the status shows the last step and the node NotReady; once
    the kubelet is back it reports the dead containers, and the job goes on as after the head's loss: the Ray
    cluster is made anew and a driver resumes from the newest complete checkpoint, the steps lost in status."""
    hit, before, down, after = node_lost
    assert hit.step_s["not_ready"] <= 120 and hit.step_s["trained"] > 0, hit
    assert after["head"]["restarts"] > before["head"]["restarts"], after["head"]
    resumed_from, lost = after.get("resumedFrom"), after.get("stepsLost")
    assert resumed_from is not None and resumed_from >= hit.step - 10, (hit.step, after)
    assert lost is not None and 0 <= lost <= 10, after
    assert after.get("phase") not in ("Failed", "Succeeded"), after
    print(f"kubelet stopped at step {hit.step}: node NotReady after {hit.step_s['not_ready']:.1f}s, "
          f"{hit.step_s['trained']:.0f} steps trained meanwhile; with the containers killed the status said phase "
          f"{down.get('phase')}, step {down.get('step')}, conditions "
          f"{[(c['type'], c['status'], c.get('reason')) for c in down.get('conditions', [])]}; kubelet Ready again "
          f"in {hit.step_s['kubelet_back']:.1f}s, a driver past the step {hit.step_s['past']:.1f}s after its start, "
          f"resumed from step {resumed_from}, {lost} steps lost, pods made anew {sorted(hit.replaced)}")
