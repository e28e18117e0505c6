"""`kuberl run JOB`: one machine, a local Ray (or in-process workers), the same manifest as on Kubernetes.

Everything a user can get wrong is checked before any process starts (manifest, overrides, dataset
files, reward import), and reported as one line per problem naming the field.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from .spec import JobSpec, RLTrainingJob, SpecInvalid, enabled_roles, load_manifest, validate_manifest
from .record import StepRecord
from .spec.contract import ExitCode, Reason


class UsageError(ValueError):
    """A command-line or preflight problem; printed as `error: <message>`."""


def parse_fault(text: str) -> tuple[str, int, str]:
    """'critic:3' or 'critic:3:hang' -> (role, step, mode)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[1].isdigit() or (len(parts) == 3 and parts[2] not in ("kill", "hang")):
        raise UsageError(f"--fault {text!r}: expected ROLE:STEP or ROLE:STEP:hang, e.g. critic:3")
    return parts[0], int(parts[1]), parts[2] if len(parts) == 3 else "kill"


def apply_overrides(job: RLTrainingJob, steps: Optional[int], faults: list[str],
                    metrics_port: Optional[int] = None, metrics_address: Optional[str] = None) -> RLTrainingJob:
    """Re-validate the manifest with CLI overrides, so overrides get the same field-named errors."""
    obj = job.model_dump(by_alias=True, exclude_none=True)
    if steps is not None:
        obj["spec"]["trainer"]["steps"] = steps
    if metrics_port is not None:
        obj["spec"]["trainer"]["metrics"]["prometheusPort"] = metrics_port
    if metrics_address is not None:
        obj["spec"]["trainer"]["metrics"]["prometheusAddress"] = metrics_address
    for text in faults:
        role, step, _ = parse_fault(text)
        obj["spec"]["resilience"]["faults"].append({"role": role, "step": step})
    return validate_manifest(obj)


def preflight(spec: JobSpec) -> None:
    """Fail fast, before any worker starts: data must load, and every name or import path of an
    extension point (reward function, advantage estimator, policy loss, KL estimator, an extra role's
    worker class) must resolve."""
    from .algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
    from .rewards import load_reward_fn
    from .workers import worker_class
    from .tasks import load_rows

    load_rows(spec.data)
    if spec.reward.function:
        load_reward_fn(spec.reward.function)
    ADVANTAGE_ESTIMATORS.get(spec.algorithm.estimator)
    POLICY_LOSSES.get(spec.algorithm.policy_loss)
    KL_ESTIMATORS.get(spec.algorithm.kl.estimator)
    for role in spec.roles.extra:
        worker_class(spec, role)
    check_model_source(spec.model, "spec.model")
    if spec.reward.model is not None and spec.reward.model.is_set():
        check_model_source(spec.reward.model, "spec.reward.model")


def check_model_source(src, field: str) -> None:
    """The model's tokenizer must load (a local path must exist; a hub id must resolve)."""
    from pathlib import Path

    from .models import load_tokenizer

    if src.path and not Path(src.path).is_dir():
        raise UsageError(f"{field}.path: {src.path!r} is not a directory (fix: mount the model there or use hub)")
    try:
        load_tokenizer(src)
    except (OSError, ValueError) as exc:
        where = f"{field}.hub" if src.hub else f"{field}.path"
        raise UsageError(f"{where}: cannot load the tokenizer ({str(exc).strip().splitlines()[0]}) (fix: check the id or path)") from None


def start_local_ray(spec: JobSpec) -> None:
    """A private Ray on 127.0.0.1 with each role's resource, as the operator's worker pods advertise."""
    import ray

    from .groups import world_size
    from .spec import role_resource

    roles = enabled_roles(spec)
    need_cpu = sum(spec.roles.get(r).resources.cpu_cores() * spec.roles.get(r).replicas for r in roles)
    resources = {role_resource(r): float(world_size(spec, r)) for r in roles}
    ray.init(
        _node_ip_address="127.0.0.1",
        num_cpus=max(int(need_cpu + 0.999), os.cpu_count() or 1),
        resources=resources,
        include_dashboard=False,
        log_to_driver=True,
        configure_logging=False,
    )


def build_driver(job: RLTrainingJob, out: Path, backend: str, device: str, faults: list[str], progress: bool):
    from .driver import Driver, Fault
    from .groups import LocalWorkerGroup, RayWorkerGroup

    spec = job.spec
    modes = {(r, s): m for r, s, m in map(parse_fault, faults)}
    fault_list = [Fault(f.role, f.step, modes.get((f.role, f.step), "kill")) for f in spec.resilience.faults]
    if backend == "local":
        if fault_list:
            raise UsageError("fault injection kills worker processes: it needs --backend ray")
        make = lambda role: LocalWorkerGroup(role, spec, device)  # noqa: E731
    else:
        make = lambda role: RayWorkerGroup(role, spec, device)  # noqa: E731
    return Driver(spec, job.metadata.name, out, make, fault_list, progress)


def run_job(job: RLTrainingJob, out: Path, backend: str = "ray", device: str = "auto", ray_address: Optional[str] = None,
            faults: tuple[str, ...] = (), progress: bool = True) -> list[StepRecord]:
    """Run a validated job to completion; returns this run's per-step records."""
    from .metrics import plot_reward_curve

    out.mkdir(parents=True, exist_ok=True)
    if backend == "ray":
        import ray

        if ray_address:
            ray.init(address=ray_address, configure_logging=False)
        elif not ray.is_initialized():
            start_local_ray(job.spec)
    from .driver import JobFailed
    from .groups import RoleError, WorkerFailure
    from .progress import ProgressReporter, progress_of

    driver = build_driver(job, out, backend, device, list(faults), progress)
    reporter = ProgressReporter.from_env()
    total = job.spec.trainer.steps
    last: list[StepRecord] = []
    if reporter is not None:
        def on_step(rec: StepRecord) -> None:
            last[:] = [rec]
            reporter.report(progress_of(rec, total))
        driver.on_step = on_step
    try:
        driver.start()
        records = driver.run()
    except (JobFailed, RoleError, WorkerFailure) as exc:
        if reporter is not None:
            reason = Reason.WORKER_FAILURE if isinstance(exc, WorkerFailure) else exc.reason
            reporter.report(progress_of(last[-1] if last else None, total, "Failed", str(exc), reason, driver.worst_links))
        raise
    finally:
        driver.shutdown()
    if reporter is not None:
        reporter.report(progress_of(last[-1] if last else None, total, "Succeeded", f"finished {total} steps"))
    plot_reward_curve(out / "metrics.jsonl", out / "reward_curve.png")
    return records


def run_command(args: argparse.Namespace) -> int:
    from .driver import JobFailed
    from .groups import RoleError, WorkerFailure
    from .registry import RegistryError
    from .rewards import RewardImportError
    from .tasks import DataError

    try:
        job = apply_overrides(load_manifest(args.job), args.steps, args.fault, args.metrics_port, args.metrics_address)
        preflight(job.spec)
        records = run_job(job, Path(args.out), args.backend, args.device, args.ray_address, tuple(args.fault), not args.no_progress)
    except SpecInvalid as exc:
        return exc.report()
    except (UsageError, DataError, RewardImportError, RegistryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except JobFailed as exc:
        print(f"error: job failed ({exc.reason}): {exc}", file=sys.stderr)
        return ExitCode.GAVE_UP
    except RoleError as exc:
        print(f"error: job failed: {exc}", file=sys.stderr)
        return ExitCode.GAVE_UP
    except WorkerFailure as exc:  # a role could not start (no capacity in time): worth a retry
        print(f"error: job could not start: {exc}", file=sys.stderr)
        return ExitCode.NO_CAPACITY
    if records:
        first, last = records[: min(10, len(records))], records[-min(10, len(records)):]
        mean = lambda rs: sum(r.reward_mean for r in rs) / len(rs)  # noqa: E731
        print(f"done: {len(records)} steps; reward_mean first10={mean(first):.3f} last10={mean(last):.3f}; "
              f"metrics in {args.out}/metrics.jsonl, curve in {args.out}/reward_curve.png")
    return ExitCode.OK
