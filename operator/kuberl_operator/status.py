"""Observations -> the job's status: phase, conditions, per-role health, progress, and the actions
that follow (pods to delete, Events to post, the RayCluster to tear down).

``decide`` is pure; the reconciler gathers the observations, writes the status it returns with a
resourceVersion precondition, and only then acts, so every action follows a recorded decision.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kuberl.colocation import host_of
from kuberl.spec import RLTrainingJob, enabled_roles
from kuberl.spec.contract import Reason, restart_budget_spent

from . import conditions as cond
from . import names, rescale
from .health import PodView, Tracking, assess_role
from .progress import DriverOutcome, Progress
from .spec_changes import unapplied_changes

PENDING, PROVISIONING, RUNNING, RESTARTING = "Pending", "Provisioning", "Running", "Restarting"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
ROLE_RESTARTING = "RoleRestarting"
HEAD_FAILED = "RayHeadFailed"  # the Ray head pod failed: the whole Ray cluster restarts
ROLE_FAILED = "RoleFailed"  # the driver reported a role's failure (a hang's diagnosis, a process that died)
UNSCHEDULABLE = "RoleUnschedulable"  # no node satisfies a role's constraints (the scheduler says why)
POLICY_DENIED = "PolicyDenied"  # the job breaks the platform's job policy (job_policy.py): nothing is made
IMAGE_PULL_FAILED = "ImagePullFailed"  # a role's container cannot start from its image (not loaded, wrong name)
RESTART_TIMED_OUT = "RestartTimedOut"  # Restarting past spec.resilience.restartTimeoutSeconds
PROVISIONING_TIMED_OUT = "ProvisioningTimedOut"  # Provisioning past spec.resilience.startTimeoutSeconds
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # every time in status (reconcile.now)
PLACEMENT_DEGRADED = Reason.PLACEMENT_DEGRADED.value  # the driver refused GPUs linked below spec.placement.minLink


@dataclass(frozen=True)
class Observed:
    """What the operator sees of a job's world at one moment."""

    cluster_uid: str | None  # the live RayCluster's UID; None when absent or being deleted
    pods: Sequence[PodView] = ()  # worker pods (they carry a role)
    progress: Progress = field(default_factory=Progress)
    driver: DriverOutcome | None = None
    head: Sequence[PodView] = ()  # the Ray head pod (more than one while KubeRay replaces it)
    applied_spec: Mapping[str, Any] | None = None  # what the live RayCluster was built from (spec_changes)
    groups: Mapping[str, int] = field(default_factory=dict)  # the live RayCluster's worker group replicas, by role
    given_up: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # its scaleStrategy.workersToDelete


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    status: dict[str, Any]
    events: tuple[Event, ...] = ()
    delete_pods: tuple[str, ...] = ()
    teardown: bool = False  # the job is over: delete its RayCluster to free the GPUs
    groups: Mapping[str, int] = field(default_factory=dict)  # worker group replicas of live-resized roles
    leaving: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # pods a shrinking group gives up


@dataclass
class RoleOutcome:
    status: dict[str, Any]
    failures: tuple[str, ...]
    doomed: tuple[str, ...]
    leaving: tuple[str, ...] = ()  # pods given up by a shrink (no failure): KubeRay deletes them


def role_outcome(role: str, job: RLTrainingJob, old: Mapping[str, Any], seen: Observed, accounting: bool,
                 now: str, cluster_restart: bool = False) -> RoleOutcome:
    """One role's status; with ``accounting`` on, new pod failures are counted and its gang doomed. On a
    ``cluster_restart`` (the head failed) every pod of the role goes, and none of it counts as the role's failure.

    A colocated role's pods are its host's (``colocateWith``): it is ready when they are, and their failure is
    its failure too (its processes ran there), counted against its own budget with its own bookkeeping; they go
    as the host's gang. A failure of its processes alone is the driver's to see and restart: it comes in the
    progress report (restarts, lastFailure), and no pod is touched for it."""
    spec = job.spec.roles.get(role)
    host = host_of(job.spec, role)
    prev = (old.get("roles") or {}).get(role) or {}
    pods = [p for p in seen.pods if p.role == host and seen.cluster_uid is not None and p.owner == seen.cluster_uid]
    pod_restarts = int(prev.get("podRestarts", 0))
    last_failure = prev.get("lastFailure")
    failures: tuple[str, ...] = ()
    doomed: tuple[str, ...] = ()
    leaving: tuple[str, ...] = ()
    if accounting:
        same_cluster = old.get("rayClusterUID") == seen.cluster_uid
        known = Tracking.from_status(prev) if same_cluster else Tracking()
        live = role in rescale.live_roles(job)
        keep = rescale.group_pods(job, role, seen.progress, seen.applied_spec, seen.groups.get(role)) if live else 0
        if live and keep < (seen.groups.get(role) or 0):
            gone = rescale.leaving(pods, keep, seen.progress.hosts_of(role))
            leaving = tuple(p.name for p in gone)
            known = Tracking({u: n for u, n in known.members.items() if n not in leaving},
                             known.handled | {p.uid for p in gone})
        health = assess_role(pods, known, gang=not job.spec.standby(host))
        failures, doomed, tracking, ready = health.failures, health.doomed, health.tracking, health.ready
        if cluster_restart:
            failures, ready, tracking = (), 0, Tracking({}, frozenset(p.uid for p in pods))
            doomed = tuple(sorted(p.name for p in pods if not p.deleting))
        # KubeRay deletes what a shrink gives up, never the operator: were the pod gone before KubeRay's
        # own delete of it, KubeRay would count it still there and delete another pod of the group.
        kuberay_deletes = {*leaving, *seen.given_up.get(host, ())}
        doomed = tuple(n for n in doomed if n not in kuberay_deletes)
        if failures:
            pod_restarts += 1
            last_failure = f"{now}: {'; '.join(failures)}"
    else:
        tracking, ready = Tracking(), 0
    reported = seen.progress.failure_of(role)  # what the driver saw (a hang's diagnosis): no pod failed for it
    if reported and reported != prev.get("driverFailure"):
        last_failure = f"{now}: {reported}"
    image = image_problem(pods)
    if image and image != prev.get("imageWaiting"):
        last_failure = f"{now}: {image}"
    standby = int(job.spec.standby(role))
    status = {
        "desired": spec.replicas + standby,  # the role's pods, its standby's included
        **({"colocatedWith": host} if host != role else {}),
        **({"standby": standby} if standby else {}),
        "ready": ready,
        "restarts": max(pod_restarts, seen.progress.restarts_of(role)),
        "podRestarts": pod_restarts,
        **({"lastFailure": last_failure} if last_failure else {}),
        **({"driverFailure": reported} if reported else {}),
        **({"replicas": n} if (n := seen.progress.replicas_of(role)) is not None else {}),
        **({"worstLink": link} if (link := seen.progress.link_of(role)) else {}),
        **({"unschedulable": waits, "unschedulableSince": prev.get("unschedulableSince") or now}
           if (waits := waiting_for_node(pods)) else {}),
        **({"imageWaiting": image} if image else {}),
        **tracking.to_status(),
    }
    return RoleOutcome(status, failures, doomed, leaving)


@dataclass
class HeadOutcome:
    status: dict[str, Any]
    failures: tuple[str, ...]
    doomed: tuple[str, ...]
    observed: bool  # a head pod of the current cluster is listed
    ready: bool


def head_outcome(old: Mapping[str, Any], seen: Observed, accounting: bool, now: str) -> HeadOutcome:
    """The Ray head's status (``status.head``), counted like a role of one pod: a head pod that fails,
    is deleted, or whose node is lost is a new failure, once."""
    prev = old.get("head") or {}
    pods = [p for p in seen.head if seen.cluster_uid is not None and p.owner == seen.cluster_uid]
    restarts, last_failure = int(prev.get("restarts", 0)), prev.get("lastFailure")
    failures: tuple[str, ...] = ()
    doomed: tuple[str, ...] = ()
    tracking, ready = Tracking(), False
    if accounting:
        same_cluster = old.get("rayClusterUID") == seen.cluster_uid
        health = assess_role(pods, Tracking.from_status(prev) if same_cluster else Tracking())
        failures, doomed, tracking, ready = health.failures, health.doomed, health.tracking, health.ready > 0
        if failures:
            restarts += 1
            last_failure = f"{now}: {'; '.join(failures)}"
    status = {"ready": ready, "restarts": restarts, **({"lastFailure": last_failure} if last_failure else {}),
              **tracking.to_status()}
    return HeadOutcome(status, failures, doomed, bool(pods), ready)


def parse_time(when: str) -> datetime.datetime:
    return datetime.datetime.strptime(when, TIME_FORMAT).replace(tzinfo=datetime.UTC)


def later(when: str, seconds: float) -> str:
    """An RFC 3339 time (as status writes it) plus ``seconds``."""
    return (parse_time(when) + datetime.timedelta(seconds=seconds)).strftime(TIME_FORMAT)


def overdue(job: RLTrainingJob, active: tuple[str, str, str], roles: Mapping[str, RoleOutcome],
            head: HeadOutcome, old: Mapping[str, Any], now: str) -> tuple[str, str, str] | None:
    """(Failed, reason, message) when the job has been Restarting or Provisioning past its deadline, in the
    same phase since ``status.phaseSince``; the message names what it waited for: the phase's own message and
    the pods not ready, by role."""
    phase, _, message = active
    since = old.get("phaseSince")
    if phase != old.get("phase") or not since:
        return None
    resilience = job.spec.resilience
    if phase == RESTARTING:
        bound, name, reason = resilience.restart_deadline_seconds(), "restartTimeoutSeconds", RESTART_TIMED_OUT
    elif phase == PROVISIONING:
        bound, name, reason = resilience.start_timeout_seconds, "startTimeoutSeconds", PROVISIONING_TIMED_OUT
    else:
        return None
    if (parse_time(now) - parse_time(since)).total_seconds() < bound:
        return None
    waiting = [f"role {r} {o.status['ready']}/{o.status['desired']}" for r, o in roles.items()
               if o.status["ready"] < o.status["desired"]] + ([] if head.ready else ["the Ray head"])
    return FAILED, reason, (f"{phase} since {since}, past spec.resilience.{name} ({bound:g}s): {message}; "
                            f"not ready: {', '.join(waiting) or 'none'}")


def waiting_for_node(pods: Sequence[PodView]) -> str | None:
    """Why a role's pods wait for a node, in the scheduler's words ("1 pod unschedulable: 0/6 nodes are
    available: ..."), the message of the first such pod by name; None when none waits."""
    stuck = sorted((p.name, p.unschedulable) for p in pods if p.unschedulable and not p.deleting)
    if not stuck:
        return None
    return f"{len(stuck)} pod{'s' if len(stuck) > 1 else ''} unschedulable: {stuck[0][1]}"


def image_problem(pods: Sequence[PodView]) -> str | None:
    """Why a role's pods cannot start from their image, for the first such pod by name; None when none waits."""
    stuck = sorted((p.name, p.image) for p in pods if p.image and not p.deleting)
    return f"pod {stuck[0][0]} {stuck[0][1]}" if stuck else None


def verdict(job: RLTrainingJob, roles: Mapping[str, RoleOutcome], seen: Observed) -> tuple[str, str, str] | None:
    """(phase, reason, message) when the job is over: a spent restart budget, or the driver's outcome."""
    for r, o in roles.items():
        budget = job.spec.roles.get(r).max_restarts
        if restart_budget_spent(o.status["restarts"], budget):
            last = f"; last failure {o.status['lastFailure']}" if o.status.get("lastFailure") else ""
            message = (f"role {r} restarted {o.status['restarts']} times, more than "
                       f"spec.{job.spec.roles.path(r)}.maxRestarts ({budget}){last}")
            return FAILED, Reason.REACHED_MAX_RESTARTS.value, message
    if job.spec.suspend or seen.driver is None:
        return None  # a driver that ends because the job was suspended does not end the job
    if seen.driver.succeeded:
        return SUCCEEDED, "DriverSucceeded", seen.driver.message
    report = seen.progress if seen.progress.phase == FAILED else Progress()  # the driver's own account
    message = f"{report.message} ({seen.driver.message})" if report.message else seen.driver.message
    return FAILED, report.reason or "DriverFailed", message


def shared_action(host: str) -> str:
    """What a colocated role's pod failure does: the pods are its host's, and go with the host's."""
    return (f"its processes ran on role {host}'s pods (colocateWith), which restart as {host}'s gang, "
            f"with every role on them")


def head_failed_message(head: HeadOutcome) -> str:
    return (f"Ray head {'; '.join(head.failures)}: the whole Ray cluster restarts (every role's pods are "
            f"replaced; the driver resumes from its last checkpoint)")


def active_phase(job: RLTrainingJob, roles: Mapping[str, RoleOutcome], seen: Observed,
                 ready: Mapping[str, Any] | None, head: HeadOutcome | None = None) -> tuple[str, str, str]:
    """(phase, Ready reason, message) of a job that runs; ``ready`` is the previous Ready condition."""
    restarting = [r for r, o in roles.items() if o.failures]
    waiting = [f"{r} {o.status['ready']}/{o.status['desired']}" for r, o in roles.items()
               if o.status["ready"] < o.status["desired"]]
    if seen.cluster_uid is None:
        return PENDING, "WaitingForRayCluster", f"waiting for RayCluster {names.cluster(job.metadata.name)}"
    if head is not None and head.failures:
        return RESTARTING, HEAD_FAILED, head_failed_message(head)
    head_down = head is not None and head.observed and not head.ready
    if ready is not None and ready.get("reason") == HEAD_FAILED and (waiting or head is None or not head.ready):
        return RESTARTING, HEAD_FAILED, ready["message"]  # until the new head and every role are ready
    if head_down:
        waiting.insert(0, "the Ray head")
    if restarting:
        return RESTARTING, ROLE_RESTARTING, f"restarting {', '.join(restarting)}"
    if waiting and ready is not None and ready.get("reason") == ROLE_RESTARTING:
        return RESTARTING, ROLE_RESTARTING, ready["message"]  # until the restarted role is ready again
    bound = job.spec.resilience.start_timeout_seconds
    stuck = [f"role {r} waits for a node: {o.status['unschedulable']} (since {o.status['unschedulableSince']}; the "
             f"driver gives up at {later(o.status['unschedulableSince'], bound)}, "
             f"spec.resilience.startTimeoutSeconds {bound:g}s after)" for r, o in roles.items()
             if o.status.get("unschedulable")]
    if stuck:
        return PROVISIONING, UNSCHEDULABLE, "; ".join(stuck)
    images = [f"role {r}: {o.status['imageWaiting']}" for r, o in roles.items() if o.status.get("imageWaiting")]
    if images:
        return PROVISIONING, IMAGE_PULL_FAILED, "; ".join(images) + " (check spec.image or the operator's --image)"
    if waiting:
        return PROVISIONING, "RolesNotReady", f"waiting for pods: {', '.join(waiting)}"
    return RUNNING, "AllRolesReady", f"all {len(roles)} roles ready"


def restart_note(job: RLTrainingJob, role: str, outcome: RoleOutcome, action: str) -> str:
    """What a role's newest failure leads to: its restart (n of at most maxRestarts), or the job's end."""
    budget, restarts = job.spec.roles.get(role).max_restarts, outcome.status["restarts"]
    if restart_budget_spent(restarts, budget):
        return f"no restart: failure {restarts} spends spec.{job.spec.roles.path(role)}.maxRestarts ({budget})"
    host = outcome.status.get("colocatedWith")
    return f"{shared_action(host) if host else action} (restart {restarts} of at most {budget})"


def decide(job: RLTrainingJob, generation: int, old: Mapping[str, Any], seen: Observed, now: str) -> Decision:
    """The next status of a (valid) job and what to do about it."""
    conds: list[dict[str, Any]] = [dict(c) for c in old.get("conditions", [])]
    if cond.terminal(conds):  # sticky: a finished job's status is final
        return Decision(dict(old), teardown=seen.cluster_uid is not None)

    def put(type_: str, status: bool, reason: str, message: str) -> None:
        nonlocal conds
        conds = cond.set_condition(conds, type_, status, reason, message, generation, now)

    accounting = not job.spec.suspend and seen.cluster_uid is not None
    head = head_outcome(old, seen, accounting, now)
    roles = {r: role_outcome(r, job, old, seen, accounting, now, cluster_restart=bool(head.failures))
             for r in enabled_roles(job.spec)}
    events = [Event("Warning", HEAD_FAILED, head_failed_message(head))] if head.failures else []
    def action(role: str) -> str:
        return ("its standby takes the failed pods' place, and a new standby pod is made" if job.spec.standby(role)
                else "restarting the role's pods")

    events += [Event("Warning", "RoleRestart", f"role {r}: {'; '.join(o.failures)}; "
                                               f"{restart_note(job, r, o, action(r))}")
               for r, o in roles.items() if o.failures]
    events += [Event("Warning", ROLE_FAILED, f"role {r} (reported by the driver): {why}")
               for r, o in roles.items()
               if (why := o.status.get("driverFailure")) and why != ((old.get("roles") or {}).get(r) or {}).get(
                   "driverFailure")]
    events += [Event("Warning", IMAGE_PULL_FAILED, f"role {r}: {why}")
               for r, o in roles.items()
               if (why := o.status.get("imageWaiting")) and why != ((old.get("roles") or {}).get(r) or {}).get(
                   "imageWaiting")]
    events += [Event("Warning", UNSCHEDULABLE, f"role {r} waits for a node: {why}")
               for r, o in roles.items()
               if (why := o.status.get("unschedulable")) and why != ((old.get("roles") or {}).get(r) or {}).get(
                   "unschedulable")]
    ended, active = verdict(job, roles, seen), None
    if ended is None and not job.spec.suspend:
        active = active_phase(job, roles, seen, cond.find(conds, cond.READY), head)
        ended = overdue(job, active, roles, head, old, now)
    if ended is not None:
        phase, reason, message = ended
        put(phase, True, reason, message)  # the Succeeded or Failed condition
        if reason == PLACEMENT_DEGRADED:
            put(PLACEMENT_DEGRADED, True, reason, message)
        put(cond.READY, False, f"Job{phase}", message)
        events.append(Event("Normal" if phase == SUCCEEDED else "Warning", reason, message))
    elif job.spec.suspend:
        phase, message = SUSPENDED, "spec.suspend is true: the RayCluster and the driver are stopped"
        put(cond.SUSPENDED, True, "Suspended", message)
        put(cond.READY, False, "Suspended", message)
    else:
        if cond.find(conds, cond.SUSPENDED) is not None:
            put(cond.SUSPENDED, False, "Resumed", "spec.suspend is false")
        assert active is not None  # computed above for a job that runs
        phase, reason, message = active
        put(cond.READY, phase == RUNNING, reason, message)
        if phase == RUNNING and old.get("phase") != RUNNING:
            events.append(Event("Normal", "Running", message))
        if phase == RUNNING and seen.progress.message:
            message = seen.progress.message

    status = {k: v for k, v in old.items() if k not in ("rayCluster", "rayClusterUID", "pendingChanges")}
    if seen.cluster_uid is not None and not job.spec.suspend and (pending := live_pending(job, seen)):
        status["pendingChanges"] = pending  # until applied: live ones by the driver, the rest by a suspend and resume
    status.update(phase=phase, phaseSince=old.get("phaseSince") or now if old.get("phase") == phase else now,
                  message=message, conditions=conds, observedGeneration=generation,
                  roles={r: o.status for r, o in roles.items()}, head=head.status,
                  restarts=sum(o.status["restarts"] for o in roles.values()) + head.status["restarts"])
    if seen.cluster_uid is not None:
        status.update(rayCluster=names.cluster(job.metadata.name), rayClusterUID=seen.cluster_uid)
    progress = {"step": seen.progress.step, "totalSteps": seen.progress.total_steps,
                "tokensPerSec": seen.progress.tokens_per_sec, "resumedFrom": seen.progress.resumed_from,
                "stepsLost": seen.progress.steps_lost}
    status.update({k: v for k, v in progress.items() if v is not None})
    terminal = ended is not None
    # a colocated role dooms its host's pods with the host: each pod is deleted once
    doomed = dict.fromkeys((*head.doomed, *(p for o in roles.values() for p in o.doomed)))
    delete_pods = () if terminal else tuple(doomed)
    groups = {} if terminal or seen.cluster_uid is None else {
        r: rescale.group_pods(job, r, seen.progress, seen.applied_spec, seen.groups.get(r))
        for r in rescale.live_roles(job) if r in roles}
    leaving = {r: o.leaving for r, o in roles.items() if o.leaving}
    return Decision(status, tuple(events), delete_pods, teardown=terminal and seen.cluster_uid is not None,
                    groups=groups, leaving=leaving)


def live_pending(job: RLTrainingJob, seen: Observed) -> list[str]:
    """status.pendingChanges: fields changed since the RayCluster was built, but the live ones (`rescale`),
    which are pending while the driver runs another size than the spec's (whatever the RayCluster was built with)."""
    live = rescale.live_fields(job)
    waiting = {f for f in live if rescale.pending(job, f.split(".")[2], seen.progress, seen.applied_spec)}
    return sorted({f for f in unapplied_changes(seen.applied_spec, job) if f not in live} | waiting)


def refused_status(old: Mapping[str, Any], generation: int, reason: str, message: str, now: str) -> dict[str, Any]:
    """Status of a job refused before anything was made: Failed for ``reason``, naming the fields."""
    conds = cond.set_condition(old.get("conditions", []), cond.FAILED, True, reason, message, generation, now)
    conds = cond.set_condition(conds, cond.READY, False, reason, message, generation, now)
    return {"phase": FAILED, "message": message, "conditions": conds, "observedGeneration": generation}


def invalid_spec_status(old: Mapping[str, Any], generation: int, message: str, now: str) -> dict[str, Any]:
    """Status of a job whose spec does not validate: Failed, reason InvalidSpec, naming the fields."""
    return refused_status(old, generation, "InvalidSpec", message, now)


def policy_denied_status(old: Mapping[str, Any], generation: int, message: str, now: str) -> dict[str, Any]:
    """Status of a job that breaks the operator's job policy (--job-policy): Failed, reason PolicyDenied."""
    return refused_status(old, generation, POLICY_DENIED, message, now)


def infeasible_status(old: Mapping[str, Any], generation: int, message: str, now: str) -> dict[str, Any]:
    """Status of a job whose required placement no cluster can give (nothing was created): Failed
    with reason PlacementDegraded, and the PlacementDegraded condition naming the fields."""
    conds = cond.set_condition(old.get("conditions", []), PLACEMENT_DEGRADED, True, "Infeasible", message,
                               generation, now)
    conds = cond.set_condition(conds, cond.FAILED, True, PLACEMENT_DEGRADED, message, generation, now)
    conds = cond.set_condition(conds, cond.READY, False, PLACEMENT_DEGRADED, message, generation, now)
    return {"phase": FAILED, "message": message, "conditions": conds, "observedGeneration": generation}


def merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch that turns ``old`` into ``new`` (None where nothing changes)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None if old == new else new
    out: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        out[key] = None
    for key, value in new.items():
        if key not in old:
            out[key] = value
        elif (sub := merge_diff(old[key], value)) is not None:
            out[key] = sub
    return out or None
