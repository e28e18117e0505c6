"""`kuberl run JOB`: one machine, a local Ray (or in-process workers), the same manifest as on Kubernetes.

Everything a user can get wrong is checked before any process starts (manifest, overrides, dataset
files, reward import: kuberl.preflight), and reported as one line per problem naming the field. The
output folder (default `runs/<metadata.name>`) and the checkpoints must belong to this job
(kuberl.resilience.identity) before anything is written. After the last step the policy is exported to
`<out>/model` (kuberl.training.export).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from kuberl.metrics.record import StepRecord

from . import logs
from .spec import JobSpec, RLTrainingJob, SpecInvalid, enabled_roles, load_manifest, validate_manifest
from .spec.contract import ExitCode, Reason

if TYPE_CHECKING:
    from kuberl.controller.driver import Driver
    from kuberl.metrics.progress import ProgressFiles

log = logs.get("run")


class UsageError(ValueError):
    """A command-line or preflight problem; printed as `error: <message>`."""


class LocalRayFailed(RuntimeError):
    """`kuberl run`'s own Ray did not start (not the job's fault: worth a retry)."""


FAULT_MODES = ("kill", "hang", "stop")  # SIGKILL, a call that never returns, SIGSTOP


class FaultFlag(NamedTuple):
    """One `--fault ROLE:STEP[:MODE]`: hit `role`'s worker process at `step` (1-based) with `mode`."""

    role: str
    step: int
    mode: str = "kill"


def parse_fault(text: str) -> FaultFlag:
    """'critic:3', 'critic:3:hang' or 'critic:3:stop' -> FaultFlag(role, step, mode); the one parser of --fault."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[1].isdigit() or (len(parts) == 3 and parts[2] not in FAULT_MODES):
        raise UsageError(f"--fault {text!r}: expected ROLE:STEP or ROLE:STEP:MODE with MODE one of "
                         f"{', '.join(FAULT_MODES)}, e.g. critic:3")
    return FaultFlag(parts[0], int(parts[1]), parts[2] if len(parts) == 3 else "kill")


def require_ray_backend(backend: str, spec: JobSpec) -> None:
    """Faults (spec.resilience.faults, --fault) kill worker processes, which the local backend runs none of."""
    if backend == "local" and spec.resilience.faults:
        raise UsageError("fault injection kills worker processes: it needs --backend ray")


def apply_overrides(job: RLTrainingJob, steps: int | None, faults: Sequence[FaultFlag | str],
                    metrics_port: int | None = None, metrics_address: str | None = None) -> RLTrainingJob:
    """The single-field flags (--steps, --fault, --metrics-*) on a loaded job, re-validated, so they get the
    same field-named errors as the file (`--set` overrides are applied while loading it). `faults`: parsed
    flags, or their text."""
    obj = job.model_dump(by_alias=True, exclude_none=True)
    if steps is not None:
        obj["spec"]["trainer"]["steps"] = steps
    if metrics_port is not None:
        obj["spec"]["trainer"]["metrics"]["prometheusPort"] = metrics_port
    if metrics_address is not None:
        obj["spec"]["trainer"]["metrics"]["prometheusAddress"] = metrics_address
    for fault in faults:
        flag = parse_fault(fault) if isinstance(fault, str) else fault
        obj["spec"]["resilience"]["faults"].append({"role": flag.role, "step": flag.step})
    return validate_manifest(obj)


def quiet_local_ray() -> None:
    """Settings for a private local Ray, read when ray is imported (so: before it is).

    RAY_AUTH_MODE=token asks for the token authentication that a new local Ray turns on by default
    anyway; said explicitly, Ray prints no notice about it. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 tells
    Ray this is a one-machine cluster, so it resolves 127.0.0.1 to loopback instead of probing an
    outside address for the machine's IP (which warns when there is no route to one, and otherwise
    binds Ray to the machine's public address).
    """
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def start_local_ray(spec: JobSpec) -> None:
    """A private Ray on 127.0.0.1 with each role's resource, as the operator's worker pods advertise."""
    import ray

    from kuberl.workers.groups import world_size

    from .spec import role_resource

    roles = enabled_roles(spec)
    sets = {r: 2 if spec.standby(r) else 1 for r in roles}  # a warm standby holds a second set of the role's ranks
    need_cpu = sum(sets[r] * spec.roles.get(r).resources.cpu_cores() * spec.roles.get(r).replicas for r in roles)
    resources = {role_resource(r): float(sets[r] * world_size(spec, r)) for r in roles}
    try:
        ray.init(
            address="local",  # a Ray of its own, even where `ray start` left another cluster's address file
            _node_ip_address="127.0.0.1",
            num_cpus=max(int(need_cpu + 0.999), os.cpu_count() or 1),
            resources=resources,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
        )
    except Exception as exc:  # e.g. "The current node timed out during startup" on an overloaded host
        ray.shutdown()  # what did start goes with it
        raise LocalRayFailed(f"a local Ray could not start: {str(exc).strip().splitlines()[0]} (fix: retry when the "
                             f"machine is less busy, or pass --backend local)") from None


def build_driver(job: RLTrainingJob, out: Path, backend: str, device: str, faults: Sequence[FaultFlag],
                 progress: bool):
    """`faults`: the --fault flags, which give the modes of spec.resilience.faults (default kill)."""
    from kuberl.controller.driver import Driver, Fault
    from kuberl.workers.groups import LocalWorkerGroup, RayWorkerGroup

    spec = job.spec
    require_ray_backend(backend, spec)
    modes = {(f.role, f.step): f.mode for f in faults}
    fault_list = [Fault(f.role, f.step, modes.get((f.role, f.step), "kill")) for f in spec.resilience.faults]
    if backend == "local":
        make = lambda role: LocalWorkerGroup(role, spec, device)  # noqa: E731
    else:
        from kuberl.spec.colocation import SharedPlacement

        shared = SharedPlacement(spec)  # the placement groups of roles that share GPUs
        make = lambda role: RayWorkerGroup(role, spec, device, shared=shared)  # noqa: E731
    return Driver(spec, job.metadata.name, out, make, fault_list, progress)


FORWARDED = "ray_print_logs"  # the name of Ray's handler of the worker lines forwarded to the driver


def forward_worker_lines_as_json() -> None:
    """With JSON logs, each line a Ray worker process prints reaches this driver's stdout or stderr as one
    JSON object (`print_worker_lines`) instead of Ray's ``(ActorWorker pid=N) line``, and none is deduplicated.
    Ray offers no public hook for this: it replaces Ray's own handler (worker.py's print_to_stdstream) in the
    dispatcher of forwarded lines, under the same name, which `ray.shutdown` removes. Call after `ray.init`."""
    if logs.from_env()[1] != "json":
        return
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    dispatcher.remove_handler(FORWARDED)
    dispatcher.add_handler(FORWARDED, print_worker_lines)


def print_worker_lines(batch: dict) -> None:
    """One batch of forwarded lines (Ray's: pid, ip, is_err, lines, actor_name or task_name), each line as a JSON
    object with the worker's `actor`, `pid` (a number where Ray's is one) and `ip` (`logs.line_record`), on the
    stream the worker used; of the autoscaler's lines only its events, as Ray prints them."""
    from ray._private.worker import filter_autoscaler_events

    stream = "stderr" if batch.get("is_err") else "stdout"
    lines = batch.get("lines", [])
    if batch.get("pid") == "autoscaler":
        lines = filter_autoscaler_events(lines)
    pid = str(batch.get("pid", ""))
    fields = {"actor": batch.get("actor_name") or batch.get("task_name"), "pid": int(pid) if pid.isdigit() else pid,
              "ip": batch.get("ip")}
    fields = {key: value for key, value in fields.items() if value}
    sink = sys.stderr if stream == "stderr" else sys.stdout
    sink.write("".join(logs.line_record(line, stream, **fields) + "\n" for line in lines if line.strip()))
    sink.flush()


def connect_ray(job: RLTrainingJob, ray_address: str | None) -> None:
    """Join the Ray cluster at `ray_address`, or start a local one for the job (unless this process has one),
    with the reaper that leaves no Ray process behind a SIGKILLed driver; with JSON logs, the workers' lines
    come through as JSON objects (`forward_worker_lines_as_json`)."""
    if not ray_address:
        quiet_local_ray()
    import ray

    if ray_address:
        ray.init(address=ray_address, configure_logging=False)
    elif not ray.is_initialized():
        from kuberl.resilience import reaper

        reaper.start()  # a SIGKILLed driver leaves no Ray process behind
        start_local_ray(job.spec)
    forward_worker_lines_as_json()


def run_job(job: RLTrainingJob, out: Path, backend: str = "ray", device: str = "auto", ray_address: str | None = None,
            faults: Sequence[FaultFlag] = (), progress: bool = True, export: bool = True) -> list[StepRecord]:
    """Run a validated job to completion; returns this run's per-step records. `faults`: the parsed --fault
    flags (`parse_fault`), already in the job's spec.resilience.faults (`apply_overrides`)."""
    out.mkdir(parents=True, exist_ok=True)
    if backend == "ray":
        connect_ray(job, ray_address)
    from kuberl.controller.driver import JobFailed
    from kuberl.metrics.progress import ProgressFiles, progress_of
    from kuberl.workers.groups import RoleError, WorkerFailure

    driver = build_driver(job, out, backend, device, faults, progress)
    reporter = ProgressFiles.from_env()
    total = job.spec.trainer.steps
    last: list[StepRecord] = []
    if reporter is not None:
        def on_step(rec: StepRecord) -> None:
            last[:] = [rec]
            reporter.report(progress_of(rec, total, resumed=driver.resumed))
        driver.on_step = on_step
        driver.replicas_source = reporter.desired_replicas  # the operator's data.replicas, read between steps
    from kuberl.resilience import ownlink

    try:
        if backend == "ray":
            ownlink.start()  # a driver whose own Ray node is gone exits rather than wait forever
        driver.start()
        records = driver.run()
    except (JobFailed, RoleError, WorkerFailure) as exc:
        if reporter is not None:
            report_failed(reporter, exc, last[-1] if last else None, total, driver)
        raise
    except Exception as exc:  # an error nothing expected: the cluster's loss when this driver's raylet goes with it
        if ownlink.lost():
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ownlink.RayLost(f"this driver's Ray node is gone with its cluster ({type(exc).__name__}: "
                                  f"{first})") from exc
        raise
    finally:
        ownlink.stop()
        driver.shutdown()
    finish(job, out, reporter, last[-1] if last else None, driver, export)
    return records


def finish(job: RLTrainingJob, out: Path, reporter: ProgressFiles | None, last: StepRecord | None, driver: Driver,
           export: bool) -> None:
    """After the last step: the Succeeded report, the reward curve and timeline plots, the policy's export."""
    from kuberl.metrics.progress import progress_of

    from .metrics import plot_reward_curve, plot_timeline

    total = job.spec.trainer.steps
    if reporter is not None:
        reporter.report(progress_of(last, total, "Succeeded", f"finished {total} steps", resumed=driver.resumed))
    plot_reward_curve(out / "metrics.jsonl", out / "reward_curve.png")
    plot_timeline(out / "metrics.jsonl", out / "timeline.png")
    if export:
        export_last(job, out)


def report_failed(reporter: ProgressFiles, exc: Exception, last: StepRecord | None, total: int,
                  driver: Driver) -> None:
    """The driver's last progress report: Failed, with the reason and the failure's public text (no prompt or
    response text goes into the status)."""
    from kuberl.metrics.progress import progress_of
    from kuberl.workers.groups import WorkerFailure

    reason = Reason.WORKER_FAILURE if isinstance(exc, WorkerFailure) else exc.reason
    reporter.report(progress_of(last, total, "Failed", getattr(exc, "public", str(exc)), reason, driver.worst_links,
                                driver.resumed))


def export_last(job: RLTrainingJob, out: Path) -> Path | None:
    """Export the newest checkpoint's policy to <out>/model; a problem is a warning, the run stands."""
    from kuberl.resilience import checkpoint
    from kuberl.training.export import ExportError, export_policy

    try:
        export_policy(checkpoint.root_for(job.spec, out), job.metadata.name, job.spec, out / "model")
    except ExportError as exc:
        log.warning(f"the trained model was not exported: {exc}", extra={"job": job.metadata.name})
        return None
    return out / "model"


def run_command(args: argparse.Namespace) -> int:
    """Check everything (cheap imports only, about a second), then import torch and Ray and train."""
    from .preflight import PreflightFailed

    try:
        job, out, faults = prepare(args)
    except (SpecInvalid, PreflightFailed) as exc:
        return exc.report()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if job is None:
        return ExitCode.OK
    from kuberl.controller.driver import JobFailed
    from kuberl.resilience import ownlink
    from kuberl.workers.groups import RoleError, WorkerFailure

    from .rewards import RewardFunctionError

    try:
        records = run_job(job, out, args.backend, args.device, args.ray_address, faults,
                          not args.no_progress, not args.no_export)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except JobFailed as exc:
        print(f"error: job failed ({exc.reason}): {exc}", file=sys.stderr)
        return ExitCode.GAVE_UP
    except (RoleError, RewardFunctionError) as exc:
        print(f"error: job failed: {exc}", file=sys.stderr)
        return ExitCode.GAVE_UP
    except (WorkerFailure, LocalRayFailed) as exc:  # a role or Ray could not start (no capacity in time): retry
        print(f"error: job could not start: {exc}", file=sys.stderr)
        return ExitCode.NO_CAPACITY
    except ownlink.RayLost as exc:  # not the driver's failure: its Job retries it without counting
        print(f"error: {exc}; exit {ExitCode.RAY_LOST.value}, retried", file=sys.stderr)
        return ExitCode.RAY_LOST
    this_run = f"steps {records[0].step}-{records[-1].step} in this run" if records else "no steps in this run"
    print(f"done: job {job.metadata.name!r}, {job.spec.trainer.steps} steps ({this_run}); {summary(out)}")
    return ExitCode.OK


def prepare(args: argparse.Namespace) -> tuple[RLTrainingJob | None, Path, list[FaultFlag]]:
    """Validate the job, its data, reward and model, and its output folder; write the job record.
    Returns the job (None when it is already finished, said so on stdout), its output folder and the
    parsed --fault flags."""
    from kuberl.resilience import checkpoint, identity

    from .preflight import (
        PreflightFailed,
        check_job,
        gpu_problems,
        ignored_credentials,
        ignored_placement,
        local_gpu_count,
        output_problems,
        warn_unknown_characters,
    )

    job = load_manifest(args.job, args.set)
    faults = [parse_fault(text) for text in args.fault]
    job = apply_overrides(job, args.steps, faults, args.metrics_port, args.metrics_address)
    require_ray_backend(args.backend, job.spec)
    rows = check_job(job.spec, Path(args.job).parent)
    name, out = job.metadata.name, Path(args.out or f"runs/{job.metadata.name}")
    problems = output_problems(job.spec, out)
    if not args.ray_address:  # a local run: this host's GPUs are all there will be
        problems += gpu_problems(job.spec, local_gpu_count())
    if problems:
        raise PreflightFailed(problems)
    root, mine = checkpoint.root_for(job.spec, out), identity.Identity.of(name, job.spec)
    if args.restart:
        gone = identity.clear(root, out)
        if gone:
            log.info(f"--restart: removed {len(gone)} earlier checkpoints and outputs of {out}", extra={"job": name})
    elif problem := identity.resume_problem(root, out, mine):
        raise UsageError(problem)
    done, total = checkpoint.latest(root) or 0, job.spec.trainer.steps
    if done >= total:
        print(f"job {name!r} is already finished: {done}/{total} steps in {out}; {summary(out)} "
              f"(to train further raise trainer.steps, e.g. --steps {done + total}; to start over pass --restart)")
        return None, out, faults
    warn_unknown_characters(job.spec, rows)
    if not args.ray_address:  # on Kubernetes (the driver joins the job's RayCluster) they apply
        for ignored in filter(None, (ignored_placement(job.spec), ignored_credentials(job.spec))):
            print(ignored, file=sys.stderr)
    if done:
        log.info(f"resuming from step {done} ({checkpoint.step_dir(root, done)})", extra={"job": name, "step": done})
    mine.write(root)
    return job, out, faults


def summary(out: Path) -> str:
    """The whole run's result, read back from metrics.jsonl (all runs of this job, resumes included)."""
    from .metrics import read_jsonl

    rows = read_jsonl(out / "metrics.jsonl")
    parts = []
    if rows:
        mean = lambda rs: sum(r["reward_mean"] for r in rs) / len(rs)  # noqa: E731
        k = min(10, len(rows))
        parts.append(f"reward_mean first{k}={mean(rows[:k]):.3f} last{k}={mean(rows[-k:]):.3f}")
    evals = [r for r in rows if "eval_reward_mean" in r]
    if evals:
        parts.append(f"eval_reward_mean={evals[-1]['eval_reward_mean']:.3f} at step {evals[-1]['step']}")
    if (out / "model" / "config.json").is_file():
        parts.append(f"model in {out / 'model'}")
    parts.append(f"metrics in {out / 'metrics.jsonl'}, curve in {out / 'reward_curve.png'}, "
                 f"phases in {out / 'timeline.png'}")
    if (out / "tensorboard").is_dir():
        parts.append(f"TensorBoard in {out / 'tensorboard'}")
    return "; ".join(parts)
