"""The chart's RBAC against what the operator really asked for: the API server's audit log.

The cluster audits every request of a ServiceAccount at Metadata level
(cluster/localkube/audit-policy.yaml): user, verb, resource, subresource and response code.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from localkube.api import CLUSTERROLES, Api

Permission = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


ATTACKER_AGENT = "kuberl-attack-test"  # the user agent of tests that make requests with the operator's token


def audit_events(path: Path, user: str) -> list[dict[str, Any]]:
    """The audit log's events of one user once answered (a watch is logged when its response starts), but
    for the attack tests' requests (test_operator_policy.py), which share the operator's token."""
    out = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if (event.get("user", {}).get("username") == user and event.get("userAgent") != ATTACKER_AGENT
                and event.get("stage") in ("ResponseStarted", "ResponseComplete")):
            out.append(event)
    return out


def permission(event: dict[str, Any]) -> Permission | None:
    ref = event.get("objectRef") or {}
    if not ref.get("resource"):
        return None  # discovery (/api, /apis, /version): not subject to RBAC rules on resources
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return ref.get("apiGroup", ""), resource, event["verb"]


def decision(event: dict[str, Any]) -> str | None:
    """The authorizer's verdict, "allow" or "forbid" (a 403 for another reason, such as a terminating
    namespace, is no RBAC matter)."""
    return (event.get("annotations") or {}).get("authorization.k8s.io/decision")


def used(events: list[dict[str, Any]]) -> set[Permission]:
    return {p for e in events if (p := permission(e)) and decision(e) == "allow"}


def forbidden(events: list[dict[str, Any]]) -> list[str]:
    return sorted({f"{e['verb']} {e.get('requestURI')}" for e in events if decision(e) == "forbid"})


def rules_of(role: dict[str, Any]) -> set[Permission]:
    """Every (group, resource, verb) a Role or ClusterRole grants (the chart and the operator write no wildcards)."""
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def granted(admin: Api, cluster_role: str) -> set[Permission]:
    """Every (group, resource, verb) a ClusterRole grants (the chart writes no wildcards)."""
    role = admin.get(CLUSTERROLES, cluster_role, namespace=None)
    assert role is not None, f"ClusterRole {cluster_role} not found"
    return rules_of(role)


def requests_between(log: Path, user: str, start: int, end: int | None = None, namespace: str | None = None,
                     by_code: bool = False) -> Counter[str]:
    """The requests of `user` logged between byte offsets `start` and `end` of the audit log (on objects of
    `namespace` only, if given), by `verb resource[/subresource]` (`by_code`: by the response's HTTP code
    instead); a watch counts once, when it starts."""
    with log.open("rb") as f:
        f.seek(start)
        data = f.read(None if end is None else end - start).decode(errors="replace")
    out: Counter[str] = Counter()
    for line in data.splitlines():
        event = json.loads(line) if line.endswith("}") else {}
        ref = event.get("objectRef") or {}
        stage = "ResponseStarted" if event.get("verb") == "watch" else "ResponseComplete"
        if (event.get("user", {}).get("username") == user and event.get("stage") == stage
                and (namespace is None or ref.get("namespace") == namespace)):
            key = (str((event.get("responseStatus") or {}).get("code")) if by_code else
                   f"{event['verb']} {ref.get('resource')}" + (f"/{ref['subresource']}" if ref.get("subresource")
                                                               else ""))
            out[key] += 1
    return out
