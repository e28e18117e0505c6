"""Resizing a role: every built-in role grows or shrinks between two steps of a running job.

The driver learns the replicas asked for as a `ReplicasDocument` (kuberl.spec.contract), from one of
two transports: on a local run `kuberl scale JOB ROLE N` leaves a request in the job's output folder
(``<out>/scale/<role>``, the replica count as text), taken as it is read; on Kubernetes the operator
writes the spec's replicas into ``data.replicas`` of ConfigMap ``<job>-progress``, which the driver
gets between two steps (`kuberl.metrics.progress.ProgressReporter.desired_replicas`). Either way the driver
checks the resized spec against every rule of the spec model, and recreates only that role's
WorkerGroup at the new size. A frozen role (ref, reward) holds no trained state: it loads the model
path. A trainable role (actor, critic) restarts at the new world size from a checkpoint of the last
completed step, committed first (DCP checkpoints are world-size independent; its per-rank snapshots
are not, and start again); so nothing is lost. Every other role's workers (Ray actors) stay as they
are, and the data-parallel split follows the new world size. `ResizeArbiter` is the driver's arbiter: which
requests go ahead, and the one line that says why one does not.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from pathlib import Path

from kuberl import logs
from kuberl.spec import JobSpec, SpecInvalid, validate_manifest
from kuberl.spec.contract import LIVE_RESIZED, ReplicasDocument
from kuberl.spec.model import TRAINING_ROLES

log = logs.get("scale")

RESIZABLE = LIVE_RESIZED  # the built-in roles; a role of one's own (spec.roles.extra) keeps its size
REQUESTS = "scale"  # the folder `kuberl scale` leaves its requests in, named after the command


def request_dir(out: Path) -> Path:
    return out / REQUESTS


def write_request(out: Path, role: str, replicas: int) -> Path:
    """Ask the job writing to ``out`` to run ``replicas`` of ``role`` (atomic: a rename)."""
    folder = request_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{role}.tmp"
    tmp.write_text(f"{replicas}\n")
    os.replace(tmp, folder / role)
    return folder / role


def take_requests(out: Path) -> ReplicasDocument:
    """The pending local requests, removed as they are read (the newest per role wins; -1: unreadable)."""
    folder, found = request_dir(out), {}
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if path.name.startswith("."):
                continue
            text = path.read_text().strip()
            path.unlink()
            found[path.name] = int(text) if text.isdigit() else -1
    return ReplicasDocument(roles=found)


def changes(asked: ReplicasDocument, spec: JobSpec) -> dict[str, int]:
    """The roles whose asked replicas differ from what ``spec`` runs (a role the job lacks is kept, to refuse)."""
    out = {}
    for role, n in asked.roles.items():
        try:
            now = spec.roles.get(role).replicas
        except KeyError:
            now = None
        if now != n:
            out[role] = n
    return out


def request_problem(role: str, replicas: int) -> str | None:
    """Why a request cannot be applied live, before looking at the spec; None when it can."""
    if role not in RESIZABLE:
        return (f"role {role} cannot be resized live (only {', '.join(RESIZABLE)}); to change its replicas stop the "
                f"job, edit the manifest and run it again (it resumes)")
    if replicas < 1:
        return f"{role}: replicas must be a whole number >= 1 (the algorithm needs the {role})"
    return None


def shared_storage_problem(spec: JobSpec, role: str) -> str | None:
    """On Kubernetes a trainable role's new ranks (other pods) read the checkpoint its old ones wrote: that needs
    a volume every pod mounts. None when the resize can go ahead."""
    if role in TRAINING_ROLES and spec.trainer.checkpoint.volume_claim is None:
        return (f"spec.roles.{role}.replicas: resizing {role} on Kubernetes needs spec.trainer.checkpoint.volumeClaim "
                f"(its new ranks read the checkpoint its old ones write)")
    return None


def resized(spec: JobSpec, role: str, replicas: int) -> JobSpec:
    """``spec`` with ``spec.roles.<role>.replicas`` set, validated by every rule (SpecInvalid if broken)."""
    raw = spec.model_dump(by_alias=True, exclude_none=True)
    raw["roles"][role]["replicas"] = replicas
    return validate_manifest({"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "spec": raw}).spec


class ResizeArbiter:
    """Between two steps of job `name` (writing to `out`): the replicas asked for, and which go ahead. A request
    that breaks a rule is refused with one line naming it, said once while it stands."""

    def __init__(self, name: str, out: Path):
        self.name, self.out = name, out
        self.refused: dict[str, int] = {}  # role -> the replicas last refused (a standing request is said once)

    def requests(self, spec: JobSpec, source: Callable[[], ReplicasDocument | None] | None) -> dict[str, int]:
        """role -> replicas asked for that differ from what ``spec`` runs: the operator's document (``source``,
        on Kubernetes), then `kuberl scale`'s requests (taken as they are read)."""
        doc = source() if source is not None else None
        asked = dict(doc.roles) if doc is not None else {}
        asked.update(take_requests(self.out).roles)
        return changes(ReplicasDocument(roles=asked), spec)

    def approve(self, spec: JobSpec, role: str, replicas: int, running: Collection[str],
                on_kubernetes: bool) -> JobSpec | None:
        """``spec`` with ``role`` at ``replicas``, when the request breaks no rule (``running``: the job's roles;
        ``on_kubernetes``: the ranks live in other pods); else None, and the refusal is said."""
        problem = request_problem(role, replicas)
        if problem is None and role not in running:
            problem = f"role {role} does not run in this job"
        if problem is None and on_kubernetes:
            problem = shared_storage_problem(spec, role)
        new = None
        try:
            new = resized(spec, role, replicas) if problem is None else None
        except SpecInvalid as exc:
            problem = "; ".join(str(e) for e in exc.errors)
        if new is None:
            if self.refused.get(role) != replicas:
                log.info(f"scale refused: {problem}", extra={"job": self.name, "role": role})
            self.refused[role] = replicas
            return None
        self.refused.pop(role, None)
        return new


def cmd_scale(args) -> int:
    """`kuberl scale JOB ROLE N`: ask the local run of JOB to resize ROLE before its next step."""
    import sys

    out = Path(args.out or f"runs/{args.job}")
    problem = request_problem(args.role, args.replicas)
    if problem is None and not out.is_dir():
        problem = f"no run of job {args.job} in {out}: pass the run's --out folder with --out"
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    write_request(out, args.role, args.replicas)
    print(f"requested {args.role} at {args.replicas} replicas: the run in {out} applies it before its next step "
          f"(its log says 'scaled {args.role}', or why it refused)")
    return 0


def add_scale_parser(sub) -> None:
    p = sub.add_parser("scale", help="resize a role of a running local job between two steps")
    p.add_argument("job", help="the job's metadata.name (its run folder is runs/<job> unless --out)")
    p.add_argument("role", help="actor, critic, ref, reward or env (actor and critic restart from the last step)")
    p.add_argument("replicas", type=int, help="the new spec.roles.<role>.replicas")
    p.add_argument("--out", help="the run's output folder, as given to `kuberl run --out`")
    p.set_defaults(func=cmd_scale)
