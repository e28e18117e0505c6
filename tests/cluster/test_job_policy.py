"""One job must not stop the operator for every namespace: the bounded config, on the real stack.

An extra role's `config` is free-form. Nested a few thousand levels deep, it fails kopf's watch of RLTrainingJobs
(Python's json raises RecursionError), and kopf 1.45 then ends the whole operator (exit 1); restarted, it lists the
same job and fails again: no job in any namespace is reconciled while that one exists. The chart's job policy now
refuses a config nested more than CONFIG_MAX_DEPTH deep, so no such job gets in; one made before the policy (shown
here by unbinding it) must be deleted by hand, and the operator's log names the failed watch.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from localkube.api import EVENTS, JOBS, NAMESPACES, RAYCLUSTERS, RLTJ, SECRETS, Api, ApiError

from kuberl.spec.contract import ExitCode
from kuberl.spec.model import CONFIG_MAX_DEPTH
from tests.chart.render import Helm
from tests.policy_cases import DEFAULT_ALLOWED, DEFAULT_REFUSED, STRICT, STRICT_ALLOWED, STRICT_REFUSED

from .conftest import RELEASE, delete_namespace
from .jobs import describe, manifest, status
from .operator_process import OperatorProcess
from .waits import wait_for

pytestmark = pytest.mark.netns
BINDINGS = "admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
JOB_POLICY = f"{RELEASE}-jobs"


def with_config(name: str, depth: int) -> str:
    """A suspended job's JSON whose extra role's config nests maps ``depth`` deep (kuberl.spec.model.nesting),
    written as text: json.dumps itself recurses, and fails past about 1000 levels."""
    extra = {"rules": {"worker": "examples.rule_engine:RuleEngineWorker", "config": "CONFIG"}}
    text = json.dumps(manifest(name, roles={"extra": extra}, suspend=True))
    return text.replace('"CONFIG"', '{"a": ' * (depth - 1) + '{"leaf": 1}' + "}" * (depth - 1))


def create(ns: Api, text: str) -> None:
    ns.request("POST", ns.url(RLTJ), text)


def refusal(ns: Api, text: str) -> str:
    with pytest.raises(ApiError) as err:
        create(ns, text)
    assert err.value.status in (403, 422), err.value
    return err.value.message


def test_a_config_nested_too_deep_is_refused_and_other_jobs_run(ns: Api, admin: Api, release: str,
                                                                operator: OperatorProcess, job_name: str) -> None:
    create(ns, with_config(f"{job_name}-ok", CONFIG_MAX_DEPTH))
    assert f"more than {CONFIG_MAX_DEPTH} deep" in refusal(ns, with_config(f"{job_name}-x", CONFIG_MAX_DEPTH + 1))
    assert "more than" in refusal(ns, with_config(f"{job_name}-deep", 3000))
    other = admin.in_namespace(f"{ns.namespace}-b")
    admin.create(NAMESPACES, {"metadata": {"name": other.namespace}}, namespace=None)
    try:
        other.create(RLTJ, manifest(job_name))
        wait_for(lambda: status(other, job_name).get("phase") == "Running", 90, "the other namespace's job Running",
                 lambda: describe(other, job_name) + operator.tail(30))
    finally:
        delete_namespace(admin, other.namespace)


def test_a_job_the_watch_cannot_parse_ends_the_operator_until_deleted(ns: Api, admin: Api, release: str,
                                                            operator: OperatorProcess, job_name: str) -> None:
    """Made while the policy is unbound (as before the chart had it), a deep job fails kopf's watch, and kopf ends
    the operator (a crash: exit 5, the watch and the RecursionError in its log); once it is deleted, a new operator
    process runs jobs again."""
    with unbound(admin, ns):
        deep = with_config(f"{job_name}-deep", 3000)
        wait_for(lambda: try_create(ns, deep), 30, "the deep job made, the policy unbound")
    try:
        proc = operator.proc
        assert proc is not None
        wait_for(lambda: proc.poll() is not None, 60, "the operator to exit", operator.tail)
        assert proc.returncode == ExitCode.CRASHED, operator.tail()
        log = operator.log_path.read_text()
        assert "Watcher for rltrainingjobs" in log and "maximum recursion depth exceeded" in log, operator.tail()
    finally:
        ns.delete(RLTJ, f"{job_name}-deep")
        operator.start()
    ns.create(RLTJ, manifest(job_name))
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "a job Running under the new operator",
             lambda: describe(ns, job_name) + operator.tail(30))


@contextlib.contextmanager
def unbound(admin: Api, ns: Api) -> Iterator[None]:
    """The chart's job policy out of force (its binding deleted) inside the block, as on a cluster without it;
    back in force (a job it refuses is refused in ``ns`` again) after."""
    binding = admin.get(BINDINGS, JOB_POLICY, namespace=None)
    assert binding is not None, f"the chart's {JOB_POLICY} binding is missing"
    admin.delete(BINDINGS, JOB_POLICY, namespace=None)
    try:
        yield
    finally:
        admin.create(BINDINGS, {"metadata": {"name": JOB_POLICY, "labels": binding["metadata"].get("labels", {})},
                                "spec": binding["spec"]}, namespace=None)
        probe = json.dumps(manifest("policy-probe", suspend=True, **copy.deepcopy(DEFAULT_REFUSED[0][0])))
        wait_for(lambda: refused_now(ns, probe), 30, "the job policy in force again")


@pytest.mark.parametrize("spec, words", DEFAULT_REFUSED[:1] + DEFAULT_REFUSED[3:4])
def test_without_the_admission_policy_the_operator_refuses_the_job_itself(
        ns: Api, admin: Api, release: str, operator: OperatorProcess, job_name: str, spec: dict[str, Any],
        words: str) -> None:
    """With the policy unbound (jobPolicy.enabled false, or a Kubernetes before 1.30), a job that breaks the rules
    gets in, and the operator fails it itself: reason PolicyDenied, an Event, and nothing made for it."""
    with unbound(admin, ns):
        text = json.dumps(manifest(job_name, **copy.deepcopy(spec)))
        wait_for(lambda: try_create(ns, text), 30, "the job made, the policy unbound")
    failed = wait_for(lambda: next((c for c in status(ns, job_name).get("conditions", [])
                                    if c["type"] == "Failed" and c["status"] == "True"), None), 60,
                      "the job Failed by the operator", lambda: describe(ns, job_name) + operator.tail(30))
    assert failed["reason"] == "PolicyDenied" and words in failed["message"], failed
    events = ns.list(EVENTS)
    assert [e for e in events if e.get("reason") == "PolicyDenied" and words in e.get("message", "")], events
    made = {res: [o["metadata"]["name"] for o in ns.list(res)] for res in (RAYCLUSTERS, JOBS, SECRETS)}
    assert not any(made.values()), f"the operator made objects for a refused job: {made}"
    # The policy back in force: the job, which it would refuse, can still be deleted (its finalizer released).
    ns.delete(RLTJ, job_name)
    wait_for(lambda: ns.get(RLTJ, job_name) is None, 30, "the refused job gone, the policy in force again",
             lambda: describe(ns, job_name) + operator.tail(30))


def try_create(ns: Api, text: str) -> bool:
    """Create the job ``text``; False while the API server still refuses it (a removed binding takes a moment)."""
    try:
        create(ns, text)
    except ApiError as exc:
        if exc.status in (403, 422):
            time.sleep(0.5)
            return False
        raise
    except RecursionError:  # made: the API server's answer, the job itself, is too deep for Python's json too
        pass
    return True


@pytest.mark.parametrize("spec, words", DEFAULT_REFUSED)
def test_what_a_jobs_author_may_not_choose_is_refused(ns: Api, release: str, job_name: str, spec: dict[str, Any],
                                                      words: str) -> None:
    """The chart's defaults: a checkpoint claim mounted over the image's or the system's directories, a toleration
    of every taint, the control plane as a node selector; each refused at admission, naming the field and the fix."""
    assert words in refusal(ns, json.dumps(manifest(job_name, suspend=True, **spec)))


def test_a_job_within_the_policy_is_admitted(ns: Api, release: str, job_name: str) -> None:
    body = manifest(job_name, suspend=True, **copy.deepcopy(DEFAULT_ALLOWED))
    ns.create(RLTJ, body)


def test_a_spec_edited_into_breaking_the_policy_is_refused_and_a_metadata_edit_is_not(ns: Api, release: str,
                                                                                       job_name: str) -> None:
    """The policy checks every new spec, on update as on create; an update that keeps the spec (a label, the
    operator's annotations and finalizer) is not its business."""
    ns.create(RLTJ, manifest(job_name, suspend=True, **copy.deepcopy(DEFAULT_ALLOWED)))
    spec, words = DEFAULT_REFUSED[0]
    with pytest.raises(ApiError) as err:
        ns.patch(RLTJ, job_name, {"spec": copy.deepcopy(spec)})
    assert err.value.status in (403, 422) and words in err.value.message, err.value
    ns.patch(RLTJ, job_name, {"metadata": {"labels": {"team": "a"}}})
    assert ns.get(RLTJ, job_name)["metadata"]["labels"]["team"] == "a"


POLICIES = "admissionregistration.k8s.io/v1/validatingadmissionpolicies"


@pytest.fixture
def strict_policy(admin: Api, helm: Helm, ns: Api) -> Any:
    """The chart's job policy rendered with a platform's allow-lists, bound to this test's namespace only."""
    rendered = [o for o in helm.render(STRICT) if o["metadata"]["name"].endswith("-jobs")
                and "-operator-" not in o["metadata"]["name"]]
    name = f"strict-{ns.namespace}"
    for obj in rendered:
        resource = POLICIES if obj["kind"] == "ValidatingAdmissionPolicy" else BINDINGS
        obj["metadata"] = {"name": name}
        if resource == BINDINGS:
            obj["spec"]["policyName"] = name
            obj["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": ns.namespace}}}
        admin.create(resource, obj, namespace=None)
    yield
    admin.delete(BINDINGS, name, namespace=None)
    admin.delete(POLICIES, name, namespace=None)


@pytest.mark.parametrize("spec, words", STRICT_REFUSED)
def test_a_platforms_allow_lists_are_enforced(ns: Api, release: str, strict_policy: Any, job_name: str,
                                              spec: dict[str, Any], words: str) -> None:
    allowed = manifest(f"{job_name}-ok", suspend=True, **copy.deepcopy(STRICT_ALLOWED))
    wait_for(lambda: try_create(ns, json.dumps(allowed)), 10, "an allowed job admitted")
    text = json.dumps(manifest(job_name, suspend=True, **spec))
    assert words in wait_for(lambda: refused_now(ns, text), 10, "the strict policy to apply")


def refused_now(ns: Api, text: str) -> str | None:
    """The refusal of ``text``, or None (deleting what was made) while a new binding is not yet in force."""
    try:
        create(ns, text)
    except ApiError as exc:
        if exc.status == 409:  # the one made a moment ago is still going (the operator releases its finalizer)
            time.sleep(0.5)
            return None
        assert exc.status in (403, 422), exc
        return exc.message
    ns.delete(RLTJ, json.loads(text)["metadata"]["name"])
    time.sleep(0.5)
    return None


def test_credentials_reach_the_pods_as_secret_references_through_the_operator_policy(
        ns: Api, release: str, operator: OperatorProcess, job_name: str) -> None:
    """A job naming its hub and W&B tokens: the operator's policy lets it make a RayCluster and a driver Job that
    read them (secretKeyRef, by name) and a driver pod whose reporter mounts its API token; no value anywhere."""
    from kuberl_operator import names

    ns.create(SECRETS, {"metadata": {"name": "hf"}, "stringData": {"token": "hf_s3cr3t_value"}})
    creds = {"huggingFace": {"name": "hf", "key": "token"}, "wandb": {"name": "hf", "key": "token"}}
    ns.create(RLTJ, manifest(job_name, credentials=creds))
    ctx = lambda: describe(ns, job_name) + operator.tail(30)  # noqa: E731
    driver = wait_for(lambda: ns.get(JOBS, names.driver(job_name)), 90, "the driver Job made", ctx)
    cluster = ns.get(RAYCLUSTERS, names.cluster(job_name))
    env = {e["name"]: e for e in driver["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert [e["name"] for e in worker["env"] if "secretKeyRef" in e.get("valueFrom", {})] == ["HF_TOKEN"]
    seen = json.dumps([driver, cluster, ns.get(RLTJ, job_name), ns.list(EVENTS)])
    assert "hf_s3cr3t_value" not in seen
