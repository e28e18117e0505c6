"""Gang scheduling's decision (gang.py): a job's gated pods are let through together when the whole set fits the
nodes' free capacity, never a part of them; a job that already holds pods lets its new ones through. The real
stack's run of two jobs that each need 60 % of the GPU nodes is tests/cluster/test_gang.py."""

from __future__ import annotations

from decimal import Decimal

from kuberl_operator import gang
from kuberl_operator.gang import GATE, Verdict, fit, quick, requests


def pod(name: str, gpus: int = 0, cpu: str = "1", node: str | None = None, gated: bool = True,
        phase: str = "Pending", tolerate: bool = True, **spec: object) -> dict:
    """A job pod (its component from the name: "-driver" ends a driver's)."""
    res = {"cpu": cpu, "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    body: dict = {"containers": [{"name": "c", "resources": {"requests": res, "limits": res}}], **spec}
    if gated:
        body["schedulingGates"] = [{"name": GATE}]
    if node:
        body["nodeName"] = node
    if tolerate:
        body["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    driver = name.endswith("-driver")
    labels = {"app.kubernetes.io/component": "driver" if driver else "worker", "kuberl.io/job": name.split("-")[0]}
    owner = [{"kind": "Job" if driver else "RayCluster", "name": name.split("-")[0]}]
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": "1", "labels": labels,
                         "ownerReferences": owner}, "spec": body, "status": {"phase": phase}}


def node(name: str, gpus: int = 8, cpu: str = "64", taint: bool = True, ready: bool = True) -> dict:
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] if taint else []
    return {"metadata": {"name": name, "labels": {}}, "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": cpu, "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


NODES = [node("gpu-0"), node("gpu-1")]


def job(prefix: str, actor: int = 8, critic: int = 2) -> list[dict]:
    """A job of 10 GPUs (62.5 % of two 8-GPU nodes): an 8-GPU actor, a 2-GPU critic, a head and a driver."""
    return [pod(f"{prefix}-head"), pod(f"{prefix}-driver"), pod(f"{prefix}-actor", actor),
            pod(f"{prefix}-critic", critic)]


def test_a_whole_set_that_fits_is_let_through_at_once() -> None:
    a = job("a")
    assert quick(a, 4) is None  # all four made, none past its gate: the nodes decide
    assert fit(a, NODES, a) == Verdict(release=("a-actor", "a-critic", "a-head", "a-driver"))  # driver last


def test_a_second_set_that_fits_only_in_part_waits_whole_and_says_which_pod_and_why() -> None:
    a = [{**p, "spec": {**p["spec"], "schedulingGates": [], "nodeName": n}, "status": {"phase": "Running"}}
         for p, n in zip(job("a"), ["gpu-0", "gpu-0", "gpu-0", "gpu-1"], strict=True)]
    b = job("b")
    verdict = fit(b, NODES, [*a, *b])
    assert verdict.release == ()  # the critic alone would fit gpu-1's 6 free GPUs: it is not let through
    assert verdict.wait is not None and verdict.wait.startswith(
        "all 4 pods wait to be scheduled together: pod b-actor (cpu=1, memory=1Gi, nvidia.com/gpu=8) fits no node's "
        "free capacity now (gpu-0 has nvidia.com/gpu 0 free; gpu-1 has nvidia.com/gpu 6 free)"), verdict.wait
    # the first job's pods go (finished and deleted): the second fits, whole
    assert fit(b, NODES, b).release == ("b-actor", "b-critic", "b-head", "b-driver")


def test_pods_another_gang_just_let_through_count_before_they_are_bound() -> None:
    a = [{**p, "spec": {**p["spec"], "schedulingGates": []}} for p in job("a")]  # ungated, not yet bound
    b = job("b")
    assert fit(b, NODES, [*a, *b]).wait is not None


def test_a_running_jobs_restarted_pods_keep_their_room_from_a_waiting_gang() -> None:
    """h's actor was deleted for a restart and made again, gated: its room on gpu-1 is not b's to take."""
    critic = {**pod("h-critic", 2, gated=False, node="gpu-0"), "status": {"phase": "Running"}}
    actor = pod("h-actor", 8)
    b = [pod("b-actor", 8)]
    assert fit(b, NODES, [critic, actor, *b]).wait is not None
    assert fit(b, NODES, [critic, *b]).release == ("b-actor",)  # without the restart: room on gpu-1


def test_a_not_ready_node_has_no_room_now_but_counts_for_ever() -> None:
    down = [node("gpu-0"), node("gpu-1", ready=False)]
    a = job("a")
    assert fit(a, down, a).wait is not None and "not ready" in fit(a, down, a).wait
    whole = [pod("c-actor", 8), pod("c-critic", 8)]  # fits the two nodes together, one of them down for now
    assert fit(whole, down, whole).wait is not None


def test_a_set_no_empty_cluster_could_hold_goes_through_for_the_scheduler_to_say_why() -> None:
    three = [pod("t-a", 8), pod("t-b", 8), pod("t-c", 8)]  # 24 GPUs on two 8-GPU nodes: never
    assert fit(three, NODES, three).release == ("t-a", "t-b", "t-c")


def test_a_pod_merely_labelled_for_a_job_does_not_let_it_skip_the_check() -> None:
    stranger = {**pod("a-x", gated=False, node="gpu-0"), "status": {"phase": "Running"}}
    stranger["metadata"]["ownerReferences"] = []
    assert quick([stranger, *job("a")], 4) is None


def test_a_job_that_holds_pods_lets_a_restarted_pod_through_at_once() -> None:
    running = {**pod("a-critic", 2, gated=False, node="gpu-1"), "status": {"phase": "Running"}}
    restarted = pod("a-actor-2", 8)
    assert quick([running, restarted], 4) == Verdict(release=("a-actor-2",))


def test_a_driver_left_running_alone_does_not_let_the_ray_pods_skip_the_check() -> None:
    """Kueue took the job back and gave it back: its Ray pods are new and gated, its old driver still runs."""
    driver = {**pod("a-driver", gated=False, node="cpu-0"), "status": {"phase": "Running"}}
    again = [driver, *(p for p in job("a") if not p["metadata"]["name"].endswith("-driver"))]
    assert quick(again, 4) is None  # weighed whole, the running driver counted where it runs
    assert quick(again[:3], 4) == Verdict()  # one Ray pod still to be made


def test_until_the_whole_set_is_made_nothing_is_decided_and_nothing_said() -> None:
    assert quick(job("a")[:3], 4) == Verdict()
    assert quick([], 4) == Verdict()


def test_finished_or_deleted_pods_are_not_holding_and_not_members() -> None:
    done = {**pod("a-old", gated=False), "status": {"phase": "Succeeded"}}
    going = {**pod("a-gone", gated=False), "metadata": {"name": "a-gone", "deletionTimestamp": "t"}}
    assert quick([done, going, *job("a")], 4) is None
    assert set(fit([done, going, *job("a")], NODES, job("a")).release) == {p["metadata"]["name"] for p in job("a")}


def test_a_pod_that_tolerates_no_gpu_taint_fits_only_untainted_nodes() -> None:
    cpu = node("cpu-0", gpus=0, cpu="4", taint=False)
    other = {**pod("o-x", cpu="2", gated=False, node="cpu-0", tolerate=False), "status": {"phase": "Running"}}
    alone = [pod("x-head", cpu="2", tolerate=False), pod("x-driver", cpu="2", tolerate=False)]
    verdict = fit(alone, [*NODES, cpu], [other, *alone])
    assert verdict.wait is not None and verdict.wait.endswith(
        "fits no node's free capacity now (cpu-0 has cpu 0 free; 2 other nodes not ready or ruled out by its "
        "selectors or tolerations)"), verdict.wait
    assert fit(alone, [*NODES, cpu], alone).release == ("x-head", "x-driver")


def test_a_pod_no_node_could_ever_take_lets_the_set_through_for_the_scheduler_to_say_why() -> None:
    never = [pod("y-head"), pod("y-actor", 9)]  # 9 GPUs: more than any node has
    assert fit(never, NODES, never).release == ("y-actor", "y-head")


def test_requests_count_sidecars_the_largest_init_container_overhead_and_one_pod() -> None:
    spec = {"containers": [{"resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "3"}}},  # runs alone, before the others
                               {"restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}}],
            "overhead": {"cpu": "100m"}}
    assert requests(spec) == {"cpu": Decimal("3.1"), "pods": Decimal(1)}


def test_the_whole_set_is_the_head_every_worker_and_the_driver() -> None:
    assert gang.expected_pods({"actor": 2, "critic": 2, "ref": 1, "reward": 1}) == 8
