"""kopf handlers for RLTrainingJobs: thin, each hands its work to `reconcile` and the pure modules.

Run with ``kuberl operator`` or ``kopf run -m kuberl_operator.handlers``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from kuberl.spec.model import MANAGED_BY_KUBERL

from . import api_traffic, gang, names, reconcile
from .cache import kept
from .config import OperatorConfig
from .health import PodView, pod_view
from .kube import Kube
from .metrics import Metrics
from .progress import driver_outcome, parse_progress

JOB = names.JOB_RESOURCE
WORKERS = {names.LABEL_JOB: kopf.PRESENT, names.LABEL_ROLE: kopf.PRESENT}
HEADS = {names.LABEL_JOB: kopf.PRESENT, names.LABEL_COMPONENT: "head"}
PROGRESS = {names.LABEL_JOB: kopf.PRESENT, names.LABEL_COMPONENT: "progress"}
DRIVER = {names.LABEL_JOB: kopf.PRESENT, names.LABEL_COMPONENT: "driver"}
RESYNC_SECONDS = float(os.environ.get("KUBERL_RESYNC_SECONDS", "30"))


def ours(spec: kopf.Spec, **_: Any) -> bool:
    """spec.managedBy unset or kuberl's: a job another controller manages (MultiKueue's copy on its manager
    cluster) gets no handler, no finalizer and no status from this operator."""
    return spec.get("managedBy") in (None, MANAGED_BY_KUBERL)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Our finalizer and storage prefix; only warnings of kopf's log become Events (ours are posted
    explicitly); server-side label selectors, so only the objects of jobs stream (pods, ConfigMaps, Jobs...)."""
    settings.persistence.finalizer = names.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=names.PREFIX)
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "kuberl-operator"
    settings.posting.event_name_prefix = "kuberl-"
    # A job deleted while its resync timer runs: kopf re-checks the timer's exit every this many
    # seconds before releasing the finalizer (its default, 60 s, held deletions for a minute).
    settings.background.cancellation_polling = 1.0
    for res in (*reconcile.CACHED[1:], reconcile.PODS):
        settings.watching.label_selectors[res.group or "v1", res.plural] = names.LABEL_JOB
    config = memo.get("config") or OperatorConfig.from_env()
    metrics = memo.get("metrics") or Metrics()  # `kuberl operator` serves it from before the leader election
    api_traffic.count_kopf_requests(metrics.request)
    memo.ctx = reconcile.Context(kube=Kube(settings, trace=api_traffic.trace_config(metrics.request)),
                                 config=config, metrics=metrics)
    metrics.cache_sizes = lambda: {plural: len(index) for plural, index in memo.ctx.cache.items()}
    if config.metrics_port is not None and memo.get("metrics") is None:
        memo.metrics_server = memo.ctx.metrics.serve(config.metrics_port, config.metrics_address)
    if memo.get("standby") is not None:  # a leader's health endpoint while it waited: kopf's takes the port next
        memo.standby.close()


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    await memo.ctx.kube.close()
    if memo.get("metrics_server") is not None:
        memo.metrics_server.shutdown()
        memo.metrics_server.server_close()


@kopf.on.probe(id="jobs")
def tracked_jobs(memo: kopf.Memo, **_: Any) -> int:
    """Liveness detail: how many jobs this process holds a status lock for."""
    return len(memo.ctx.locks)


def remembered(memo: kopf.Memo, body: Mapping[str, Any]) -> PodView:
    """The pod's view; a failure it shows is remembered past the pod (`health.LastWords`)."""
    view = pod_view(body)
    if view.failure and memo.get("ctx") is not None:
        memo.ctx.last_words.note(view.uid, view.failure)
    return view


@kopf.index("pods", labels=WORKERS)
def worker_pods(namespace: str, labels: kopf.Labels, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict:
    return {(namespace, labels[names.LABEL_JOB]): remembered(memo, body)}


@kopf.index("pods", labels=HEADS)
def head_pods(namespace: str, labels: kopf.Labels, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict:
    return {(namespace, labels[names.LABEL_JOB]): remembered(memo, body)}


@kopf.index("pods", labels={names.LABEL_JOB: kopf.PRESENT})
def gated_pods(namespace: str, labels: kopf.Labels, name: str, body: kopf.Body, **_: Any) -> dict:
    """The job's pods that still carry the gang gate (gang.py): a status pass then weighs the gang."""
    return {(namespace, labels[names.LABEL_JOB]): name} if gang.gated(body) and gang.live(body) else {}


@kopf.index("configmaps", labels=PROGRESS)
def progress_reports(namespace: str, name: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    """A job's progress report, from its own ConfigMap only: the driver (user code) may patch its ConfigMap,
    labels included, so a label naming another job is not enough; the name is fixed at creation."""
    job = labels[names.LABEL_JOB]
    if name != names.progress_configmap(job):
        return {}
    return {(namespace, job): parse_progress((body.get("data") or {}).get("progress"))}


@kopf.index("batch", "jobs", labels=DRIVER)
def driver_jobs(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    return {(namespace, labels[names.LABEL_JOB]): driver_outcome(body)}


def cached_object(namespace: str, name: str, body: kopf.Body, resource: kopf.Resource, **_: Any) -> dict:
    """The object by (namespace, name), as much of it as a reconcile reads instead of a GET (`cache.kept`)."""
    return {(namespace, name): kept(resource.plural, body)}


def selector(res: reconcile.Resource) -> tuple[str, ...]:
    """kopf's positional resource arguments: (version, plural) for the core group."""
    return (res.group, res.version, res.plural) if res.group else (res.version, res.plural)


for _res in reconcile.CACHED:  # one index per kind, named reconcile.cache_index(kind)
    kopf.index(*selector(_res), id=reconcile.cache_index(_res),
               **({} if _res is reconcile.RLTRAININGJOBS else {"labels": {names.LABEL_JOB: kopf.PRESENT}}))(
        cached_object)


@kopf.on.event("pods", labels=WORKERS)
@kopf.on.event("pods", labels=HEADS)
@kopf.on.event("pods", labels=DRIVER)
@kopf.on.event("configmaps", labels=PROGRESS)
@kopf.on.event("batch", "jobs", labels=DRIVER)
async def child_changed(namespace: str, labels: kopf.Labels, memo: kopf.Memo, resource: kopf.Resource,
                        type: str | None = None, **kwargs: Any) -> None:
    """A pod, the progress report or the driver Job changed: refresh the job's status. A pod gone frees room:
    the gangs that wait are weighed again."""
    indices, job = memo.ctx.indices(kwargs), labels[names.LABEL_JOB]
    if type == "DELETED" and resource.plural == "pods":  # its final state: it may have failed unseen
        remembered(memo, kwargs["body"])
    await reconcile.reconcile_status(memo.ctx, namespace, job, indices)
    if type == "DELETED" and resource.plural == "pods" and memo.ctx.gang_waits:
        await reconcile.retry_gangs(memo.ctx, indices, (namespace, job))  # after a delay: see its docstring


async def owned_deleted(namespace: str, name: str, labels: kopf.Labels, resource: kopf.Resource,
                        memo: kopf.Memo, **kwargs: Any) -> None:
    """An object a job owns was deleted (by hand, or by us): a level-triggered pass on its job at once (what this
    process wrote of it is forgotten first: it is gone). Registered with the filter `deleted`."""
    memo.ctx.written.drop(resource.plural, namespace, name)
    await reconcile.resync(memo.ctx, namespace, labels[names.LABEL_JOB], kopf.Patch(), memo.ctx.indices(kwargs))


def deleted(type: str, **_: Any) -> bool:
    """kopf's filter: a DELETED event (the handler is not even invoked for the others, most of a burst's events)."""
    return type == "DELETED"


for _res in reconcile.CACHED[1:]:
    kopf.on.event(*selector(_res), id=f"{_res.plural}_deleted",
                  labels={names.LABEL_JOB: kopf.PRESENT}, when=deleted)(owned_deleted)


@kopf.on.create(*JOB, when=ours)
@kopf.on.resume(*JOB, when=ours)
@kopf.on.update(*JOB, field="spec", when=ours)
async def apply_spec(body: kopf.Body, patch: kopf.Patch, diff: kopf.Diff, memo: kopf.Memo, **kwargs: Any) -> None:
    """Validate, then create (or, when suspended, stop) what the job needs; then refresh status."""
    await reconcile.reconcile_job(memo.ctx, body, patch, diff, memo.ctx.indices(kwargs))


@kopf.timer(*JOB, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS, when=ours)
async def resync(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any) -> None:
    """A periodic level-triggered pass: missed events, children deleted by hand."""
    await reconcile.resync(memo.ctx, body.meta.namespace, body.meta.name, patch, memo.ctx.indices(kwargs))


@kopf.on.delete(*JOB, when=ours)
async def delete_children(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Delete what the job owns; kopf then removes our finalizer."""
    ctx: reconcile.Context = memo.ctx
    await reconcile.delete_children(ctx, ctx.indices(kwargs), body)
    ctx.metrics.forget(body.meta.namespace, body.meta.name)
    ctx.locks.pop((body.meta.namespace, body.meta.name), None)
    ctx.gang_waits.pop((body.meta.namespace, body.meta.name), None)
