"""The operator's work against the API server; the decisions come from the pure modules.

- ``apply_spec``: create what a running job needs (or, when suspended, remove the runtime part),
  finding existing objects by name first and adopting them, so nothing is ever created twice;
- ``reconcile_status``: observe (the job, its RayCluster, kopf's indices of pods, progress and the
  driver Job), ``decide``, write the status with a resourceVersion precondition, then act;
- ``delete_children``: what the job owns goes explicitly (owner references cover the rest).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import secrets
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from kuberl.spec import RLTrainingJob, SpecInvalid, validate_manifest

from . import builders, conditions, names
from .config import OperatorConfig
from .kube import (CONFIGMAPS, JOBS, PODS, RAYCLUSTERS, RLTRAININGJOBS, ROLEBINDINGS, ROLES, SECRETS,
                   SERVICEACCOUNTS, ApiError, Kube, Resource, resource_of)
from .metrics import Metrics
from .progress import Progress
from .status import Observed, decide, invalid_spec_status, merge_diff

log = logging.getLogger(__name__)
STATUS_ATTEMPTS = 5


@dataclass
class Context:
    """What the startup handler puts in kopf's memo for every handler."""

    kube: Kube
    config: OperatorConfig
    metrics: Metrics
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        """One status writer per job at a time inside this process."""
        return self.locks.setdefault((namespace, name), asyncio.Lock())

    def options(self, namespace: str) -> builders.BuildOptions:
        return builders.BuildOptions(namespace=namespace, image=self.config.image)


@dataclass(frozen=True)
class Indices:
    """kopf's in-memory indices of a job's worker pods, progress reports and driver Job."""

    pods: Mapping[Any, Any]
    progress: Mapping[Any, Any]
    drivers: Mapping[Any, Any]

    @classmethod
    def of(cls, kwargs: Mapping[str, Any]) -> "Indices":
        return cls(kwargs["worker_pods"], kwargs["progress_reports"], kwargs["driver_jobs"])

    def observed(self, namespace: str, name: str, cluster_uid: str | None) -> Observed:
        key = (namespace, name)
        return Observed(
            cluster_uid=cluster_uid,
            pods=tuple(self.pods.get(key, ())),
            progress=next(iter(self.progress.get(key, ())), Progress()),
            driver=next(iter(self.drivers.get(key, ())), None),
        )


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def validated(body: kopf.Body, patch: kopf.Patch) -> RLTrainingJob:
    """The job's spec model; an invalid spec fails the job for good (status, Event, no retries)."""
    try:
        return validate_manifest(dict(body))
    except SpecInvalid as exc:
        message = "; ".join(str(e) for e in exc.errors)
        patch.status.update(invalid_spec_status(body.status, body.meta.get("generation", 1), message, now()))
        kopf.warn(body, reason="InvalidSpec", message=message)
        raise kopf.PermanentError(f"invalid spec: {message}") from None


def children(name: str) -> list[tuple[Resource, str]]:
    """Every object a job owns, by name, newest first; the first two are what suspend removes."""
    return [
        (JOBS, names.driver(name)), (RAYCLUSTERS, names.cluster(name)),
        (CONFIGMAPS, names.progress_configmap(name)), (CONFIGMAPS, names.spec_configmap(name)),
        (SECRETS, names.auth_secret(name)), (ROLEBINDINGS, names.driver(name)), (ROLES, names.driver(name)),
        (SERVICEACCOUNTS, names.driver(name)),
    ]


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences", []))


async def ensure(ctx: Context, body: kopf.Body, obj: MutableMapping[str, Any]) -> bool:
    """Create ``obj`` unless it exists; adopt an existing one made for this job. True if created."""
    meta = obj["metadata"]
    res = resource_of(obj)
    existing = await ctx.kube.get(res, meta["namespace"], meta["name"])
    if existing is None:
        kopf.adopt(obj, owner=body)
        try:
            await ctx.kube.create(obj)
        except ApiError as exc:
            if exc.status == 404:
                raise kopf.TemporaryError(f"{obj['apiVersion']} {obj['kind']} is not served: is KubeRay installed?", delay=30) from None
            if exc.status != 409:  # 409: created meanwhile by a concurrent reconcile; adopted next time
                raise
        return True
    emeta = existing["metadata"]
    if emeta.get("deletionTimestamp"):
        raise kopf.TemporaryError(f"waiting for the old {obj['kind']} {meta['name']} to be deleted", delay=2)
    if not owned_by(existing, body.meta.uid):
        if (emeta.get("labels") or {}).get(names.LABEL_JOB) != body.meta.name:
            raise kopf.TemporaryError(f"{obj['kind']} {meta['name']} exists and does not belong to this job", delay=60)
        refs = [*emeta.get("ownerReferences", []), kopf.build_owner_reference(body)]
        await ctx.kube.patch(res, meta["namespace"], meta["name"], {"metadata": {"ownerReferences": refs}})
    return False


async def apply_spec(ctx: Context, body: kopf.Body, patch: kopf.Patch) -> None:
    """Make the children match the spec: everything when running; no RayCluster/driver when suspended.

    A finished job (Succeeded or Failed, InvalidSpec included) is left as it is: terminal is final.
    """
    namespace, name = body.meta.namespace, body.meta.name
    if conditions.terminal(body.status.get("conditions", [])):
        return
    job = validated(body, patch)
    if job.spec.suspend:
        stopped = [f"{res.plural} {child}" for res, child in children(name)[:2]
                   if await delete_owned(ctx, res, namespace, child, body.meta.uid)]
        if stopped:
            kopf.info(body, reason="Suspended", message=f"deleted {', '.join(stopped)}")
        return
    objects = builders.all_objects(job, body["spec"], secrets.token_urlsafe(32), ctx.options(namespace))
    created = [f"{obj['kind']} {obj['metadata']['name']}" for obj in objects if await ensure(ctx, body, obj)]
    if created:
        kopf.info(body, reason="Created", message=f"created {', '.join(created)}")


async def delete_owned(ctx: Context, res: Resource, namespace: str, name: str, owner_uid: str) -> bool:
    """Delete an object if this job owns it (never someone else's namesake). True if deleted."""
    obj = await ctx.kube.get(res, namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp") or not owned_by(obj, owner_uid):
        return False
    return await ctx.kube.delete(res, namespace, name)


async def delete_children(ctx: Context, body: kopf.Body) -> None:
    """Delete what the job owns: garbage collection would, via owner references, but not at once."""
    for res, child in children(body.meta.name):
        await delete_owned(ctx, res, body.meta.namespace, child, body.meta.uid)


async def reconcile_status(ctx: Context, namespace: str, name: str, indices: Indices) -> None:
    """Bring one job's status up to date and carry out what it implies; serialised per job."""
    async with ctx.lock(namespace, name):
        for _ in range(STATUS_ATTEMPTS):
            if await reconcile_once(ctx, namespace, name, indices):
                return
        log.info("status of %s/%s kept changing under us; the next event retries", namespace, name)


async def reconcile_once(ctx: Context, namespace: str, name: str, indices: Indices) -> bool:
    """One observe-decide-write-act pass; False when the write lost a race (409) and must be redone."""
    body = await ctx.kube.get(RLTRAININGJOBS, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return True
    old = body.get("status") or {}
    cluster = await ctx.kube.get(RAYCLUSTERS, namespace, names.cluster(name))
    cluster_uid = cluster["metadata"]["uid"] if cluster and not cluster["metadata"].get("deletionTimestamp") else None
    if conditions.terminal(old.get("conditions", [])):  # sticky; includes InvalidSpec, which cannot be decided
        if cluster_uid is not None:
            await ctx.kube.delete(RAYCLUSTERS, namespace, names.cluster(name))
        ctx.metrics.observe(namespace, name, old)
        return True
    try:
        job = validate_manifest(body)
    except SpecInvalid:
        return True  # the spec handler reports it
    decision = decide(job, body["metadata"].get("generation", 1), old, indices.observed(namespace, name, cluster_uid), now())
    patch = merge_diff(old, decision.status)
    if patch is not None:
        precondition = {"resourceVersion": body["metadata"]["resourceVersion"]}
        try:
            await ctx.kube.patch(RLTRAININGJOBS, namespace, name, {"metadata": precondition, "status": patch}, sub="status")
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
    for event in decision.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    for pod in decision.delete_pods:
        await ctx.kube.delete(PODS, namespace, pod)
    if decision.teardown:
        await ctx.kube.delete(RAYCLUSTERS, namespace, names.cluster(name))
    ctx.metrics.observe(namespace, name, decision.status)
    return True

