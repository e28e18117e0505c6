"""Observations -> the job's status: phase, conditions, per-role health, progress, and the actions
that follow (pods to delete, Events to post, the RayCluster to tear down).

``decide`` is pure, a chain of small named rules: the sticky rule of a finished job, each role's and the
head's outcome (`role_outcome`, `head_outcome`), the Events of new failures, the phase rule (ended,
suspended or active), the status assembly (typed: `kuberl.spec.status`) and the pods to delete. The
reconciler gathers the observations, writes the status it returns with a resourceVersion precondition, and
only then acts, so every action follows a recorded decision.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from kuberl.spec import RLTrainingJob, enabled_roles
from kuberl.spec.colocation import host_of
from kuberl.spec.contract import Reason, restart_budget_spent
from kuberl.spec.status import HeadStatus, JobPhase, JobStatus, RoleStatus, TrainerStatus

from . import conditions as cond
from . import names, resize
from .health import PodView, RoleHealth, Tracking, assess_role
from .progress import DriverOutcome, Progress
from .spec_changes import unapplied_changes

PENDING, PROVISIONING, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED = get_args(JobPhase)
ROLE_RESTARTING = "RoleRestarting"
HEAD_FAILED = "RayHeadFailed"  # the Ray head pod failed: the whole Ray cluster restarts
ROLE_FAILED = "RoleFailed"  # the driver reported a role's failure (a hang's diagnosis, a process that died)
QUEUED, EVICTED = "Queued", "Evicted"  # Kueue holds the job's RayCluster suspended: not admitted yet, or taken back
GANG_WAITING = "GangWaiting"  # its pods wait, all gated, until the whole set fits the nodes (gang.py)
UNSCHEDULABLE = "RoleUnschedulable"  # no node satisfies a role's constraints (the scheduler says why)
POLICY_DENIED = "PolicyDenied"  # the job breaks the platform's job policy (job_policy.py): nothing is made
IMAGE_PULL_FAILED = "ImagePullFailed"  # a role's container cannot start from its image (not loaded, wrong name)
RESTART_TIMED_OUT = "RestartTimedOut"  # Restarting past spec.resilience.restartTimeoutSeconds
PROVISIONING_TIMED_OUT = "ProvisioningTimedOut"  # Provisioning past spec.resilience.startTimeoutSeconds
DEADLINE_EXCEEDED = "DeadlineExceeded"  # active past spec.activeDeadlineSeconds
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # every time in status (reconcile.now)
PLACEMENT_DEGRADED = Reason.PLACEMENT_DEGRADED.value  # the driver refused GPUs linked below spec.placement.minLink
# kept from the old status only if written again
REWRITTEN = ("rayCluster", "rayClusterUID", "pendingChanges", "startTime")
# A role's new report, Event per change of its value: (RoleStatus field, Event reason, message with {role}, {why}).
NEWS = (("driver_failure", ROLE_FAILED, "role {role} (reported by the driver): {why}"),
        ("image_waiting", IMAGE_PULL_FAILED, "role {role}: {why}"),
        ("unschedulable", UNSCHEDULABLE, "role {role} waits for a node: {why}"))
PhaseNote = tuple[str, str, str]  # (phase, reason, message): how a job ended (verdict, overdue), or its active phase


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
    gang_wait: str | None = None  # why the job's gated pods wait to be let through together (gang.py), or None
    queued: bool = False  # its RayCluster is suspended by Kueue: not admitted yet, or preempted
    last_words: Mapping[str, str] = field(default_factory=dict)  # how pods now gone had failed, by UID (LastWords)


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about the job, posted after its status is written."""

    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    """What a pass writes (the status, as JSON) and does."""

    status: dict[str, Any]
    events: tuple[Event, ...] = ()
    delete_pods: tuple[str, ...] = ()
    teardown: bool = False  # the job is over: delete its RayCluster to free the GPUs
    groups: Mapping[str, int] = field(default_factory=dict)  # worker group replicas of live-resized roles
    leaving: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # pods a shrinking group gives up


@dataclass
class RoleOutcome:
    """A role's status this pass, and what its pods' health asks for."""

    status: RoleStatus
    failures: tuple[str, ...]
    doomed: tuple[str, ...]
    leaving: tuple[str, ...] = ()  # pods given up by a shrink (no failure): KubeRay deletes them


@dataclass(frozen=True)
class PodCount:
    """One pass's count of a role's pods: ready ones, new failures, pods to delete, pods a shrink gives up."""

    ready: int = 0
    failures: tuple[str, ...] = ()
    doomed: tuple[str, ...] = ()
    leaving: tuple[str, ...] = ()
    tracking: Tracking = field(default_factory=Tracking)


def previous_role(old: Mapping[str, Any], role: str) -> Mapping[str, Any]:
    """The role's entry in the old status (empty when it has none)."""
    return (old.get("roles") or {}).get(role) or {}


def cluster_pods(pods: Sequence[PodView], seen: Observed, role: str | None = None) -> list[PodView]:
    """The pods of the live RayCluster, of one ``role`` (None: any); none without a RayCluster."""
    if seen.cluster_uid is None:
        return []
    return [p for p in pods if p.owner == seen.cluster_uid and (role is None or p.role == role)]


def known_tracking(old: Mapping[str, Any], prev: Mapping[str, Any], seen: Observed) -> Tracking:
    """The bookkeeping to count against: the old status's, unless the RayCluster was replaced since."""
    return Tracking.from_status(prev) if old.get("rayClusterUID") == seen.cluster_uid else Tracking()


def shrink(job: RLTrainingJob, role: str, pods: Sequence[PodView], known: Tracking, seen: Observed,
           live: Sequence[str]) -> tuple[tuple[str, ...], Tracking]:
    """The pods a live shrink of the role gives up (``live``: the roles resized live), and the bookkeeping that
    counts their going as no failure."""
    if role not in live:
        return (), known
    keep = resize.group_pods(job, role, seen.progress, seen.applied_spec, seen.groups.get(role))
    if keep >= (seen.groups.get(role) or 0):
        return (), known
    gone = resize.leaving(pods, keep, seen.progress.hosts_of(role))
    leaving = tuple(p.name for p in gone)
    members = {u: n for u, n in known.members.items() if n not in leaving}
    return leaving, Tracking(members, known.handled | {p.uid for p in gone})


def count_pods(job: RLTrainingJob, role: str, host: str, pods: Sequence[PodView], known: Tracking, seen: Observed,
               live: Sequence[str], cluster_restart: bool) -> PodCount:
    """New failures of a role's pods and the pods to delete; on a ``cluster_restart`` every pod goes and none of
    it is the role's failure."""
    leaving, known = shrink(job, role, pods, known, seen, live)
    # KubeRay deletes what a shrink gives up, never the operator: were the pod gone before KubeRay's
    # own delete of it, KubeRay would count it still there and delete another pod of the group.
    kuberay_deletes = {*leaving, *seen.given_up.get(host, ())}
    if cluster_restart:
        doomed = tuple(sorted(p.name for p in pods if not p.deleting and p.name not in kuberay_deletes))
        return PodCount(doomed=doomed, leaving=leaving, tracking=Tracking({}, frozenset(p.uid for p in pods)))
    health = assess_role(pods, known, gang=not job.spec.standby(host), gone=seen.last_words)
    doomed = tuple(n for n in health.doomed if n not in kuberay_deletes)
    return PodCount(health.ready, health.failures, doomed, leaving, health.tracking)


def newest_failure(prev: Mapping[str, Any], now: str, failures: Sequence[str], reported: str | None,
                   image: str | None) -> str | None:
    """``lastFailure``: the old one, unless this pass brings new pod failures, a new report of the driver's, or a
    new image problem (the later of these wins)."""
    last = prev.get("lastFailure")
    if failures:
        last = f"{now}: {'; '.join(failures)}"
    if reported and reported != prev.get("driverFailure"):
        last = f"{now}: {reported}"
    if image and image != prev.get("imageWaiting"):
        last = f"{now}: {image}"
    return last or None


def role_status(job: RLTrainingJob, role: str, host: str, prev: Mapping[str, Any], seen: Observed,
                pods: Sequence[PodView], count: PodCount, now: str) -> RoleStatus:
    """``status.roles.<role>`` from this pass's count of its pods, the driver's report and the old entry."""
    reported, image, waits = seen.progress.failure_of(role), image_problem(pods), waiting_for_node(pods)
    pod_restarts = int(prev.get("podRestarts", 0)) + (1 if count.failures else 0)
    standby = int(job.spec.standby(role))
    return RoleStatus(
        desired=job.spec.roles.get(role).replicas + standby,  # the role's pods, its standby's included
        colocated_with=host if host != role else None,
        standby=standby or None,
        ready=count.ready,
        restarts=max(pod_restarts, seen.progress.restarts_of(role)),
        pod_restarts=pod_restarts,
        last_failure=newest_failure(prev, now, count.failures, reported, image),
        driver_failure=reported or None,
        replicas=seen.progress.replicas_of(role),
        worst_link=seen.progress.link_of(role) or None,
        unschedulable=waits,
        unschedulable_since=(prev.get("unschedulableSince") or now) if waits else None,
        image_waiting=image,
        **count.tracking.to_status(),
    )


def role_outcome(role: str, job: RLTrainingJob, old: Mapping[str, Any], seen: Observed, accounting: bool,
                 now: str, live: Sequence[str], cluster_restart: bool = False) -> RoleOutcome:
    """One role's status; with ``accounting`` on, new pod failures are counted and its gang doomed (``live``: the
    roles resized live, `resize.live_roles`). On a ``cluster_restart`` (the head failed) every pod of the role
    goes, and none of it counts as the role's failure.

    A colocated role's pods are its host's (``colocateWith``): it is ready when they are, and their failure is
    its failure too (its processes ran there), counted against its own budget with its own bookkeeping; they go
    as the host's gang. A failure of its processes alone is the driver's to see and restart: it comes in the
    progress report (restarts, lastFailure), and no pod is touched for it."""
    host, prev = host_of(job.spec, role), previous_role(old, role)
    pods = cluster_pods(seen.pods, seen, host)
    count = (count_pods(job, role, host, pods, known_tracking(old, prev, seen), seen, live, cluster_restart)
             if accounting else PodCount())
    return RoleOutcome(role_status(job, role, host, prev, seen, pods, count, now), count.failures, count.doomed,
                       count.leaving)


@dataclass
class HeadOutcome:
    """The Ray head's status this pass, and what its pod's health asks for."""

    status: HeadStatus
    failures: tuple[str, ...]
    doomed: tuple[str, ...]
    observed: bool  # a head pod of the current cluster is listed


def head_outcome(old: Mapping[str, Any], seen: Observed, accounting: bool, now: str) -> HeadOutcome:
    """The Ray head's status (``status.head``), counted like a role of one pod: a head pod that fails,
    is deleted, or whose node is lost is a new failure, once."""
    prev = old.get("head") or {}
    pods = cluster_pods(seen.head, seen)
    health = (assess_role(pods, known_tracking(old, prev, seen), gone=seen.last_words) if accounting
              else RoleHealth(0, (), Tracking(), ()))
    failed = f"{now}: {'; '.join(health.failures)}" if health.failures else None
    status = HeadStatus(ready=health.ready > 0, restarts=int(prev.get("restarts", 0)) + (1 if failed else 0),
                        last_failure=failed or prev.get("lastFailure") or None, **health.tracking.to_status())
    return HeadOutcome(status, health.failures, health.doomed, bool(pods))


def parse_time(when: str) -> datetime.datetime:
    """A time as status writes it (``TIME_FORMAT``), in UTC."""
    return datetime.datetime.strptime(when, TIME_FORMAT).replace(tzinfo=datetime.UTC)


def later(when: str, seconds: float) -> str:
    """An RFC 3339 time (as status writes it) plus ``seconds``."""
    return (parse_time(when) + datetime.timedelta(seconds=seconds)).strftime(TIME_FORMAT)


def deadline(job: RLTrainingJob, phase: str) -> tuple[float, str, str] | None:
    """(seconds, spec.resilience field, Failed reason) bounding ``phase``; None for a phase without a deadline."""
    resilience = job.spec.resilience
    if phase == RESTARTING:
        return resilience.restart_deadline_seconds(), "restartTimeoutSeconds", RESTART_TIMED_OUT
    if phase == PROVISIONING:
        return resilience.start_timeout_seconds, "startTimeoutSeconds", PROVISIONING_TIMED_OUT
    return None


def overdue(job: RLTrainingJob, active: PhaseNote, roles: Mapping[str, RoleOutcome], head: HeadOutcome,
            old: Mapping[str, Any], now: str) -> PhaseNote | None:
    """(Failed, reason, message) when the job has been Restarting or Provisioning past its deadline, in the
    same phase since ``status.phaseSince``; the message names what it waited for: the phase's own message and
    the pods not ready, by role."""
    phase, _, message = active
    since = old.get("phaseSince") if phase == old.get("phase") else None
    bounded = deadline(job, phase) if since else None
    if since is None or bounded is None:
        return None
    bound, name, reason = bounded
    if (parse_time(now) - parse_time(since)).total_seconds() < bound:
        return None
    waiting = [f"role {r} {o.status.ready}/{o.status.desired}" for r, o in roles.items()
               if o.status.ready < o.status.desired] + ([] if head.status.ready else ["the Ray head"])
    return FAILED, reason, (f"{phase} since {since}, past spec.resilience.{name} ({bound:g}s): {message}; "
                            f"not ready: {', '.join(waiting) or 'none'}")


def past_deadline(job: RLTrainingJob, old: Mapping[str, Any], now: str) -> PhaseNote | None:
    """(Failed, DeadlineExceeded, message) when the job has been active for spec.activeDeadlineSeconds since
    status.startTime (its start or its last resume)."""
    bound, since = job.spec.active_deadline_seconds, active_since(old)
    if bound is None or since is None:
        return None
    active = (parse_time(now) - parse_time(since)).total_seconds()
    if active < bound:
        return None
    return FAILED, DEADLINE_EXCEEDED, (f"active since {since} ({active:.0f}s), past spec.activeDeadlineSeconds "
                                       f"({bound}s)")


def active_since(old: Mapping[str, Any]) -> str | None:
    """The old status's startTime while the job was active (a suspend ends its active time)."""
    return old.get("startTime") if old.get("phase") != SUSPENDED else None


def ttl_expired(spec: Mapping[str, Any], old: Mapping[str, Any], now: str) -> bool:
    """Whether a finished job's spec.ttlSecondsAfterFinished has passed since status.completionTime (the raw spec:
    a job refused as InvalidSpec has its TTL too)."""
    ttl, done = spec.get("ttlSecondsAfterFinished"), old.get("completionTime")
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0 or not done:
        return False
    return (parse_time(now) - parse_time(done)).total_seconds() >= ttl


def trainer_status(progress: Progress, old: Mapping[str, Any], now: str) -> TrainerStatus | None:
    """status.trainerStatus from the driver's report; None before its first step (the old one is kept)."""
    if not progress.step or not progress.total_steps:
        return None
    left = max(progress.total_steps - progress.step, 0)
    seen = (old.get("trainerStatus") or {}).get("lastUpdatedTime") if old.get("step") == progress.step else None
    eta = round(left * progress.step_seconds) if progress.step_seconds is not None else None
    return TrainerStatus(progress_percentage=min(100, progress.step * 100 // progress.total_steps),
                         estimated_remaining_seconds=eta, metrics=dict(progress.metrics or {}) or None,
                         last_updated_time=seen or now)


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


def verdict(job: RLTrainingJob, roles: Mapping[str, RoleOutcome], seen: Observed) -> PhaseNote | None:
    """(phase, reason, message) when the job is over: a spent restart budget, or the driver's outcome."""
    for r, o in roles.items():
        budget = job.spec.roles.get(r).max_restarts
        if restart_budget_spent(o.status.restarts, budget):
            last = f"; last failure {o.status.last_failure}" if o.status.last_failure else ""
            message = (f"role {r} restarted {o.status.restarts} times, more than "
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
    """The message of a head failure: the Ready condition's and the Event's."""
    return (f"Ray head {'; '.join(head.failures)}: the whole Ray cluster restarts (every role's pods are "
            f"replaced; the driver resumes from its last checkpoint)")


def not_ready(roles: Mapping[str, RoleOutcome], head: HeadOutcome) -> list[str]:
    """What is not ready: the Ray head (a listed head pod, not ready) first, then "ROLE ready/desired" per role."""
    down = ["the Ray head"] if head.observed and not head.status.ready else []
    return down + [f"{r} {o.status.ready}/{o.status.desired}" for r, o in roles.items()
                   if o.status.ready < o.status.desired]


def restarting_phase(roles: Mapping[str, RoleOutcome], ready: Mapping[str, Any], head: HeadOutcome,
                     waiting: Sequence[str]) -> PhaseNote | None:
    """Restarting: the head or a role failed this pass, or did before and something is not ready again yet
    (``ready``: the previous Ready condition, empty when none)."""
    if head.failures:
        return RESTARTING, HEAD_FAILED, head_failed_message(head)
    previous = ready.get("reason")
    if previous == HEAD_FAILED and (waiting or not head.status.ready):
        return RESTARTING, HEAD_FAILED, ready["message"]  # until the new head and every role are ready
    restarting = [r for r, o in roles.items() if o.failures]
    if restarting:
        return RESTARTING, ROLE_RESTARTING, f"restarting {', '.join(restarting)}"
    if waiting and previous == ROLE_RESTARTING:
        return RESTARTING, ROLE_RESTARTING, ready["message"]  # until the restarted role is ready again
    return None


def node_wait(role: str, status: RoleStatus, bound: float) -> str:
    """A role that waits for a node, since when, and when the driver gives up (``bound`` seconds after)."""
    since = status.unschedulable_since or ""
    return (f"role {role} waits for a node: {status.unschedulable} (since {since}; the driver gives up at "
            f"{later(since, bound)}, spec.resilience.startTimeoutSeconds {bound:g}s after)")


def provisioning_phase(job: RLTrainingJob, roles: Mapping[str, RoleOutcome],
                       waiting: Sequence[str]) -> PhaseNote | None:
    """Provisioning: a role waits for a node, can't start from its image, or its pods are not all ready."""
    bound = job.spec.resilience.start_timeout_seconds
    stuck = [node_wait(r, o.status, bound) for r, o in roles.items() if o.status.unschedulable]
    if stuck:
        return PROVISIONING, UNSCHEDULABLE, "; ".join(stuck)
    images = [f"role {r}: {o.status.image_waiting}" for r, o in roles.items() if o.status.image_waiting]
    if images:
        return PROVISIONING, IMAGE_PULL_FAILED, "; ".join(images) + " (check spec.image or the operator's --image)"
    if waiting:
        return PROVISIONING, "RolesNotReady", f"waiting for pods: {', '.join(waiting)}"
    return None


def active_phase(job: RLTrainingJob, roles: Mapping[str, RoleOutcome], seen: Observed, ready: Mapping[str, Any],
                 head: HeadOutcome) -> PhaseNote:
    """(phase, Ready reason, message) of a job that runs; ``ready`` is the previous Ready condition (empty when
    none)."""
    if seen.cluster_uid is None:
        return PENDING, "WaitingForRayCluster", f"waiting for RayCluster {names.cluster(job.metadata.name)}"
    if seen.gang_wait is not None:
        return PENDING, GANG_WAITING, seen.gang_wait
    waiting = not_ready(roles, head)
    return (restarting_phase(roles, ready, head, waiting) or provisioning_phase(job, roles, waiting)
            or (RUNNING, "AllRolesReady", f"all {len(roles)} roles ready"))


def restart_action(job: RLTrainingJob, role: str) -> str:
    """What a pod failure of the role does to its pods: its standby takes over, or its gang restarts."""
    if job.spec.standby(role):
        return "its standby takes the failed pods' place, and a new standby pod is made"
    return "restarting the role's pods"


def restart_note(job: RLTrainingJob, role: str, outcome: RoleOutcome) -> str:
    """What a role's newest failure leads to: its restart (n of at most maxRestarts), or the job's end."""
    budget, restarts = job.spec.roles.get(role).max_restarts, outcome.status.restarts
    if restart_budget_spent(restarts, budget):
        return f"no restart: failure {restarts} spends spec.{job.spec.roles.path(role)}.maxRestarts ({budget})"
    host = outcome.status.colocated_with
    return f"{shared_action(host) if host else restart_action(job, role)} (restart {restarts} of at most {budget})"


def sticky(old: Mapping[str, Any], seen: Observed) -> Decision:
    """A finished job's status is final: kept as it is; its RayCluster, if still there, is torn down."""
    return Decision(dict(old), teardown=seen.cluster_uid is not None)


def outcomes(job: RLTrainingJob, old: Mapping[str, Any], seen: Observed, now: str,
             live: Sequence[str]) -> tuple[HeadOutcome, dict[str, RoleOutcome]]:
    """The head's and each enabled role's outcome; pods are counted only while the job runs on a RayCluster (not
    while Kueue holds it suspended: its pods go then, and that is no role's failure)."""
    accounting = not job.spec.suspend and seen.cluster_uid is not None and not seen.queued
    head = head_outcome(old, seen, accounting, now)
    roles = {r: role_outcome(r, job, old, seen, accounting, now, live, cluster_restart=bool(head.failures))
             for r in enabled_roles(job.spec)}
    return head, roles


def news(roles: Mapping[str, RoleOutcome], old: Mapping[str, Any], name: str) -> list[tuple[str, str]]:
    """(role, value) of each role whose RoleStatus field ``name`` is set and not what the old status said."""
    alias = RoleStatus.model_fields[name].alias
    return [(r, why) for r, o in roles.items()
            if (why := getattr(o.status, name)) and why != previous_role(old, r).get(alias)]


def failure_events(job: RLTrainingJob, old: Mapping[str, Any], head: HeadOutcome,
                   roles: Mapping[str, RoleOutcome]) -> list[Event]:
    """Warning Events of this pass's news: a head failure, each role's restart, and each role's new report of the
    driver, image problem or wait for a node."""
    events = [Event("Warning", HEAD_FAILED, head_failed_message(head))] if head.failures else []
    events += [Event("Warning", "RoleRestart", f"role {r}: {'; '.join(o.failures)}; {restart_note(job, r, o)}")
               for r, o in roles.items() if o.failures]
    return events + [Event("Warning", reason, text.format(role=r, why=why))
                     for name, reason, text in NEWS for r, why in news(roles, old, name)]


@dataclass(frozen=True)
class PhaseStep:
    """The job's phase this pass: its message, conditions and Events, and whether the job ended."""

    phase: str
    message: str
    conditions: list[dict[str, Any]]
    events: tuple[Event, ...] = ()
    ended: bool = False


def ended_step(conds: list[dict[str, Any]], ended: PhaseNote, generation: int, now: str) -> PhaseStep:
    """A job that ended: its Succeeded or Failed condition (and PlacementDegraded for that reason), Ready False,
    and an Event."""
    phase, reason, message = ended
    degraded = [(PLACEMENT_DEGRADED, True, reason, message)] if reason == PLACEMENT_DEGRADED else []
    changes = [(phase, True, reason, message), *degraded, (cond.READY, False, f"Job{phase}", message),
               (cond.PROGRESSING, False, f"Job{phase}", message)]
    event = Event("Normal" if phase == SUCCEEDED else "Warning", reason, message)
    return PhaseStep(phase, message, cond.set_conditions(conds, changes, generation, now), (event,), ended=True)


def suspended_step(conds: list[dict[str, Any]], generation: int, now: str) -> PhaseStep:
    """A suspended job: conditions Suspended True and Ready False."""
    message = "spec.suspend is true: the RayCluster and the driver are stopped"
    changes = [(cond.SUSPENDED, True, "Suspended", message), (cond.READY, False, "Suspended", message),
               (cond.ADMITTED, False, "Suspended", f"{message}; a queue (or a person) admits it by setting it false"),
               (cond.PROGRESSING, False, "Suspended", message)]
    return PhaseStep(SUSPENDED, message, cond.set_conditions(conds, changes, generation, now))


def queued_step(conds: list[dict[str, Any]], job: RLTrainingJob, old: Mapping[str, Any], generation: int,
                now: str) -> PhaseStep:
    """A job whose RayCluster Kueue holds suspended: Pending until admitted, Admitted False. After it ran, Kueue took
    it back (preempted or evicted): it resumes from its last checkpoint when readmitted."""
    queue = (job.metadata.labels or {}).get(names.QUEUE_LABEL, "")
    admitted = cond.find(conds, cond.ADMITTED) or {}
    # admitted before (whatever it did since: ran, or waited for room), or already known to be taken back
    evicted = admitted.get("status") == "True" or admitted.get("reason") == EVICTED
    if evicted:
        reason, message = EVICTED, (f"Kueue took its workload back (preempted or evicted; LocalQueue {queue}): its "
                                    f"pods are gone; it resumes from its last checkpoint when readmitted")
    else:
        reason, message = QUEUED, f"waiting for Kueue to admit its workload (LocalQueue {queue})"
    changes = [(cond.ADMITTED, False, reason, message), (cond.READY, False, reason, message),
               (cond.PROGRESSING, False, reason, message)]
    events = (Event("Warning", EVICTED, message),) if evicted and admitted.get("reason") != EVICTED else ()
    return PhaseStep(PENDING, message, cond.set_conditions(conds, changes, generation, now), events)


def active_step(conds: list[dict[str, Any]], job: RLTrainingJob, active: PhaseNote, old: Mapping[str, Any],
                seen: Observed, generation: int, now: str) -> PhaseStep:
    """A job that runs: Ready from its phase (Suspended False once resumed), an Event when it starts Running, and
    the driver's message while it runs."""
    phase, reason, message = active
    running = phase == RUNNING
    was_suspended = cond.find(conds, cond.SUSPENDED) is not None
    resumed = [(cond.SUSPENDED, False, "Resumed", "spec.suspend is false")] if was_suspended else []
    queue = (job.metadata.labels or {}).get(names.QUEUE_LABEL)
    if queue and seen.cluster_uid is None:  # its RayCluster is not made yet: Kueue has not seen it
        admitted = (cond.ADMITTED, False, QUEUED, f"waiting for Kueue to admit its workload (LocalQueue {queue})")
    elif queue:
        admitted = (cond.ADMITTED, True, "Admitted", f"Kueue admitted its workload (LocalQueue {queue})")
    else:
        admitted = (cond.ADMITTED, True, "Admitted", "spec.suspend is false: the job's RayCluster and driver are made")
    changes = [*resumed, admitted, (cond.READY, running, reason, message), (cond.PROGRESSING, True, phase, message)]
    conds = cond.set_conditions(conds, changes, generation, now)
    events = (Event("Normal", "Running", message),) if running and old.get("phase") != RUNNING else ()
    return PhaseStep(phase, seen.progress.message if running and seen.progress.message else message, conds, events)


def phase_rule(job: RLTrainingJob, generation: int, old: Mapping[str, Any], seen: Observed, now: str,
               head: HeadOutcome, roles: Mapping[str, RoleOutcome]) -> PhaseStep:
    """The job's phase: ended (its verdict, or a deadline passed), else suspended, else active."""
    conds = [dict(c) for c in old.get("conditions", [])]
    ended = verdict(job, roles, seen)
    if ended is None and job.spec.suspend:
        return suspended_step(conds, generation, now)
    if ended is None and seen.queued:
        return queued_step(conds, job, old, generation, now)
    if ended is None:
        active = active_phase(job, roles, seen, cond.find(conds, cond.READY) or {}, head)
        ended = overdue(job, active, roles, head, old, now) or past_deadline(job, old, now)
        if ended is None:
            return active_step(conds, job, active, old, seen, generation, now)
    return ended_step(conds, ended, generation, now)


def assemble_status(job: RLTrainingJob, generation: int, old: Mapping[str, Any], seen: Observed, now: str,
                    step: PhaseStep, head: HeadOutcome, roles: Mapping[str, RoleOutcome]) -> dict[str, Any]:
    """The status to write: this pass's fields over the old status's others (progress the driver reports no
    more stays); rayCluster, rayClusterUID and pendingChanges go when not written again."""
    live, progress = seen.cluster_uid is not None, seen.progress
    pending = live_pending(job, seen) if live and not job.spec.suspend else []
    new = JobStatus(
        phase=step.phase, message=step.message, conditions=step.conditions, observed_generation=generation,
        phase_since=(old.get("phaseSince") or now) if old.get("phase") == step.phase else now,
        roles={r: o.status for r, o in roles.items()}, head=head.status,
        restarts=sum(o.status.restarts for o in roles.values()) + head.status.restarts,
        pending_changes=pending or None,  # until applied: live ones by the driver, the rest by a suspend and resume
        ray_cluster=names.cluster(job.metadata.name) if live else None, ray_cluster_uid=seen.cluster_uid,
        step=progress.step, total_steps=progress.total_steps, tokens_per_sec=progress.tokens_per_sec,
        resumed_from=progress.resumed_from, steps_lost=progress.steps_lost,
        start_time=None if step.phase == SUSPENDED or seen.queued else active_since(old) or now,  # queue time: not
        completion_time=(old.get("completionTime") or now) if step.ended else None,
        trainer_status=trainer_status(progress, old, now),
    )
    return {**{k: v for k, v in old.items() if k not in REWRITTEN}, **new.to_status()}


def pods_to_delete(head: HeadOutcome, roles: Mapping[str, RoleOutcome]) -> tuple[str, ...]:
    """The pods to delete now, each once: a colocated role dooms its host's pods with the host."""
    return tuple(dict.fromkeys((*head.doomed, *(p for o in roles.values() for p in o.doomed))))


def live_groups(job: RLTrainingJob, seen: Observed, roles: Mapping[str, RoleOutcome],
                live: Sequence[str]) -> dict[str, int]:
    """Worker group replicas of the ``live``-resized roles; none without a RayCluster."""
    if seen.cluster_uid is None:
        return {}
    return {r: resize.group_pods(job, r, seen.progress, seen.applied_spec, seen.groups.get(r))
            for r in live if r in roles}


def decide(job: RLTrainingJob, generation: int, old: Mapping[str, Any], seen: Observed, now: str) -> Decision:
    """The next status of a (valid) job and what to do about it."""
    if cond.terminal(old.get("conditions", [])):
        return sticky(old, seen)
    live = resize.live_roles(job)  # once per pass: it walks the colocation sets
    head, roles = outcomes(job, old, seen, now, live)
    step = phase_rule(job, generation, old, seen, now, head, roles)
    events = (*failure_events(job, old, head, roles), *step.events)
    return Decision(assemble_status(job, generation, old, seen, now, step, head, roles), events,
                    delete_pods=() if step.ended else pods_to_delete(head, roles),
                    teardown=step.ended and seen.cluster_uid is not None,
                    groups={} if step.ended else live_groups(job, seen, roles, live),
                    leaving={r: o.leaving for r, o in roles.items() if o.leaving})


def live_pending(job: RLTrainingJob, seen: Observed) -> list[str]:
    """status.pendingChanges: fields changed since the RayCluster was built, but the live ones (`resize`),
    which are pending while the driver runs another size than the spec's (whatever the RayCluster was built with)."""
    live = resize.live_fields(job)
    waiting = {f for f in live if resize.pending(job, f.split(".")[2], seen.progress, seen.applied_spec)}
    return sorted({f for f in unapplied_changes(seen.applied_spec, job) if f not in live} | waiting)


def failed_status(old: Mapping[str, Any], generation: int, message: str, now: str,
                  changes: Sequence[cond.Change]) -> dict[str, Any]:
    """Status of a job that failed before anything was made: phase Failed, with the conditions ``changes`` set."""
    changes = [*changes, (cond.ADMITTED, False, changes[-1][2], message),
               (cond.PROGRESSING, False, "JobFailed", message)]
    conds = cond.set_conditions(old.get("conditions", []), changes, generation, now)
    return JobStatus(phase=FAILED, message=message, conditions=conds, observed_generation=generation,
                     completion_time=old.get("completionTime") or now).to_status()


def refused_status(old: Mapping[str, Any], generation: int, reason: str, message: str, now: str) -> dict[str, Any]:
    """Status of a job refused before anything was made: Failed for ``reason``, naming the fields."""
    return failed_status(old, generation, message, now, [(cond.FAILED, True, reason, message),
                                                        (cond.READY, False, reason, message)])


def invalid_spec_status(old: Mapping[str, Any], generation: int, message: str, now: str) -> dict[str, Any]:
    """Status of a job whose spec does not validate: Failed, reason InvalidSpec, naming the fields."""
    return refused_status(old, generation, "InvalidSpec", message, now)


def policy_denied_status(old: Mapping[str, Any], generation: int, message: str, now: str) -> dict[str, Any]:
    """Status of a job that breaks the operator's job policy (--job-policy): Failed, reason PolicyDenied."""
    return refused_status(old, generation, POLICY_DENIED, message, now)


def infeasible_status(old: Mapping[str, Any], generation: int, message: str, now: str) -> dict[str, Any]:
    """Status of a job whose required placement no cluster can give (nothing was created): Failed
    with reason PlacementDegraded, and the PlacementDegraded condition naming the fields."""
    return failed_status(old, generation, message, now, [(PLACEMENT_DEGRADED, True, "Infeasible", message),
                                                        (cond.FAILED, True, PLACEMENT_DEGRADED, message),
                                                        (cond.READY, False, PLACEMENT_DEGRADED, message)])


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
