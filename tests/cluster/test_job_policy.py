"""One job must not stop the operator for every namespace: the bounded config, on the real stack.

An extra role's `config` is free-form. Nested a few thousand levels deep, it fails kopf's watch of RLTrainingJobs
(Python's json raises RecursionError), and kopf 1.45 then ends the whole operator (exit 1); restarted, it lists the
same job and fails again: no job in any namespace is reconciled while that one exists. The chart's job policy now
refuses a config nested more than CONFIG_MAX_DEPTH deep, so no such job gets in; one made before the policy (shown
here by unbinding it) must be deleted by hand, and the operator's log names the failed watch.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from localkube.api import NAMESPACES, RLTJ, Api, ApiError

from kuberl.spec.model import CONFIG_MAX_DEPTH
from tests.chart.render import Helm

from .conftest import RELEASE
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
        admin.delete(NAMESPACES, other.namespace, namespace=None)


def test_a_job_the_watch_cannot_parse_ends_the_operator_until_deleted(ns: Api, admin: Api, release: str,
                                                            operator: OperatorProcess, job_name: str) -> None:
    """Made while the policy is unbound (as before the chart had it), a deep job fails kopf's watch, and kopf ends
    the operator (exit 1, the watch and the RecursionError in its log); once it is deleted, a new operator process
    runs jobs again."""
    binding = admin.get(BINDINGS, JOB_POLICY, namespace=None)
    assert binding is not None, f"the chart's {JOB_POLICY} binding is missing"
    admin.delete(BINDINGS, JOB_POLICY, namespace=None)
    try:
        deep = with_config(f"{job_name}-deep", 3000)
        wait_for(lambda: try_create(ns, deep), 30, "the deep job made, the policy unbound")
    finally:
        admin.create(BINDINGS, {"metadata": {"name": JOB_POLICY, "labels": binding["metadata"].get("labels", {})},
                                "spec": binding["spec"]}, namespace=None)
    try:
        proc = operator.proc
        assert proc is not None
        wait_for(lambda: proc.poll() is not None, 60, "the operator to exit", operator.tail)
        assert proc.returncode == 1, operator.tail()
        log = operator.log_path.read_text()
        assert "Watcher for rltrainingjobs" in log and "maximum recursion depth exceeded" in log, operator.tail()
    finally:
        ns.delete(RLTJ, f"{job_name}-deep")
        operator.start()
    ns.create(RLTJ, manifest(job_name))
    wait_for(lambda: status(ns, job_name).get("phase") == "Running", 90, "a job Running under the new operator",
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


@pytest.mark.parametrize("spec, words", [
    ({"trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "/opt/kuberl"}}}, "must not be, or lie under"),
    ({"trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "/etc"}}}, "must not be, or lie under"),
    ({"trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "/mnt/../etc"}}}, "nor contain '..'"),
    ({"roles": {"critic": {"tolerations": [{"operator": "Exists"}]}}}, "tolerates every taint"),
    ({"roles": {"ref": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}}}, "control plane"),
])
def test_what_a_jobs_author_may_not_choose_is_refused(ns: Api, release: str, job_name: str, spec: dict[str, Any],
                                                      words: str) -> None:
    """The chart's defaults: a checkpoint claim mounted over the image's or the system's directories, a toleration
    of every taint, the control plane as a node selector; each refused at admission, naming the field and the fix."""
    assert words in refusal(ns, json.dumps(manifest(job_name, suspend=True, **spec)))


def test_a_job_within_the_policy_is_admitted(ns: Api, release: str, job_name: str) -> None:
    body = manifest(job_name, suspend=True, trainer={"checkpoint": {"volumeClaim": "ckpt", "path": "/mnt/ckpt"}},
                    roles={"critic": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                                      "priorityClassName": "batch", "runtimeClassName": "nvidia"},
                           "extra": {"rules": {"worker": "examples.rule_engine:RuleEngineWorker"}}},
                    placement={"mode": "dra", "deviceClass": "gpu.example.com"}, image="reg.example.com/kuberl:1")
    ns.create(RLTJ, body)


POLICIES = "admissionregistration.k8s.io/v1/validatingadmissionpolicies"
STRICT = {"jobPolicy": {"enabled": True, "allowedImages": ["reg.example.com/ml/"], "allowedVolumeClaims": ["ckpt"],
                        "forbiddenMountPaths": ["/opt"], "allowedPriorityClasses": ["batch"],
                        "allowedRuntimeClasses": ["nvidia"], "allowedDeviceClasses": ["gpu.nvidia.com"],
                        "allowWildcardTolerations": False}}


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


@pytest.mark.parametrize("spec, words", [
    ({"image": "docker.io/evil/miner:1"}, "spec.image must start with one of reg.example.com/ml/"),
    ({"trainer": {"checkpoint": {"volumeClaim": "team-b-data"}}}, "volumeClaim must be one of ckpt"),
    ({"trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "/opt/x"}}}, "must not be, or lie under"),
    ({"roles": {"actor": {"priorityClassName": "system-cluster-critical"}}}, "priorityClassName must be one of"),
    ({"roles": {"extra": {"rules": {"worker": "examples.rule_engine:RuleEngineWorker", "runtimeClassName": "x"}}}},
     "runtimeClassName must be one of"),
    ({"placement": {"mode": "dra", "deviceClass": "any.example.com"}}, "deviceClass must be one of"),
])
def test_a_platforms_allow_lists_are_enforced(ns: Api, release: str, strict_policy: Any, job_name: str,
                                              spec: dict[str, Any], words: str) -> None:
    allowed = manifest(f"{job_name}-ok", suspend=True, image="reg.example.com/ml/kuberl:1",
                       trainer={"checkpoint": {"volumeClaim": "ckpt", "path": "/checkpoints"}})
    wait_for(lambda: try_create(ns, json.dumps(allowed)), 10, "an allowed job admitted")
    text = json.dumps(manifest(job_name, suspend=True, **spec))
    assert words in wait_for(lambda: refused_now(ns, text), 10, "the strict policy to apply")


def refused_now(ns: Api, text: str) -> str | None:
    """The refusal of ``text``, or None (deleting what was made) while a new binding is not yet in force."""
    try:
        create(ns, text)
    except ApiError as exc:
        assert exc.status in (403, 422), exc
        return exc.message
    ns.delete(RLTJ, json.loads(text)["metadata"]["name"])
    time.sleep(0.5)
    return None
