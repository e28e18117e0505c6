"""Least privilege: the chart grants exactly the verbs the operator's code uses, no more, no fewer.

The needs are derived from operator/kuberl_operator, not written down twice:
- kopf's handlers (its registry after importing the handlers): every watched or indexed resource is
  listed and watched; resources with change handlers are patched (finalizer, kopf's annotations,
  status through the status subresource); kopf posts Events;
- the operator's own API calls (an AST scan of ``ctx.kube.create/patch/delete/list(RESOURCE, ...)``; a
  ``list(RESOURCE, None)`` reads across the cluster, which only a ClusterRole grants);
- ``reconcile.ensure`` (create, patch) for every object ``builders.all_objects`` makes, but
  ``reconcile.create_once`` (create) for those in ``reconcile.CREATE_ONLY`` (Secrets), and
  ``reconcile.delete_owned`` (delete) for every object ``reconcile.children`` names; these read from the
  watch-backed cache, so each such kind is indexed (list, watch), never read with a get;
- what the driver's Role grants: RBAC lets only a holder of a permission grant it (no escalate here).
kopf's own cluster-scoped reads (CRDs always; namespaces when it watches a list of them) are fixed.
"""

from __future__ import annotations

import ast
from collections import defaultdict

import pytest
import yaml

from .render import REPO, Helm, by_kind, one

Needs = dict[tuple[str, str], set[str]]
OPERATOR = REPO / "operator" / "kuberl_operator"
GENERIC = {"ensure": {"create", "patch"}, "create_once": {"create"}, "delete_owned": {"delete"},
           "post_events": {"create"}}
KOPF_CLUSTER = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}
KOPF_NAMESPACES = {("", "namespaces"): {"list", "watch"}}


def kopf_needs() -> Needs:
    from kopf._core.intents import registries

    import kuberl_operator.handlers  # noqa: F401  (registers the handlers)

    registry = registries.get_default_registry()
    assert not registry._webhooks.get_all_handlers(), "admission webhooks need RBAC for webhook configurations"
    crd = yaml.safe_load((REPO / "crds" / "rltrainingjobs.kuberl.io.yaml").read_text())
    status_plurals = {crd["spec"]["names"]["plural"]} if any(
        "status" in (v.get("subresources") or {}) for v in crd["spec"]["versions"]) else set()
    needs: Needs = defaultdict(set)
    for kind in ("_indexing", "_watching", "_changing", "_spawning"):
        for handler in getattr(registry, kind).get_all_handlers():
            key = (handler.selector.group or "", handler.selector.plural or handler.selector.any_name)
            needs[key] |= {"list", "watch"}
            if kind == "_changing":
                needs[key].add("patch")
                if key[1] in status_plurals:
                    needs[(key[0], f"{key[1]}/status")].add("patch")
    needs[("", "events")].add("create")
    return needs


def api_calls() -> Needs:  # noqa: C901 -- one branch per call shape the operator's source holds
    """``<x>.kube.<verb>(RESOURCE, ...)`` calls in the operator, plus the generic helpers' objects."""
    from kuberl.spec import load_manifest
    from kuberl_operator import builders, kube, reconcile

    resources = {name: value for name, value in vars(kube).items() if isinstance(value, kube.Resource)}
    needs: Needs = defaultdict(set)
    problems = []
    for path in sorted(OPERATOR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for call in [n for n in ast.walk(func) if isinstance(n, ast.Call)]:
                f = call.func
                on_kube = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "kube"
                if on_kube and f.attr == "request":
                    problems.append(f"{path.name}:{call.lineno} {func.name}: a raw kube.request; "
                                    f"teach tests/chart/test_rbac.py which resource and verb it uses")
                if not (on_kube and f.attr in {"create", "patch", "json_patch", "delete", "list"}):
                    continue
                first = call.args[0] if call.args else None
                if f.attr == "list" and isinstance(call.args[1], ast.Constant) and call.args[1].value is None:
                    continue  # across the cluster: `cluster_calls`
                if isinstance(first, ast.Name) and first.id in resources:
                    res = resources[first.id]
                    sub = next((k.value.value for k in call.keywords if k.arg == "sub" and isinstance(k.value,
                                                                                                      ast.Constant)),
                                                                                                      None)
                    verb = "patch" if f.attr == "json_patch" else f.attr
                    needs[(res.group, f"{res.plural}/{sub}" if sub else res.plural)].add(verb)
                elif func.name not in GENERIC:
                    problems.append(f"{path.name}:{call.lineno} {func.name}: kube.{f.attr} on a computed resource; "
                                    f"teach tests/chart/test_rbac.py where its resources come from")
    assert not problems, "\n".join(problems)
    for example in ("ppo-gpu.yaml", "ppo-gpu-dra.yaml"):  # device-plugin and DRA jobs create different kinds
        job = load_manifest(REPO / "examples" / example)
        raw = yaml.safe_load((REPO / "examples" / example).read_text())["spec"]
        for obj in builders.all_objects(job, raw, "token", builders.BuildOptions(namespace="ns")):
            res = kube.resource_of(obj)
            needs[(res.group, res.plural)] |= GENERIC["create_once" if res in reconcile.CREATE_ONLY else "ensure"]
    for res, _ in reconcile.children("job"):
        needs[(res.group, res.plural)] |= GENERIC["delete_owned"]
    job = load_manifest(REPO / "examples" / "ppo-gpu.yaml")
    for role in [o for o in builders.driver_rbac(job, builders.BuildOptions(namespace="ns")) if o["kind"] == "Role"]:
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    needs[(group, resource)] |= set(rule["verbs"])
    event = reconcile.event_object({"apiVersion": "v", "kind": "K", "metadata": {"name": "j", "namespace": "ns",
                                                                                "uid": "u"}},
                                   reconcile.Event("Normal", "R", "m"), "t")
    res = kube.resource_of(event)
    needs[(res.group, res.plural)] |= GENERIC["post_events"]
    return needs


def cluster_calls() -> Needs:
    """``<x>.kube.list(RESOURCE, None, ...)``: the operator's reads across the cluster (gang scheduling's)."""
    from kuberl_operator import kube

    resources = {name: value for name, value in vars(kube).items() if isinstance(value, kube.Resource)}
    needs: Needs = defaultdict(set)
    for path in sorted(OPERATOR.glob("*.py")):
        for call in [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]:
            f = call.func
            if (isinstance(f, ast.Attribute) and f.attr == "list" and isinstance(f.value, ast.Attribute)
                    and f.value.attr == "kube" and isinstance(call.args[1], ast.Constant)
                    and call.args[1].value is None):
                res = resources[call.args[0].id]
                needs[(res.group, res.plural)].add("list")
    return needs


def test_what_the_operator_ensures_or_deletes_it_reads_from_its_cache() -> None:
    """Every kind `ensure` and `delete_owned` handle but the Secret is indexed whole, so neither ever GETs."""
    from kuberl.spec import load_manifest
    from kuberl_operator import builders, kube, reconcile

    kinds = {res for res, _ in reconcile.children("job")}
    for example in ("ppo-gpu.yaml", "ppo-gpu-dra.yaml"):
        job = load_manifest(REPO / "examples" / example)
        raw = yaml.safe_load((REPO / "examples" / example).read_text())["spec"]
        objects = builders.all_objects(job, raw, "t", builders.BuildOptions(namespace="n"))
        kinds |= {kube.resource_of(o) for o in objects}
    assert kinds - reconcile.CREATE_ONLY <= set(reconcile.CACHED), kinds - set(reconcile.CACHED)


def merge(*parts: Needs) -> Needs:
    out: Needs = defaultdict(set)
    for part in parts:
        for key, verbs in part.items():
            out[key] |= verbs
    return dict(out)


def granted(rules: list[dict]) -> Needs:
    out: Needs = defaultdict(set)
    for rule in rules:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert "*" not in (group, resource) and "*" not in rule["verbs"], f"wildcard in {rule}"
                out[(group, resource)] |= set(rule["verbs"])
    return dict(out)


def compare(granted_: Needs, needed: Needs) -> list[str]:
    problems = []
    for key in sorted(set(granted_) | set(needed)):
        have, need = granted_.get(key, set()), needed.get(key, set())
        group, resource = key
        if need - have:
            problems.append(f"missing {sorted(need - have)} on {group or 'core'}/{resource}")
        if have - need:
            problems.append(f"unused {sorted(have - need)} on {group or 'core'}/{resource} (least privilege)")
    return problems


@pytest.fixture(scope="module")
def namespaced_needs() -> Needs:
    return merge(kopf_needs(), api_calls())


def job_roles(objects: list[dict]) -> list[dict]:
    """The Roles for the watched namespaces (not the leader election's)."""
    return [r for r in by_kind(objects, "Role") if not r["metadata"]["name"].endswith("-leader")]


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses(helm: Helm, namespaced_needs: Needs) -> None:
    objects = helm.render()
    assert not job_roles(objects)
    problems = compare(granted(one(objects, "ClusterRole")["rules"]),
                       merge(namespaced_needs, KOPF_CLUSTER, cluster_calls()))
    assert not problems, "\n".join(problems)


def test_the_leader_election_may_touch_its_one_lease_only(helm: Helm) -> None:
    """leader.py's requests: create the Lease, then get and update it by name; nothing else, in the release's
    namespace only (create cannot be held to a name: the name is in the body)."""
    http = {"GET": "get", "PUT": "update", "POST": "create", "PATCH": "patch", "DELETE": "delete"}
    calls = [node for node in ast.walk(ast.parse((OPERATOR / "leader.py").read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "request"]
    assert {http[c.args[0].value] for c in calls} == {"get", "update", "create"}, "leader.py's requests changed"
    objects = helm.render()
    [role] = [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("-leader")]
    deploy = one(objects, "Deployment")
    lease = next(a for a in deploy["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--lease-name"))
    assert role["metadata"]["namespace"] == deploy["metadata"]["namespace"]
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease.partition("=")[2]],
         "verbs": ["get", "update"]},
    ]
    [binding] = [b for b in by_kind(objects, "RoleBinding") if b["metadata"]["name"].endswith("-leader")]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_namespaced_rbac_is_exactly_what_the_operator_uses(helm: Helm, namespaced_needs: Needs) -> None:
    objects = helm.render({"watchNamespaces": ["team-a", "team-b"]})
    for role in job_roles(objects):
        problems = compare(granted(role["rules"]), namespaced_needs)
        assert not problems, f"Role in {role['metadata']['namespace']}:\n" + "\n".join(problems)
    problems = compare(granted(one(objects, "ClusterRole")["rules"]),
                       merge(KOPF_CLUSTER, KOPF_NAMESPACES, cluster_calls()))
    assert not problems, "ClusterRole:\n" + "\n".join(problems)
