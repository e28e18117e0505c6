"""The operator as a real `kopf run` process against a validating API server on 127.0.0.1.

One server and one operator serve every scenario (unique job names); each scenario checks the
objects' real state through the API, and every write during it has passed schema validation.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from . import kuberay
from .client import (CONFIGMAPS, EVENTS, JOBS, PODS, RAYCLUSTERS, RESOURCECLAIMTEMPLATES, RLTJ, ROLEBINDINGS, ROLES,
                     SECRETS, SERVICEACCOUNTS, Client)
from .harness import OperatorProcess, holds, http_get, wait_for

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("operator", "no_rejections")]

CHILDREN = [(SERVICEACCOUNTS, "{}-driver"), (ROLES, "{}-driver"), (ROLEBINDINGS, "{}-driver"),
            (SECRETS, "{}-ray-auth"), (CONFIGMAPS, "{}-spec"), (CONFIGMAPS, "{}-progress"),
            (RAYCLUSTERS, "{}"), (JOBS, "{}-driver")]


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    """A small valid PPO job: actor 2 replicas, one each of critic, ref and reward."""
    roles = {"actor": {"replicas": 2}, "critic": {"replicas": 2, "maxRestarts": 3}}
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLTrainingJob",
        "metadata": {"name": name},
        "spec": {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards:repeat_letter"},
                 "roles": roles, **spec,
                 # one sample per rank and micro-batch, so that GPU layouts up to 16 ranks divide the batch
                 "trainer": {"microBatchSize": 1, **spec.get("trainer", {})}},
    }


def status(api: Client, name: str) -> dict[str, Any]:
    return (api.get(RLTJ, name) or {}).get("status") or {}


def condition(api: Client, name: str, type_: str) -> dict[str, Any] | None:
    return next((c for c in status(api, name).get("conditions", []) if c["type"] == type_), None)


def events(api: Client, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.list(EVENTS) if e["involvedObject"].get("name") == name and e["reason"] == reason]


def phase_is(api: Client, name: str, phase: str):
    return lambda: status(api, name).get("phase") == phase


def running_job(api: Client, operator: OperatorProcess, name: str, **spec: Any) -> list[dict[str, Any]]:
    """Apply a job, play KubeRay until its pods run, and wait for phase Running."""
    api.create(RLTJ, manifest(name, **spec))
    wait_for(lambda: api.get(RAYCLUSTERS, name), 10, "the RayCluster", operator.tail)
    pods = kuberay.sync(api, name)
    wait_for(phase_is(api, name, "Running"), 10, "phase Running", operator.tail)
    return pods


def uids(pods: list[dict[str, Any]], role: str | None = None) -> set[str]:
    return {p["metadata"]["uid"] for p in pods if role is None or p["metadata"]["labels"].get("kuberl.io/role") == role}


def test_create_makes_raycluster_driver_and_configmaps(api: Client, operator: OperatorProcess, job_name: str) -> None:
    job = api.create(RLTJ, manifest(job_name))
    wait_for(lambda: all(api.get(res, pattern.format(job_name)) for res, pattern in CHILDREN), 10,
             "every child object", operator.tail)
    for res, pattern in CHILDREN:
        owners = api.get(res, pattern.format(job_name))["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [("RLTrainingJob", job["metadata"]["uid"], True)]

    cluster = api.get(RAYCLUSTERS, job_name)
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert list(groups) == ["actor", "critic", "ref", "reward"]
    assert (groups["actor"]["replicas"], groups["actor"]["minReplicas"], groups["actor"]["maxReplicas"]) == (2, 2, 2)
    for role, group in groups.items():
        assert group["template"]["metadata"]["labels"]["kuberl.io/role"] == role
        assert group["template"]["metadata"]["labels"]["kuberl.io/job"] == job_name
        assert group["template"]["spec"]["restartPolicy"] == "Never"
        assert json.loads(group["rayStartParams"]["resources"].strip("'")) == {f"kuberl_role_{role}": 1,
                                                                              "kuberl_node_$(KUBERL_NODE_NAME)": 1}
        assert group["template"]["spec"]["containers"][0]["image"] == "kuberl-runtime:test"

    driver = api.get(JOBS, f"{job_name}-driver")["spec"]["template"]["spec"]
    assert driver["containers"][0]["command"][:5] == ["kuberl", "run", "/etc/kuberl/job.yaml", "--ray-address", f"{job_name}-head-svc:6379"]
    assert driver["serviceAccountName"] == f"{job_name}-driver"
    assert api.get(ROLES, f"{job_name}-driver")["rules"][0]["resourceNames"] == [f"{job_name}-progress"]

    wait_for(phase_is(api, job_name, "Provisioning"), 10, "phase Provisioning", operator.tail)
    st = status(api, job_name)
    assert st["rayCluster"] == job_name
    assert st["roles"]["actor"] == {**st["roles"]["actor"], "desired": 2, "ready": 0, "restarts": 0}
    assert "kuberl.io/finalizer" in api.get(RLTJ, job_name)["metadata"]["finalizers"]
    created = wait_for(lambda: events(api, job_name, "Created"), 10, "a Created Event", operator.tail)
    assert "RayCluster" in created[0]["message"] and created[0]["type"] == "Normal"

    kuberay.sync(api, job_name)
    wait_for(phase_is(api, job_name, "Running"), 10, "phase Running", operator.tail)
    ready = condition(api, job_name, "Ready")
    assert ready["status"] == "True" and ready["observedGeneration"] == 1 and ready["lastTransitionTime"]
    assert {r: s["ready"] for r, s in status(api, job_name)["roles"].items()} == {"actor": 2, "critic": 2, "ref": 1, "reward": 1}


def test_invalid_spec_fails_with_the_field_named_and_never_crash_loops(api: Client, operator: OperatorProcess, job_name: str) -> None:
    # Passes the CRD schema (the API server admits it) but breaks a cross-field rule of the model.
    api.create(RLTJ, manifest(job_name, algorithm={"name": "grpo", "groupSize": 1}))
    wait_for(phase_is(api, job_name, "Failed"), 10, "phase Failed", operator.tail)
    failed = condition(api, job_name, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert "spec.algorithm.groupSize" in failed["message"] and failed["observedGeneration"] == 1
    event = wait_for(lambda: events(api, job_name, "InvalidSpec"), 10, "an InvalidSpec Event", operator.tail)
    assert event[0]["type"] == "Warning" and "spec.algorithm.groupSize" in event[0]["message"]
    assert api.get(RAYCLUSTERS, job_name) is None and api.get(JOBS, f"{job_name}-driver") is None

    # No retries, no crash: the failure is permanent and reported once; the operator keeps working.
    holds(lambda: len(events(api, job_name, "InvalidSpec")) == 1 and operator.alive(), 2, "a single InvalidSpec Event")
    running_job(api, operator, f"{job_name}-ok")


@pytest.mark.parametrize("how", ["oom", "deleted"])
def test_failed_critic_pod_restarts_only_the_critic(api: Client, operator: OperatorProcess, job_name: str, how: str) -> None:
    pods = running_job(api, operator, job_name)
    critic = sorted(p["metadata"]["name"] for p in pods if p["metadata"]["labels"].get("kuberl.io/role") == "critic")
    others = uids(pods) - uids(pods, "critic")

    kuberay.fail(api, critic[0], how)
    wait_for(lambda: not kuberay.pods_of(api, job_name, "critic"), 10, "every critic pod deleted", operator.tail)
    assert uids(kuberay.pods_of(api, job_name)) == others  # actor, ref, reward and head: same pods
    st = wait_for(lambda: status(api, job_name).get("phase") == "Restarting" and status(api, job_name), 10,
                  "phase Restarting", operator.tail)
    assert st["roles"]["critic"]["restarts"] == 1 and st["restarts"] == 1
    assert critic[0] in st["roles"]["critic"]["lastFailure"]
    assert ("OOMKilled" if how == "oom" else "deleted") in st["roles"]["critic"]["lastFailure"]
    assert all(st["roles"][r]["restarts"] == 0 for r in ("actor", "ref", "reward"))
    event = wait_for(lambda: events(api, job_name, "RoleRestart"), 10, "a RoleRestart Event", operator.tail)
    assert "role critic" in event[0]["message"]

    kuberay.sync(api, job_name)  # KubeRay replaces the critic pods
    wait_for(phase_is(api, job_name, "Running"), 10, "phase Running again", operator.tail)
    assert uids(kuberay.pods_of(api, job_name)) >= others
    holds(lambda: status(api, job_name)["roles"]["critic"]["restarts"] == 1, 1, "one restart, counted once")
    assert len(events(api, job_name, "RoleRestart")) == 1


def test_exhausted_restart_budget_fails_the_job_for_good(api: Client, operator: OperatorProcess, job_name: str) -> None:
    running_job(api, operator, job_name, roles={"actor": {"replicas": 2}, "critic": {"replicas": 2, "maxRestarts": 1}})
    kuberay.fail(api, kuberay.pods_of(api, job_name, "critic")[0]["metadata"]["name"], "evicted")
    wait_for(lambda: status(api, job_name)["roles"]["critic"]["restarts"] == 1, 10, "the first restart", operator.tail)
    wait_for(lambda: not kuberay.pods_of(api, job_name, "critic"), 10, "the critic gang deleted", operator.tail)
    kuberay.sync(api, job_name)
    wait_for(phase_is(api, job_name, "Running"), 10, "Running after the first restart", operator.tail)

    kuberay.fail(api, kuberay.pods_of(api, job_name, "critic")[1]["metadata"]["name"], "error")
    wait_for(phase_is(api, job_name, "Failed"), 10, "phase Failed", operator.tail)
    failed = condition(api, job_name, "Failed")
    assert failed["reason"] == "ReachedMaxRestarts" and "critic" in failed["message"]
    assert status(api, job_name)["roles"]["critic"]["restarts"] == 2
    assert events(api, job_name, "ReachedMaxRestarts")
    wait_for(lambda: api.get(RAYCLUSTERS, job_name) is None, 10, "the RayCluster torn down", operator.tail)

    # Sticky: more pod churn and a resume attempt change nothing.
    api.patch(RLTJ, job_name, {"spec": {"suspend": True}})
    api.patch(RLTJ, job_name, {"spec": {"suspend": False}})
    for pod in kuberay.pods_of(api, job_name):
        kuberay.fail(api, pod["metadata"]["name"], "deleted")
    holds(lambda: status(api, job_name)["phase"] == "Failed" and condition(api, job_name, "Failed") == failed
          and api.get(RAYCLUSTERS, job_name) is None, 2, "the terminal Failed condition")


def test_suspend_stops_the_runtime_and_resume_brings_it_back(api: Client, operator: OperatorProcess, job_name: str) -> None:
    running_job(api, operator, job_name)
    first = api.get(RAYCLUSTERS, job_name)["metadata"]["uid"]

    api.patch(RLTJ, job_name, {"spec": {"suspend": True}})
    wait_for(lambda: api.get(RAYCLUSTERS, job_name) is None and api.get(JOBS, f"{job_name}-driver") is None, 10,
             "RayCluster and driver Job deleted", operator.tail)
    wait_for(phase_is(api, job_name, "Suspended"), 10, "phase Suspended", operator.tail)
    assert condition(api, job_name, "Suspended")["status"] == "True"
    assert api.get(CONFIGMAPS, f"{job_name}-spec") and api.get(CONFIGMAPS, f"{job_name}-progress")
    for pod in kuberay.pods_of(api, job_name):  # garbage collection, which the test server lacks
        api.delete(PODS, pod["metadata"]["name"])
    holds(phase_is(api, job_name, "Suspended"), 1, "Suspended, with no restarts counted")
    assert status(api, job_name)["restarts"] == 0
    api.patch(RLTJ, job_name, {"spec": {"roles": {"critic": {"replicas": 1}}}})  # applied on resume

    api.patch(RLTJ, job_name, {"spec": {"suspend": False}})
    wait_for(lambda: api.get(RAYCLUSTERS, job_name) and api.get(JOBS, f"{job_name}-driver"), 10,
             "a new RayCluster and driver Job", operator.tail)
    cluster = api.get(RAYCLUSTERS, job_name)
    assert cluster["metadata"]["uid"] != first
    assert [g["replicas"] for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "critic"] == [1]
    assert "replicas: 1" in api.get(CONFIGMAPS, f"{job_name}-spec")["data"]["job.yaml"]
    kuberay.sync(api, job_name)
    wait_for(phase_is(api, job_name, "Running"), 10, "Running after resume", operator.tail)
    assert condition(api, job_name, "Suspended")["status"] == "False" and status(api, job_name)["restarts"] == 0


def test_a_running_job_keeps_its_spec_until_resumed(api: Client, operator: OperatorProcess, job_name: str) -> None:
    running_job(api, operator, job_name)
    cluster = api.get(RAYCLUSTERS, job_name)
    api.patch(RLTJ, job_name, {"spec": {"trainer": {"steps": 7}}})
    event = wait_for(lambda: events(api, job_name, "SpecChangePending"), 10, "a SpecChangePending Event", operator.tail)
    assert "spec.trainer" in event[0]["message"]
    assert "steps: 7" in api.get(CONFIGMAPS, f"{job_name}-spec")["data"]["job.yaml"]
    assert api.get(RAYCLUSTERS, job_name) == cluster and status(api, job_name)["phase"] == "Running"


def test_objects_made_for_the_job_are_adopted_not_duplicated(api: Client, operator: OperatorProcess, job_name: str) -> None:
    # As after `kuberl render job.yaml | kubectl apply -f -`: the children exist before the job, unowned.
    from kuberl.spec import validate_manifest

    from kuberl_operator import builders
    body = manifest(job_name)
    made = builders.all_objects(validate_manifest(body), body["spec"], "token",
                                builders.BuildOptions(namespace=api.namespace, image="kuberl-runtime:test"))
    plural = {"ConfigMap": CONFIGMAPS, "RayCluster": RAYCLUSTERS}
    before = {o["metadata"]["name"]: api.create(plural[o["kind"]], o)["metadata"]["uid"]
              for o in made if o["kind"] in plural}
    job = api.create(RLTJ, body)
    for res, name in [(CONFIGMAPS, f"{job_name}-spec"), (CONFIGMAPS, f"{job_name}-progress"), (RAYCLUSTERS, job_name)]:
        obj = wait_for(lambda: (o := api.get(res, name)) and o["metadata"].get("ownerReferences") and o, 10,
                       f"{name} adopted", operator.tail)
        assert obj["metadata"]["uid"] == before[name] and obj["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    kuberay.sync(api, job_name)
    wait_for(phase_is(api, job_name, "Running"), 10, "phase Running", operator.tail)
    assert len(api.list(RAYCLUSTERS, f"kuberl.io/job={job_name}")) == 1


def test_children_deleted_by_hand_come_back(api: Client, operator: OperatorProcess, job_name: str) -> None:
    running_job(api, operator, job_name)
    api.delete(JOBS, f"{job_name}-driver")
    api.delete(RAYCLUSTERS, job_name)
    wait_for(lambda: api.get(RAYCLUSTERS, job_name) and api.get(JOBS, f"{job_name}-driver"), 10,
             "the RayCluster and driver Job recreated by the periodic pass", operator.tail)
    assert len(api.list(RAYCLUSTERS, f"kuberl.io/job={job_name}")) == 1


def test_delete_removes_owned_objects_and_releases_the_finalizer(api: Client, operator: OperatorProcess, job_name: str) -> None:
    running_job(api, operator, job_name)
    api.delete(RLTJ, job_name)
    wait_for(lambda: api.get(RLTJ, job_name) is None, 10, "the job gone (finalizer released)", operator.tail)
    left = [(res, pattern.format(job_name)) for res, pattern in CHILDREN if api.get(res, pattern.format(job_name))]
    assert left == []


def test_progress_is_mirrored_and_the_driver_outcome_ends_the_job(api: Client, operator: OperatorProcess, job_name: str) -> None:
    running_job(api, operator, job_name)
    report = {"step": 7, "totalSteps": 60, "tokensPerSec": 1234.5, "phase": "Running",
              "message": "step 7/60", "roles": {"critic": {"restarts": 1}, "actor": {"worstLink": "PIX"}}}
    api.patch(CONFIGMAPS, f"{job_name}-progress", {"data": {"progress": json.dumps(report)}})
    st = wait_for(lambda: status(api, job_name).get("step") == 7 and status(api, job_name), 10, "step mirrored", operator.tail)
    assert (st["totalSteps"], st["tokensPerSec"], st["message"]) == (60, 1234.5, "step 7/60")
    assert st["roles"]["critic"]["restarts"] == 1 and st["restarts"] == 1
    assert st["roles"]["actor"]["worstLink"] == "PIX"
    link = f'kuberl_operator_role_worst_link_score{{job="{job_name}",level="PIX",namespace="kuberl-test",role="actor"}} 5.0'
    wait_for(lambda: link in http_get(operator.metrics_url)[1], 10, "the worst-link series on /metrics", operator.tail)

    api.patch(CONFIGMAPS, f"{job_name}-progress", {"data": {"progress": "not json"}})  # ignored, not fatal
    holds(lambda: status(api, job_name).get("step") == 7, 1, "the last good progress")

    done = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    api.patch(JOBS, f"{job_name}-driver", {"status": done}, sub="status")
    wait_for(phase_is(api, job_name, "Succeeded"), 10, "phase Succeeded", operator.tail)
    assert condition(api, job_name, "Succeeded")["reason"] == "DriverSucceeded"
    wait_for(lambda: api.get(RAYCLUSTERS, job_name) is None, 10, "the RayCluster torn down", operator.tail)
    assert api.get(JOBS, f"{job_name}-driver") is not None  # kept: its logs are the training log


def test_failed_driver_fails_the_job(api: Client, operator: OperatorProcess, job_name: str) -> None:
    running_job(api, operator, job_name)
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                              "message": "Job has reached the specified backoff limit"}], "failed": 3}
    api.patch(JOBS, f"{job_name}-driver", {"status": failed}, sub="status")
    wait_for(phase_is(api, job_name, "Failed"), 10, "phase Failed", operator.tail)
    cond = condition(api, job_name, "Failed")
    assert cond["reason"] == "DriverFailed" and "backoff limit" in cond["message"]


def test_the_drivers_reason_names_the_failure(api: Client, operator: OperatorProcess, job_name: str) -> None:
    running_job(api, operator, job_name)
    report = {"step": 0, "phase": "Failed", "reason": "PlacementDegraded",
              "message": "role actor: worst GPU link SYS, below spec.placement.minLink PIX"}
    api.patch(CONFIGMAPS, f"{job_name}-progress", {"data": {"progress": json.dumps(report)}})
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
                              "message": "Container driver exited with code 3"}], "failed": 1}
    api.patch(JOBS, f"{job_name}-driver", {"status": failed}, sub="status")
    wait_for(phase_is(api, job_name, "Failed"), 10, "phase Failed", operator.tail)
    assert condition(api, job_name, "Failed")["reason"] == "PlacementDegraded"
    assert condition(api, job_name, "PlacementDegraded")["status"] == "True"
    assert "spec.placement.minLink" in condition(api, job_name, "Failed")["message"]


def test_a_dra_job_gets_claim_templates_that_its_workers_use(api: Client, operator: OperatorProcess, job_name: str) -> None:
    from kuberl.spec import validate_manifest

    from kuberl_operator import builders
    body = manifest(job_name, placement={"mode": "dra", "policy": "required", "minLink": "PIX"},
                    roles={"actor": {"replicas": 2, "gpus": 2}, "critic": {"replicas": 2, "gpus": 1}, "ref": {"gpus": 1}},
                    image="registry.example.com/kuberl:9", trainer={"checkpoint": {"volumeClaim": "ckpt"}})
    # As after `kuberl render job.yaml | kubectl apply -f -`: the actor's template exists, unowned.
    rendered = builders.gpu_claim_template(validate_manifest(body), "actor", builders.BuildOptions(namespace=api.namespace))
    first = api.create(RESOURCECLAIMTEMPLATES, rendered)["metadata"]["uid"]
    job = api.create(RLTJ, body)
    cluster = wait_for(lambda: api.get(RAYCLUSTERS, job_name), 10, "the RayCluster", operator.tail)

    def templates() -> dict[str, dict[str, Any]]:
        return {t["metadata"]["name"]: t for t in api.list(RESOURCECLAIMTEMPLATES, f"kuberl.io/job={job_name}")}
    made = templates()
    assert sorted(made) == [f"{job_name}-{role}-gpus" for role in ("actor", "critic", "ref")]  # reward: CPU
    assert made[f"{job_name}-actor-gpus"]["metadata"]["uid"] == first  # adopted, not duplicated
    for template in made.values():
        owners = wait_for(lambda: api.get(RESOURCECLAIMTEMPLATES, template["metadata"]["name"])["metadata"].get("ownerReferences"),
                          10, "the template adopted", operator.tail)
        assert [o["uid"] for o in owners] == [job["metadata"]["uid"]]
    assert made[f"{job_name}-actor-gpus"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2

    groups = {g["groupName"]: g["template"]["spec"] for g in cluster["spec"]["workerGroupSpecs"]}
    driver = api.get(JOBS, f"{job_name}-driver")["spec"]["template"]["spec"]
    for role in ("actor", "critic", "ref"):
        container = groups[role]["containers"][0]
        assert groups[role]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": f"{job_name}-{role}-gpus"}]
        assert container["resources"]["claims"] == [{"name": "gpus"}] and "nvidia.com/gpu" not in container["resources"]["limits"]
    for pod in [*groups.values(), driver]:  # the job's own image, and the checkpoint PVC in every pod that works
        assert pod["containers"][0]["image"] == "registry.example.com/kuberl:9"
        assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod["volumes"]
        assert {"name": "checkpoints", "mountPath": "/checkpoints"} in pod["containers"][0]["volumeMounts"]
    assert "path: /checkpoints" in api.get(CONFIGMAPS, f"{job_name}-spec")["data"]["job.yaml"]
    kuberay.sync(api, job_name)  # worker pods made from the templates pass Pod validation
    wait_for(phase_is(api, job_name, "Running"), 10, "phase Running", operator.tail)

    # Templates are immutable: suspend removes them with the RayCluster, resume makes them anew.
    api.patch(RLTJ, job_name, {"spec": {"suspend": True}})
    wait_for(lambda: not templates() and api.get(RAYCLUSTERS, job_name) is None, 10, "templates deleted on suspend", operator.tail)
    for pod in kuberay.pods_of(api, job_name):
        api.delete(PODS, pod["metadata"]["name"])
    api.patch(RLTJ, job_name, {"spec": {"suspend": False, "roles": {"actor": {"gpus": 4}}}})
    again = wait_for(lambda: len(templates()) == 3 and templates(), 10, "templates recreated on resume", operator.tail)
    assert again[f"{job_name}-actor-gpus"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 4

    api.delete(RLTJ, job_name)
    wait_for(lambda: api.get(RLTJ, job_name) is None and not templates(), 10, "the templates deleted with the job", operator.tail)


@pytest.mark.parametrize("placement, roles, field", [
    ({"policy": "required"}, {"actor": {"gpus": 16}}, "spec.roles.actor.gpus"),
    ({"policy": "required", "mode": "dra", "minLink": "NV"}, {"actor": {"gpus": 4}}, "spec.placement.minLink"),
], ids=["replica-bigger-than-a-node", "dra-cannot-ask-for-nvlink"])
def test_an_impossible_required_placement_fails_before_anything_is_made(
        api: Client, operator: OperatorProcess, job_name: str, placement: dict, roles: dict, field: str) -> None:
    api.create(RLTJ, manifest(job_name, placement=placement, roles=roles))
    wait_for(phase_is(api, job_name, "Failed"), 10, "phase Failed", operator.tail)
    failed, degraded = condition(api, job_name, "Failed"), condition(api, job_name, "PlacementDegraded")
    assert failed["reason"] == "PlacementDegraded" and failed["observedGeneration"] == 1
    assert degraded["status"] == "True" and field in degraded["message"] and "role actor" in degraded["message"]
    event = wait_for(lambda: events(api, job_name, "PlacementDegraded"), 10, "a PlacementDegraded Event", operator.tail)
    assert event[0]["type"] == "Warning" and field in event[0]["message"]
    # Nothing made, nothing retried, no crash: one Event, and the operator goes on.
    holds(lambda: len(events(api, job_name, "PlacementDegraded")) == 1 and operator.alive()
          and not any(api.get(res, pattern.format(job_name)) for res, pattern in CHILDREN)
          and not api.list(RESOURCECLAIMTEMPLATES, f"kuberl.io/job={job_name}"), 2, "nothing created")
    assert status(api, job_name)["phase"] == "Failed"


def test_operator_restart_adopts_what_exists(api: Client, operator: OperatorProcess, job_name: str) -> None:
    pods = running_job(api, operator, job_name)
    kuberay.fail(api, next(p for p in pods if p["metadata"]["labels"].get("kuberl.io/role") == "ref")["metadata"]["name"], "oom")
    wait_for(lambda: status(api, job_name)["roles"]["ref"]["restarts"] == 1, 10, "a counted ref restart", operator.tail)
    before = {(res, pattern): api.get(res, pattern.format(job_name))["metadata"]["uid"] for res, pattern in CHILDREN}

    operator.stop(signal.SIGKILL)  # a crash: no cleanup, no goodbye
    kuberay.sync(api, job_name)  # the world moves on while the operator is away
    operator.start(via="cli")
    wait_for(phase_is(api, job_name, "Running"), 15, "Running under the new operator", operator.tail)

    after = {(res, pattern): api.get(res, pattern.format(job_name))["metadata"]["uid"] for res, pattern in CHILDREN}
    assert after == before
    for res, _ in CHILDREN:
        assert len([o for o in api.list(res, f"kuberl.io/job={job_name}")]) == [r for r, _ in CHILDREN].count(res)
    holds(lambda: status(api, job_name)["roles"]["ref"]["restarts"] == 1, 1, "the old failure counted once")

    critic = kuberay.pods_of(api, job_name, "critic")[0]["metadata"]["name"]
    kuberay.fail(api, critic, "oom")  # the new process does the work
    wait_for(lambda: status(api, job_name)["roles"]["critic"]["restarts"] == 1, 10, "a restart seen by the new operator", operator.tail)


def test_metrics_and_health_endpoints(api: Client, operator: OperatorProcess, job_name: str) -> None:
    running_job(api, operator, job_name)
    ready = f'kuberl_operator_role_ready_replicas{{job="{job_name}",namespace="kuberl-test",role="actor"}} 2.0'
    text = wait_for(lambda: (r := http_get(operator.metrics_url))[0] == 200 and ready in r[1] and r[1], 10,
                    "the job's series on /metrics", operator.tail)
    for metric in ("kuberl_operator_jobs", "kuberl_operator_role_ready_replicas", "kuberl_operator_role_desired_replicas",
                   "kuberl_operator_role_restarts_total", "kuberl_operator_reconcile_errors_total",
                   "kuberl_operator_reconcile_duration_seconds_bucket"):
        assert f"\n{metric}" in text, metric
    assert f'kuberl_operator_role_desired_replicas{{job="{job_name}",namespace="kuberl-test",role="actor"}} 2.0' in text
    assert f'kuberl_operator_role_restarts_total{{job="{job_name}",namespace="kuberl-test",role="critic"}} 0.0' in text
    running = [line for line in text.splitlines() if line.startswith('kuberl_operator_jobs{phase="Running"}')]
    assert running and float(running[0].split()[-1]) >= 1
    code, body = http_get(operator.liveness_url)
    assert code == 200 and "jobs" in json.loads(body)
