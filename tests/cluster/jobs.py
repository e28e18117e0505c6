"""RLTrainingJobs in a test namespace: manifests, their status, conditions, Events, pods by role."""

from __future__ import annotations

from typing import Any

from localkube.api import EVENTS, PODS, RLTJ, Api

ROLES = ("actor", "critic", "ref", "reward")


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    """A small valid PPO job on GPUs: actor 2 x 1 GPU, critic 2 x 1, ref 1 x 1, reward on CPU."""
    roles = {
        "actor": {"replicas": 2, "gpus": 1},
        "critic": {"replicas": 2, "gpus": 1, "maxRestarts": 3},
        "ref": {"gpus": 1},
        "reward": {},
    }
    for role, override in spec.pop("roles", {}).items():
        roles[role] = {**roles.get(role, {}), **override}
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "data": {"task": "repeat-letter"},
            "reward": {"function": "kuberl.rewards:repeat_letter"},
            "roles": roles,
            **spec,
            "trainer": {"microBatchSize": 1, **spec.get("trainer", {})},
        },
    }


def status(api: Api, name: str) -> dict[str, Any]:
    return (api.get(RLTJ, name) or {}).get("status") or {}


def condition(api: Api, name: str, type_: str) -> dict[str, Any] | None:
    return next((c for c in status(api, name).get("conditions", []) if c["type"] == type_), None)


def events(api: Api, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in api.list(EVENTS)
        if e["involvedObject"].get("name") == name and (reason is None or e["reason"] == reason)
    ]


def phase_is(api: Api, name: str, phase: str):
    return lambda: status(api, name).get("phase") == phase


def pods_of(api: Api, job: str, role: str | None = None, live: bool = True) -> list[dict[str, Any]]:
    """The job's Ray pods (head and workers, made by KubeRay), optionally one role's; ``live``: not being deleted."""
    selector = f"ray.io/cluster={job}" + (f",kuberl.io/role={role}" if role else "")
    return [p for p in api.list(PODS, selector) if not (live and p["metadata"].get("deletionTimestamp"))]


def uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def others_of(api: Api, job: str, role: str) -> set[str]:
    """The UIDs of the job's Ray pods that are not ``role``'s."""
    return uids([p for p in pods_of(api, job) if p["metadata"]["labels"].get("kuberl.io/role") != role])


def running(pods: list[dict[str, Any]]) -> bool:
    return bool(pods) and all((p.get("status") or {}).get("phase") == "Running" for p in pods)


def describe(api: Api, name: str) -> str:
    """What a failed wait prints: the job's status, its pods and the last Events."""
    st = status(api, name)
    pods = [
        (
            p["metadata"]["name"],
            p["metadata"].get("labels", {}).get("kuberl.io/role"),
            p.get("spec", {}).get("nodeName"),
            (p.get("status") or {}).get("phase"),
            bool(p["metadata"].get("deletionTimestamp")),
        )
        for p in api.list(PODS)
    ]
    when = lambda e: e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"]  # noqa: E731
    evs = [(e["reason"], e.get("message", "")[:160]) for e in sorted(api.list(EVENTS), key=when)][-15:]  # newest
    roles = {
        r: {k: v for k, v in s.items() if k not in ("members", "handledUIDs")} for r, s in st.get("roles", {}).items()
    }
    return (
        f"\n--- job {name}: phase={st.get('phase')} message={st.get('message')!r}\n roles={roles}"
        f"\n pods (name, role, node, phase, deleting)={pods}\n events={evs}"
    )
