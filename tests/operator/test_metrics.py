"""The operator's families follow the statuses it writes: each job's phase, per-role replicas,
restarts and budgets, and nothing of a deleted job."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kuberl.spec import load_manifest
from kuberl_operator.metrics import FAMILIES, PHASES, Metrics

SPEC = load_manifest(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml").spec


def samples(m: Metrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    from prometheus_client import generate_latest

    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def roles(restarts: int = 0, ready: int = 1) -> dict:
    return {r: {"desired": 1, "ready": ready, "restarts": restarts if r == "critic" else 0}
            for r in ("actor", "critic", "ref", "reward")}


def test_job_phase_is_one_for_the_current_phase_only() -> None:
    m = Metrics()
    m.observe("ns", "a", {"phase": "Running", "roles": roles()}, SPEC)
    m.observe("ns", "b", {"phase": "Failed", "roles": roles(restarts=4, ready=0)})
    got = samples(m)["kuberl_operator_job_phase"]
    assert len(got) == 2 * len(PHASES)
    assert {dict(k)["job"]: dict(k)["phase"] for k, v in got.items() if v == 1} == {"a": "Running", "b": "Failed"}
    jobs = {dict(k)["phase"]: v for k, v in samples(m)["kuberl_operator_jobs"].items()}
    assert jobs["Running"] == 1 and jobs["Failed"] == 1 and sum(jobs.values()) == 2


def test_roles_and_budgets_follow_the_status_and_spec() -> None:
    m = Metrics()
    m.observe("ns", "a", {"phase": "Running", "roles": roles(restarts=2)}, SPEC)
    s = samples(m)
    key = (("job", "a"), ("namespace", "ns"), ("role", "critic"))
    assert s["kuberl_operator_role_restarts_total"][key] == 2
    assert s["kuberl_operator_role_max_restarts"][key] == SPEC.roles.critic.max_restarts
    assert s["kuberl_operator_role_ready_replicas"][key] == 1 and s["kuberl_operator_role_desired_replicas"][key] == 1
    # A status write without a spec (a finished job's sticky status) keeps the budgets it knew.
    m.observe("ns", "a", {"phase": "Failed", "roles": roles(restarts=4, ready=0)})
    s = samples(m)
    assert s["kuberl_operator_role_restarts_total"][key] == 4 and s["kuberl_operator_role_ready_replicas"][key] == 0
    assert s["kuberl_operator_role_max_restarts"][key] == SPEC.roles.critic.max_restarts


def test_a_deleted_job_leaves_no_series() -> None:
    m = Metrics()
    m.observe("ns", "a", {"phase": "Running", "roles": roles()}, SPEC)
    m.forget("ns", "a")
    s = samples(m)
    assert not any(("job", "a") in k for series in s.values() for k in series)


def test_reconcile_errors_count_failures_not_waits() -> None:
    m = Metrics()
    with pytest.raises(kopf.TemporaryError), m.reconcile():
        raise kopf.TemporaryError("waiting", delay=1)
    with pytest.raises(RuntimeError), m.reconcile():
        raise RuntimeError("boom")
    s = samples(m)
    assert s["kuberl_operator_reconcile_errors_total"][()] == 1
    assert s["kuberl_operator_reconcile_duration_seconds_count"][()] == 2


def test_every_family_is_served() -> None:
    m = Metrics()
    status = {"phase": "Running", "roles": {**roles(), "actor": {**roles()["actor"], "worstLink": "PIX"}}}
    m.observe("ns", "a", status, SPEC)
    m.request("watch", "pods", 200)
    m.cache_sizes = lambda: {"rayclusters": 1}
    with m.reconcile():
        pass
    served = set(samples(m))
    for name, (kind, _, _) in FAMILIES.items():
        assert (f"{name}_count" if kind == "histogram" else name) in served, name


def test_api_requests_are_counted_by_verb_resource_and_code_and_watches_as_starts() -> None:
    m = Metrics()
    for verb, resource, code in [("watch", "pods", 200), ("watch", "pods", 200), ("patch", "rltrainingjobs/status",
                                                                                 409), ("create", "secrets", 409)]:
        m.request(verb, resource, code)
    m.cache_sizes = lambda: {"rayclusters": 3, "jobs": 2}
    s = samples(m)
    requests = {tuple(v for _, v in k): n for k, n in s["kuberl_operator_api_requests_total"].items()}
    assert requests[("200", "pods", "watch")] == 2 and requests[("409", "rltrainingjobs/status", "patch")] == 1
    assert s["kuberl_operator_watch_starts_total"] == {(("resource", "pods"),): 2}
    assert s["kuberl_operator_cache_objects"] == {(("resource", "jobs"),): 2, (("resource", "rayclusters"),): 3}
