"""The operator's work against the API server; the decisions come from the pure modules.

- ``apply_spec``: create what a running job needs (or, when suspended, remove the runtime part),
  finding existing objects by name first and adopting them, so nothing is ever created twice;
- ``write_status``: observe (the job, its RayCluster, kopf's indices of pods, progress and the
  driver Job), ``decide``, write the status with a resourceVersion precondition, then act;
- ``delete_children``: what the job owns goes explicitly (owner references cover the rest).

Every read comes from the watch-backed cache (``cache.py``), never a GET: a pass over a job whose world matches
its spec and status sends nothing. The one object the operator may not read, the Ray token's Secret, is created
(409 while it exists) on the passes the spec's events drive and at most every ``secret_probe_seconds`` otherwise;
so is the job's NetworkPolicy, which never changes.
Every pass over one job holds that job's lock, so within the process there is one writer per job, and one of the
process's ``config.concurrent_passes`` slots (``turn``), so that a burst of jobs does not put every job's requests in
the API server's queue at once: each pass then waits its turn here, where the wait is measured apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf

from kuberl.spec import ROLES as JOB_ROLES
from kuberl.spec import RLTrainingJob, SpecInvalid, validate_manifest
from kuberl.spec.contract import REPLICAS_KEY

from . import builders, conditions, gang, job_policy, names, placement, ray_token, resize
from .cache import Written, first, version
from .config import OperatorConfig
from .health import LastWords
from .kube import (
    CONFIGMAPS,
    JOBS,
    NETWORKPOLICIES,
    NODES,
    PODS,
    RAYCLUSTERS,
    RESOURCECLAIMTEMPLATES,
    RLTRAININGJOBS,
    ROLEBINDINGS,
    ROLES,
    SECRETS,
    SERVICEACCOUNTS,
    ApiError,
    Kube,
    Resource,
    resource_of,
)
from .metrics import Metrics
from .progress import Progress
from .spec_changes import applied_spec
from .status import (
    PLACEMENT_DEGRADED,
    POLICY_DENIED,
    TIME_FORMAT,
    Decision,
    Event,
    Observed,
    decide,
    infeasible_status,
    invalid_spec_status,
    merge_diff,
    policy_denied_status,
    ttl_expired,
)

log = logging.getLogger(__name__)
STATUS_ATTEMPTS = 5
GANG_RETRY_DELAY_S = 2.0  # after a job's pod went, before the waiting gangs are weighed again (`retry_gangs`)
CATCH_UP_S = 2.0  # after a lost status race (409), how long to wait for the watch to bring the newer job
# What the operator only creates (`create_once`), probed with the Ray token's Secret: it may not read Secrets, and
# a job's NetworkPolicy (`network`) never changes, so it needs no watch (a deleted one is made again at the probe).
CREATE_ONLY = frozenset({SECRETS, NETWORKPOLICIES})
# A pass creates a job's children in waves, each wave's at once: a kind not named here goes in the first wave. A
# RoleBinding needs its Role (the API server checks a binding against the rules of the Role it names), and the
# RayCluster and driver Job need the rest (their pods' ServiceAccount, token Secret, ConfigMaps and claims). One
# at a time, a job's first pass was about ten requests in a row, each waiting at a busy API server.
WAVES = {"RoleBinding": 1, "RayCluster": 2, "Job": 2}


@dataclass
class Context:
    """What the startup handler puts in kopf's memo for every handler."""

    kube: Kube
    config: OperatorConfig
    metrics: Metrics
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    waiting: set[tuple[str, str]] = field(default_factory=set)  # jobs with a status pass waiting for their lock
    tokens: dict[ray_token.Key, str] = field(default_factory=dict)  # the Ray token of each job whose Secret it made
    refused: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)  # job -> what its report lacked
    written: Written = field(default_factory=Written)  # what this process's writes returned (cache.py)
    secret_probes: dict[ray_token.Key, float] = field(default_factory=dict)  # job -> its last Secret create (monotonic)
    cache: Mapping[str, Any] = field(default_factory=dict)  # plural -> kopf's index of it (the size metric)
    slots: asyncio.Semaphore | None = None  # passes running at once (`turn`); made on first use, inside the loop
    gang_waits: dict[tuple[str, str], str] = field(default_factory=dict)  # job -> why its gated pods wait (gang.py)
    gang_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one gang decision at a time (`gang_pass`)
    last_words: LastWords = field(default_factory=LastWords)  # how pods now gone had failed (health.LastWords)

    def indices(self, kwargs: Mapping[str, Any]) -> Indices:
        """The indices kopf passed a handler; the first call keeps the cache's (kopf's indices live as long as the
        process) for the cache-size metric."""
        indices = Indices.of(kwargs)
        if not self.cache:
            self.cache = indices.cached
        return indices

    def read(self, indices: Indices, res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """An object as the cache knows it (None: absent), the newest of its index and this process's writes."""
        index = indices.cached.get(res.plural) or {}
        return self.written.read(res.plural, namespace, name, first(index.get((namespace, name))))

    def probe_secret(self, key: ray_token.Key, forced: bool) -> bool:
        """Whether this pass creates the job's token Secret and NetworkPolicy again (to learn whether they still
        exist): when ``forced`` (an event-driven pass), until a probe has answered (`probed`), and once the job's
        turn in each ``config.secret_probe_seconds`` has come since the last answer (`probe_due`)."""
        last = self.secret_probes.get(key)
        return forced or last is None or time.monotonic() >= probe_due(last, key, self.config.secret_probe_seconds)

    def probed(self, key: ray_token.Key) -> None:
        """The job's Secret and NetworkPolicy were created or found: the next probe may wait its turn. Until then
        every pass probes, so that a failed create (a 5xx, a Role without the verb) never lets a resync make the
        pods without them."""
        self.secret_probes[key] = time.monotonic()

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        """One status writer per job at a time inside this process."""
        return self.locks.setdefault((namespace, name), asyncio.Lock())

    @contextlib.asynccontextmanager
    async def turn(self, namespace: str, name: str, locked: asyncio.Lock | None = None) -> AsyncIterator[None]:
        """A pass over one job: its lock (``locked``: already held, released at the end), then one of the process's
        ``config.concurrent_passes`` slots, like controller-runtime's MaxConcurrentReconciles. The wait for both is
        the queue's histogram; the pass itself, from then on, the reconcile's."""
        start = time.perf_counter()
        lock = locked or self.lock(namespace, name)
        if locked is None:
            await lock.acquire()
        try:
            if self.slots is None:
                self.slots = asyncio.Semaphore(self.config.concurrent_passes)
            async with self.slots:
                self.metrics.queued.observe(time.perf_counter() - start)
                with self.metrics.reconcile():
                    yield
        finally:
            lock.release()

    def options(self, namespace: str) -> builders.BuildOptions:
        return builders.BuildOptions(
            namespace=namespace,
            image=self.config.image,
            head=self.config.head,
            driver=self.config.driver,
            cpu_limits=self.config.cpu_limits,
            scratch=self.config.scratch,
            network_policy=self.config.network_policy,
            scrapers=self.config.scrapers,
            gang_scheduling=self.config.gang_scheduling,
        )


def probe_due(last_s: float, key: ray_token.Key, interval_s: float) -> float:
    """When a job's next Secret probe is due after its last at `last_s`: at the job's own phase of the interval (from
    a hash of its key), and at least two thirds of the interval after the last, so one interval apart once in phase.
    Jobs made in one burst would otherwise probe in a burst every interval, at a higher rate than its average."""
    phase = zlib.crc32(repr(key).encode()) / 2**32 * interval_s
    earliest = last_s + interval_s * 2 / 3
    wait = (phase - earliest) % interval_s
    return earliest + (wait if interval_s - wait > 1e-6 else 0.0)  # within rounding of a whole interval: now


CACHED = (RLTRAININGJOBS, SERVICEACCOUNTS, ROLES, ROLEBINDINGS, CONFIGMAPS, JOBS, RAYCLUSTERS,
          RESOURCECLAIMTEMPLATES)  # the kinds whose whole objects are indexed (`handlers.cached_object`)


def cache_index(res: Resource) -> str:
    """The name of the kopf index that holds the objects of kind `res` by (namespace, name)."""
    return f"cached_{res.plural}"


@dataclass(frozen=True)
class Indices:
    """kopf's in-memory indices of a job's worker pods, progress reports, driver Job and head pods, and of the
    whole objects of the kinds in ``CACHED`` (plural -> index keyed by namespace and name)."""

    pods: Mapping[Any, Any]
    progress: Mapping[Any, Any]
    drivers: Mapping[Any, Any]
    heads: Mapping[Any, Any] = field(default_factory=dict)
    cached: Mapping[str, Mapping[Any, Any]] = field(default_factory=dict)
    gated: Mapping[Any, Any] = field(default_factory=dict)  # job -> names of its pods that still carry the gang gate

    @classmethod
    def of(cls, kwargs: Mapping[str, Any]) -> Indices:
        cached = {res.plural: kwargs[cache_index(res)] for res in CACHED if cache_index(res) in kwargs}
        return cls(kwargs["worker_pods"], kwargs["progress_reports"], kwargs["driver_jobs"], kwargs["head_pods"],
                   cached, kwargs.get("gated_pods", {}))

    def observed(self, namespace: str, name: str, cluster_uid: str | None,
                 applied: Mapping[str, Any] | None = None, groups: Mapping[str, int] | None = None,
                 given_up: Mapping[str, tuple[str, ...]] | None = None, gang_wait: str | None = None,
                 queued: bool = False, last_words: Mapping[str, str] | None = None) -> Observed:
        key = (namespace, name)
        return Observed(
            gang_wait=gang_wait,
            queued=queued,
            cluster_uid=cluster_uid,
            applied_spec=applied,
            groups=dict(groups or {}),
            given_up=dict(given_up or {}),
            pods=tuple(self.pods.get(key, ())),
            progress=next(iter(self.progress.get(key, ())), Progress()),
            driver=next(iter(self.drivers.get(key, ())), None),
            head=tuple(self.heads.get(key, ())),
            last_words=last_words or {},
        )


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime(TIME_FORMAT)


def event_object(body: Mapping[str, Any], event: Event, at: str) -> dict[str, Any]:
    """A core/v1 Event about the job `body`, at time `at`."""
    meta = body["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": body["apiVersion"], "kind": body["kind"], "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": event.type, "reason": event.reason, "message": event.message[:1024],
            "source": {"component": "kuberl-operator"}, "firstTimestamp": at, "lastTimestamp": at, "count": 1}


async def post_events(ctx: Context, body: Mapping[str, Any], events: Sequence[Event]) -> None:
    """Post the Events of a status just written, each before this returns: kopf's `event` queues them for a
    background poster, and an operator stopped meanwhile (a rollout, a node drain) lost them while the status it
    had written counted the failure they report, so the next operator never posted them."""
    for event in events:
        try:
            await ctx.kube.create(event_object(body, event, now()))
        except ApiError as exc:
            log.warning("could not post the %s Event of %s/%s: %s", event.reason, body["metadata"]["namespace"],
                        body["metadata"]["name"], exc)


def validated(body: kopf.Body, patch: kopf.Patch) -> RLTrainingJob:
    """The job's spec model; an invalid spec fails the job for good (status, Event, no retries)."""
    try:
        return validate_manifest(dict(body))
    except SpecInvalid as exc:
        message = "; ".join(str(e) for e in exc.errors)
        patch.status.update(invalid_spec_status(body.status, body.meta.get("generation", 1), message, now()))
        kopf.event(body, type="Warning", reason="InvalidSpec", message=message)
        raise kopf.PermanentError(f"invalid spec: {message}") from None


def permitted(ctx: Context, body: kopf.Body, patch: kopf.Patch, job: RLTrainingJob) -> None:
    """A job that breaks the platform's job policy fails before anything is created (as at admission)."""
    problems = job_policy.violations(job, ctx.config.job_policy)
    if problems:
        message = "; ".join(problems)
        patch.status.update(policy_denied_status(body.status, body.meta.get("generation", 1), message, now()))
        kopf.event(body, type="Warning", reason=POLICY_DENIED, message=message)
        raise kopf.PermanentError(f"job policy: {message}")


def feasible(ctx: Context, body: kopf.Body, patch: kopf.Patch, job: RLTrainingJob) -> None:
    """A required placement that no cluster can give fails the job before anything is created."""
    problems = placement.static_problems(job, ctx.config.max_gpus_per_node)
    if problems:
        message = "; ".join(map(str, problems))
        patch.status.update(infeasible_status(body.status, body.meta.get("generation", 1), message, now()))
        kopf.event(body, type="Warning", reason=PLACEMENT_DEGRADED, message=message)
        raise kopf.PermanentError(f"placement cannot be met: {message}")


def runtime_children(name: str, extra_roles: Sequence[str] = ()) -> list[tuple[Resource, str]]:
    """What suspend removes (newest first): the driver Job, the RayCluster, the GPU claim templates
    (any built-in role's, the spec may have changed since they were made, and the extra roles')."""
    return [(JOBS, names.driver(name)), (RAYCLUSTERS, names.cluster(name)),
            *((RESOURCECLAIMTEMPLATES, names.claim_template(name, role)) for role in (*JOB_ROLES, *extra_roles))]


def children(name: str) -> list[tuple[Resource, str]]:
    """Every object a job owns, by name, newest first; ``runtime_children`` first."""
    return [
        *runtime_children(name),
        (CONFIGMAPS, names.progress_configmap(name)), (CONFIGMAPS, names.spec_configmap(name)),
        (ROLEBINDINGS, names.driver(name)), (ROLES, names.driver(name)), (SERVICEACCOUNTS, names.driver(name)),
    ]  # not the token's Secret: the operator may not read (nor delete) Secrets; garbage collection removes it


def not_served(obj: Mapping[str, Any]) -> str:
    """Why the API server answers 404 to creating ``obj``: its API is not installed."""
    if obj["apiVersion"] == builders.DRA_API_VERSION:
        return (f"{obj['apiVersion']} {obj['kind']} is not served: spec.placement.mode dra needs Kubernetes >= 1.34 "
                f"with dynamic resource allocation (or use mode device-plugin)")
    return f"{obj['apiVersion']} {obj['kind']} is not served: is KubeRay installed?"


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences", []))


async def ensure(ctx: Context, indices: Indices, body: kopf.Body, obj: MutableMapping[str, Any],
                 sync: tuple[str, ...] = ()) -> bool:
    """Create ``obj`` unless the cache holds it; adopt an existing one made for this job; keep its ``sync``
    fields up to date. True if created."""
    meta = obj["metadata"]
    res = resource_of(obj)
    existing = ctx.read(indices, res, meta["namespace"], meta["name"])
    if existing is None:
        kopf.adopt(obj, owner=body)
        try:
            ctx.written.put(res.plural, await ctx.kube.create(obj))
        except ApiError as exc:
            if exc.status == 404:
                raise kopf.TemporaryError(not_served(obj), delay=30) from None
            if exc.status != 409:
                raise
            # there, but not in the cache, which holds only what carries the job's label: a namesake of another
            raise kopf.TemporaryError(f"{obj['kind']} {meta['name']} exists and does not belong to this job (it "
                                      f"lacks the label {names.LABEL_JOB}={body.meta.name}): delete or rename it",
                                      delay=60) from None
        return True
    emeta = existing["metadata"]
    if emeta.get("deletionTimestamp"):
        raise kopf.TemporaryError(f"waiting for the old {obj['kind']} {meta['name']} to be deleted", delay=2)
    update = {key: obj[key] for key in sync if existing.get(key) != obj[key]}
    if not owned_by(existing, body.meta.uid):
        if (emeta.get("labels") or {}).get(names.LABEL_JOB) != body.meta.name:
            raise kopf.TemporaryError(f"{obj['kind']} {meta['name']} exists and does not belong to this job", delay=60)
        update["metadata"] = {"ownerReferences": [*emeta.get("ownerReferences", []), kopf.build_owner_reference(body)]}
    if update:
        ctx.written.put(res.plural, await ctx.kube.patch(res, meta["namespace"], meta["name"], update))
    return False


async def create_once(ctx: Context, body: kopf.Body, obj: MutableMapping[str, Any]) -> bool:
    """Create ``obj``, owned by the job, without reading it first (the operator may not read Secrets): True
    if made, False if it exists (409)."""
    kopf.adopt(obj, owner=body)
    try:
        await ctx.kube.create(obj)
    except ApiError as exc:
        if exc.status == 409:
            return False
        raise
    return True


def diff_field_paths(diff: Sequence[Any], live: frozenset[str] = frozenset()) -> list[str]:
    """Changed spec fields, other than suspend and the ``live`` ones, from kopf's diff of ``spec``."""
    fields = {".".join(("spec", *[str(f) for f in item[1] if f != "spec"][:3])) for item in diff}
    return sorted(fields - {"spec.suspend"} - live)


def worker_groups(cluster: Mapping[str, Any] | None) -> dict[str, int]:
    """A RayCluster's worker group replicas, by group (role) name."""
    return {g.get("groupName"): g.get("replicas", 0) for g in group_specs(cluster)}


def given_up(cluster: Mapping[str, Any] | None) -> dict[str, tuple[str, ...]]:
    """The pods a RayCluster's worker groups name for KubeRay to delete (scaleStrategy.workersToDelete)."""
    return {g.get("groupName"): tuple((g.get("scaleStrategy") or {}).get("workersToDelete") or ())
            for g in group_specs(cluster)}


def group_specs(cluster: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return ((cluster or {}).get("spec") or {}).get("workerGroupSpecs") or []


async def ask_driver(ctx: Context, indices: Indices, namespace: str, job: RLTrainingJob) -> None:
    """Write the spec's replicas of the live roles into ``data.replicas`` of the progress ConfigMap, where
    the driver reads them between two steps (`resize`); nothing is written when they are there already."""
    name = names.progress_configmap(job.metadata.name)
    doc = resize.replicas_document(job).to_json()
    existing = ctx.read(indices, CONFIGMAPS, namespace, name)
    if existing is not None and (existing.get("data") or {}).get(REPLICAS_KEY) != doc:
        ctx.written.put(CONFIGMAPS.plural,
                        await ctx.kube.patch(CONFIGMAPS, namespace, name, {"data": {REPLICAS_KEY: doc}}))


async def apply_spec(ctx: Context, indices: Indices, body: kopf.Body, patch: kopf.Patch, diff: Sequence[Any] = (),
                     events: bool = True) -> None:
    """Make the children match the spec: everything when running; no RayCluster/driver when suspended.

    The spec ConfigMap always holds the current spec, so a resume runs it. A finished job (Succeeded
    or Failed, InvalidSpec included) is left as it is: terminal is final. ``events``: the pass follows an
    event of the job (created, resumed, its spec changed), so its Secret is probed whatever the last probe.
    """
    namespace, name = body.meta.namespace, body.meta.name
    if conditions.terminal(body.status.get("conditions", [])):
        return
    job = validated(body, patch)
    permitted(ctx, body, patch, job)
    feasible(ctx, body, patch, job)
    runtime, spec_configmap = runtime_children(name, list(job.spec.roles.extra)), (CONFIGMAPS,
                                                                                   names.spec_configmap(name))
    token_key = (namespace, name, body.meta.uid)
    token = ray_token.token_for(ctx.tokens, token_key)
    probe = ctx.probe_secret(token_key, events)

    async def make(obj: MutableMapping[str, Any]) -> bool:
        key = (resource_of(obj), obj["metadata"]["name"])
        if key[0] not in CREATE_ONLY:
            return await ensure(ctx, indices, body, obj, sync=("data",) if key == spec_configmap else ())
        made = await create_once(ctx, body, obj)
        if key[0] is not SECRETS:
            return made
        event = ray_token.created(ctx.tokens, token_key, token, key[1], body.status.get("rayClusterUID") is not None,
                                  made)
        if event is not None:
            kopf.event(body, type=event[0], reason=event[1], message=event[2])
        return made

    wanted = [obj for obj in builders.all_objects(job, body["spec"], token.value, ctx.options(namespace))
              if not (job.spec.suspend and (resource_of(obj), obj["metadata"]["name"]) in runtime)
              and (probe or resource_of(obj) not in CREATE_ONLY)]
    if created := await create_probing(ctx, token_key if probe else None, wanted, make):
        kopf.event(body, type="Normal", reason="Created", message=f"created {', '.join(created)}")
    await ask_driver(ctx, indices, namespace, job)
    if job.spec.suspend:
        stopped = [f"{res.plural} {child}" for res, child in runtime
                   if await delete_owned(ctx, indices, res, namespace, child, body.meta.uid)]
        if stopped:
            kopf.event(body, type="Normal", reason="Suspended", message=f"deleted {', '.join(stopped)}")
    elif (changes := diff_field_paths(diff, resize.live_fields(job))) and not any(
            c.startswith("RayCluster") for c in created):
        kopf.event(body, type="Normal", reason="SpecChangePending",
                   message=f"{', '.join(changes)} changed: the running RayCluster and driver keep the spec they "
                           f"started with; suspend and resume the job to apply it")


async def create_probing(ctx: Context, probe: ray_token.Key | None, wanted: Sequence[MutableMapping[str, Any]],
                         make: Callable[[MutableMapping[str, Any]], Awaitable[bool]]) -> list[str]:
    """`create_in_waves`, then, for a pass that probed the job's create-only children (`probe`: its key), the probe
    recorded: only once every create answered (one that raised ends the pass, and the next probes again)."""
    created = await create_in_waves(wanted, make)
    if probe is not None:
        ctx.probed(probe)
    return created


async def create_in_waves(wanted: Sequence[MutableMapping[str, Any]],
                          make: Callable[[MutableMapping[str, Any]], Awaitable[bool]]) -> list[str]:
    """Make ``wanted`` wave by wave (`WAVES`), each wave's requests at once; "Kind name" of each object made."""
    created = []
    for wave in sorted({WAVES.get(obj["kind"], 0) for obj in wanted}):
        batch = [obj for obj in wanted if WAVES.get(obj["kind"], 0) == wave]
        results = await asyncio.gather(*(make(obj) for obj in batch), return_exceptions=True)
        if failed := next((r for r in results if isinstance(r, BaseException)), None):
            raise failed  # the wave's other requests are done; the next waves wait for the pass that retries
        created += [f"{obj['kind']} {obj['metadata']['name']}" for obj, made in zip(batch, results) if made]
    return created


async def delete_owned(ctx: Context, indices: Indices, res: Resource, namespace: str, name: str,
                       owner_uid: str) -> bool:
    """Delete an object if this job owns it (never someone else's namesake). True if deleted."""
    obj = ctx.read(indices, res, namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp") or not owned_by(obj, owner_uid):
        return False
    return await ctx.kube.delete(res, namespace, name)


async def delete_children(ctx: Context, indices: Indices, body: kopf.Body) -> None:
    """Delete what the job owns: garbage collection would, via owner references, but not at once."""
    owned = children(body.meta.name)
    async with ctx.turn(body.meta.namespace, body.meta.name):
        for res, child in owned:
            await delete_owned(ctx, indices, res, body.meta.namespace, child, body.meta.uid)
    key = (body.meta.namespace, body.meta.name, body.meta.uid)
    ctx.tokens.pop(key, None)
    ctx.secret_probes.pop(key, None)
    ctx.refused.pop((body.meta.namespace, body.meta.name), None)
    ctx.written.forget(body.meta.namespace, body.meta.name, tuple(child for _, child in owned))


async def reconcile_job(ctx: Context, body: kopf.Body, patch: kopf.Patch, diff: Sequence[Any],
                        indices: Indices) -> None:
    """The spec changed (or the job appeared, or the operator started): apply it, then the status."""
    async with ctx.turn(body.meta.namespace, body.meta.name):
        try:
            await apply_spec(ctx, indices, body, patch, diff)
        finally:
            await write_status(ctx, body.meta.namespace, body.meta.name, indices)


async def reconcile_status(ctx: Context, namespace: str, name: str, indices: Indices) -> None:
    """Something the job owns changed: bring its status up to date and act on it. A pass already waiting for the
    job's lock will read the indices as they are once it runs, this change included, so this one is not queued
    behind it: a burst of pod events makes at most one pass running and one waiting per job."""
    key = (namespace, name)
    if key in ctx.waiting:
        return
    ctx.waiting.add(key)
    lock = ctx.lock(namespace, name)
    try:
        await lock.acquire()
    finally:
        ctx.waiting.discard(key)  # running now (a change from here on queues a pass of its own), or cancelled
    async with ctx.turn(namespace, name, locked=lock):
        await write_status(ctx, namespace, name, indices)


async def resync(ctx: Context, namespace: str, name: str, patch: kopf.Patch, indices: Indices) -> None:
    """A level-triggered pass on the freshest job the cache holds (periodic, or after one of its children was
    deleted): recreates what is missing, and writes the status if it changed (a deadline passed)."""
    async with ctx.turn(namespace, name):
        body = ctx.read(indices, RLTRAININGJOBS, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        try:
            await apply_spec(ctx, indices, kopf.Body(body), patch, events=False)
        finally:
            await write_status(ctx, namespace, name, indices)


async def write_status(ctx: Context, namespace: str, name: str, indices: Indices) -> None:
    """Observe, decide, write, act; redone when the write loses a race. Callers hold the job's lock."""
    for _ in range(STATUS_ATTEMPTS):
        if await reconcile_once(ctx, namespace, name, indices):
            return
    log.info("status of %s/%s kept changing under us; the next event retries", namespace, name)


async def caught_up(ctx: Context, indices: Indices, namespace: str, name: str, seen: int) -> bool:
    """Wait (at most ``CATCH_UP_S``) until the cache holds a newer job than resourceVersion `seen`."""
    deadline = time.monotonic() + CATCH_UP_S
    while time.monotonic() < deadline:
        if version(ctx.read(indices, RLTRAININGJOBS, namespace, name)) > seen:
            return True
        await asyncio.sleep(0.05)
    return False


async def reconcile_once(ctx: Context, namespace: str, name: str, indices: Indices) -> bool:
    """One observe-decide-write-act pass; False when the write lost a race (409) and must be redone."""
    body = ctx.read(indices, RLTRAININGJOBS, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return True
    old = body.get("status") or {}
    cluster = ctx.read(indices, RAYCLUSTERS, namespace, names.cluster(name))
    live = (cluster is not None and owned_by(cluster, body["metadata"]["uid"])
            and not cluster["metadata"].get("deletionTimestamp"))
    cluster_uid = cluster["metadata"]["uid"] if live else None
    if conditions.terminal(old.get("conditions", [])):  # sticky; includes InvalidSpec, which cannot be decided
        if cluster_uid is not None:
            await ctx.kube.delete(RAYCLUSTERS, namespace, names.cluster(name))
        ctx.metrics.observe(namespace, name, old)
        if ttl_expired(body.get("spec") or {}, old, now()):  # the delete handler then removes its children
            await ctx.kube.delete(RLTRAININGJOBS, namespace, name)
        return True
    try:
        job = validate_manifest(body)
    except SpecInvalid:
        return True  # the spec handler reports it
    if placement.static_problems(job, ctx.config.max_gpus_per_node):
        return True  # likewise
    groups = worker_groups(cluster) if live else None
    if ctx.config.gang_scheduling and groups is not None and (
            indices.gated.get((namespace, name)) or (namespace, name) in ctx.gang_waits):
        await gang_pass(ctx, namespace, name, groups)
    seen = indices.observed(namespace, name, cluster_uid, applied_spec(cluster) if live else None, groups,
                            given_up(cluster) if live else None, ctx.gang_waits.get((namespace, name)),
                            queued=live and bool((cluster.get("spec") or {}).get("suspend")),
                            last_words=ctx.last_words.words)
    decision = decide(job, body["metadata"].get("generation", 1), old, seen, now())
    written = await write_decided_status(ctx, indices, body, decision.status)
    if written is not None:
        return written  # the write lost a race: False to redo the pass, True to leave it to the next one
    ctx.metrics.observe(namespace, name, decision.status, job.spec)
    report_refused(ctx, body, seen.progress.refused)
    await post_events(ctx, body, decision.events)
    await act(ctx, body, cluster if live else None, decision, seen)
    return True


async def gang_pass(ctx: Context, namespace: str, name: str, groups: Mapping[str, int]) -> None:
    """Lift the gang gates of the job's pods when `gang` says so, or remember why they wait (for its status). One
    decision at a time in the process, each on fresh lists: a gang let through is counted before the next is
    weighed. The nodes and every pod of the cluster are listed only when a whole set waits to be weighed. A failed
    list leaves the job as it was: its next pass weighs it again."""
    key = (namespace, name)
    async with ctx.gang_lock:
        try:
            job_pods = await ctx.kube.list(PODS, namespace, labelSelector=f"{names.LABEL_JOB}={name}")
            verdict = gang.quick(job_pods, gang.expected_pods(groups))
            if verdict is None:
                nodes = await ctx.kube.list(NODES, None)
                every = await ctx.kube.list(PODS, None, fieldSelector="status.phase!=Succeeded,status.phase!=Failed")
                verdict = gang.fit(job_pods, nodes, every)
        except ApiError as exc:
            log.warning("%s/%s: gang scheduling could not list pods or nodes (%s); its next pass tries again",
                        namespace, name, exc)
            return
        by_name = {p["metadata"]["name"]: p for p in job_pods}
        for pod in verdict.release:  # the Ray pods first, the driver last (`gang.gated_names`)
            await lift_gate(ctx, namespace, by_name[pod])
        if verdict.release:
            log.info("%s/%s: gang let through (%d pods)", namespace, name, len(verdict.release))
        if verdict.wait:
            ctx.gang_waits[key] = verdict.wait
        else:
            ctx.gang_waits.pop(key, None)


async def lift_gate(ctx: Context, namespace: str, pod: Mapping[str, Any]) -> None:
    """Remove our gate from the pod, and nothing else: a JSON patch that first tests the gate is still where the
    list saw it (no resourceVersion: the scheduler's status writes to a gated pod do not refuse it)."""
    index = next(i for i, g in enumerate(pod["spec"]["schedulingGates"]) if g.get("name") == gang.GATE)
    path = f"/spec/schedulingGates/{index}"
    try:
        await ctx.kube.json_patch(PODS, namespace, pod["metadata"]["name"],
                                  [{"op": "test", "path": f"{path}/name", "value": gang.GATE},
                                   {"op": "remove", "path": path}])
    except ApiError as exc:
        if exc.status not in (404, 409, 422):  # gone, or its gates changed since the list: the next pass sees it
            raise


async def retry_gangs(ctx: Context, indices: Indices, but: tuple[str, str]) -> None:
    """Room was freed (a job's pod is gone): weigh again each job whose gang waits, but ``but``'s, after
    `GANG_RETRY_DELAY_S`, by when a restarting job's new pods exist and keep their room (`gang.reserved`)."""
    await asyncio.sleep(GANG_RETRY_DELAY_S)
    for namespace, name in [k for k in ctx.gang_waits if k != but]:
        await reconcile_status(ctx, namespace, name, indices)


async def write_decided_status(ctx: Context, indices: Indices, body: Mapping[str, Any],
                               status: Mapping[str, Any]) -> bool | None:
    """Patch what changed of the job's status, on the version read; None when written (or nothing changed), else
    what `reconcile_once` returns after losing the race (409): False to redo the pass once the cache holds the
    newer job, True to leave the status to the job's next pass."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    patch = merge_diff(body.get("status") or {}, status)
    if patch is None:
        return None
    precondition = {"resourceVersion": body["metadata"]["resourceVersion"]}
    try:
        ctx.written.put(RLTRAININGJOBS.plural, await ctx.kube.patch(
            RLTRAININGJOBS, namespace, name, {"metadata": precondition, "status": patch}, sub="status"))
    except ApiError as exc:
        if exc.status != 409:
            raise
        if await caught_up(ctx, indices, namespace, name, version(body)):
            return False
        # Within the job's own handler kopf updates its index only once the handler returns: waiting again would
        # hold the job (its deletion included) for nothing. Its next pass writes the status.
        log.info("status of %s/%s: the cache did not catch up within %ss; the next pass writes it",
                 namespace, name, CATCH_UP_S)
        return True
    return None


def report_refused(ctx: Context, body: Mapping[str, Any], refused: Sequence[str]) -> None:
    """An Event when the driver's progress report names fields it refused that the last pass did not."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    if refused and ctx.refused.get(key) != refused:
        more = f" and {len(refused) - 8} more" if len(refused) > 8 else ""
        kopf.event(body, type="Warning", reason="ProgressRefused",
                   message=f"the driver's progress report was malformed or past its bounds in "
                           f"{', '.join(refused[:8])}{more}: that part is ignored, the rest is used")
    ctx.refused[key] = refused


async def act(ctx: Context, body: Mapping[str, Any], cluster: Mapping[str, Any] | None, decision: Decision,
              seen: Observed) -> None:
    """Carry out a decision on the live RayCluster (``cluster``, None if there is none): resize its worker groups,
    delete the failed pods, tear it down."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    patch = resize.cluster_patch(cluster, decision.groups, decision.leaving) if cluster is not None else None
    if patch is not None:  # before any pod goes: KubeRay must not replace a pod a shrink gives up
        ctx.written.put(RAYCLUSTERS.plural, await ctx.kube.json_patch(RAYCLUSTERS, namespace, names.cluster(name),
                                                                      patch))
        sizes = ", ".join(f"{r} {n}" for r, n in decision.groups.items() if n != seen.groups.get(r))
        kopf.event(body, type="Normal", reason="RoleResized", message=f"worker groups resized: {sizes}" + (
            f" (giving up pods {', '.join(p for ps in decision.leaving.values() for p in ps)})"
            if decision.leaving else ""))
    for pod in decision.delete_pods:
        await ctx.kube.delete(PODS, namespace, pod)
    if decision.teardown:
        await ctx.kube.delete(RAYCLUSTERS, namespace, names.cluster(name))

