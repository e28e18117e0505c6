"""`kuberl` command line: validate, run, export, crd, topology, and (with the operator extra) operator, render.

Every command returns an exit code; user errors print one line per problem on stderr and never a
traceback. Diagnostics go through `kuberl.logs`, set up from every command's --log-level and --log-format.
Heavy imports (torch, ray, kopf) happen inside the command that needs them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Callable, Sequence

from . import logs
from .spec import SpecInvalid, crd_yaml, deprecations, manifest_with, validate_manifest
from .spec.contract import ExitCode


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        manifest = manifest_with(args.job, args.set)
        job = validate_manifest(manifest)
    except SpecInvalid as exc:
        return exc.report()
    checked = "manifest"
    if not args.spec_only:
        from pathlib import Path

        from .preflight import PreflightFailed, check_job

        try:
            check_job(job.spec, Path(args.job).parent)
        except PreflightFailed as exc:
            return exc.report()
        checked = "manifest, data, reward and model"
    for note in deprecations(manifest):  # after the checks: a refused job gets its one error line alone
        print(f"{args.job}: note: {note}", file=sys.stderr)
    print(f"{args.job}: valid {job.kind} {job.metadata.name!r} ({job.spec.algorithm.name}, "
          f"{job.spec.trainer.steps} steps; checked {checked})")
    if args.cluster:
        try:
            from kuberl_operator.cluster_check import check
        except ModuleNotFoundError:
            print("error: --cluster needs the operator extra (pip install 'kuberl[operator]')", file=sys.stderr)
            return 1
        return check(job, manifest, args.namespace or job.metadata.namespace or "default", args.kubeconfig)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from kuberl.training.export import cmd_export as run_export

    return run_export(args)


def cmd_crd(args: argparse.Namespace) -> int:
    text = crd_yaml()
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .run import run_command

    return run_command(args)


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a job on this machine (local Ray or in-process)")
    p.add_argument("job", help="RLTrainingJob manifest (YAML)")
    p.add_argument("--out", help="output folder: metrics.jsonl, reward curve, TensorBoard, checkpoints, model "
                                 "(default runs/<metadata.name>)")
    p.add_argument("--steps", type=int, help="override spec.trainer.steps (same as --set trainer.steps=N)")
    add_set_argument(p)
    p.add_argument("--no-export", action="store_true",
                   help="do not export the last step's policy to <out>/model (kuberl export does it later)")
    p.add_argument("--restart", action="store_true",
                   help="delete this output folder's checkpoints and outputs and start over (instead of resuming)")
    p.add_argument("--backend", choices=["ray", "local"], default="ray",
                   help="ray: one Ray actor group per role; local: in-process, no Ray")
    p.add_argument("--ray-address", help="connect to an existing Ray cluster instead of starting one")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--fault", action="append", default=[], metavar="ROLE:STEP[:MODE]",
                   help="hit ROLE's worker process at STEP (repeatable); MODE kill (default: SIGKILL), hang (a call "
                        "that never returns) or stop (SIGSTOP)")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    p.add_argument("--metrics-port", type=int,
                   help="serve Prometheus /metrics on this port (overrides spec.trainer.metrics.prometheusPort)")
    p.add_argument("--metrics-address",
                   help="bind address for /metrics (default 127.0.0.1; the operator passes 0.0.0.0 in the driver pod)")
    p.set_defaults(func=cmd_run)


def add_set_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="override a spec field, e.g. --set trainer.steps=10 --set algorithm.kl.coef=0.02 (repeatable)")


def _plugins() -> list[Callable[[argparse._SubParsersAction], None]]:
    """`register(subparsers)` of each optional command package that is installed."""
    regs = []
    for module in ("kuberl.topology.cli", "kuberl_operator.cli"):
        try:
            regs.append(importlib.import_module(module).register)
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith(module.split(".")[0]) and exc.name not in ("kopf",):
                raise
    return regs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kuberl",
                                     description="RL post-training of language models, on Kubernetes or one machine.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check an RLTrainingJob manifest and what a run of it needs")
    p.add_argument("job")
    add_set_argument(p)
    p.add_argument("--spec-only", action="store_true",
                   help="check the manifest only, not its data files, reward import or model (they live in the image)")
    p.add_argument("--cluster", action="store_true",
                   help="also ask the cluster whether it can run the job, creating nothing: CRD, operator, KubeRay, "
                        "your right to create it, a node for every pod, the Kueue queue, DRA device class, PVC")
    p.add_argument("--kubeconfig", help="with --cluster: this kubeconfig (default $KUBECONFIG, ~/.kube/config, or "
                                        "the pod's ServiceAccount)")
    p.add_argument("-n", "--namespace", help="with --cluster: the job's namespace (default metadata.namespace, "
                                             "else default)")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("export", help="write a run's trained policy as a Hugging Face model folder")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a `kuberl run` output folder (or its checkpoint folder)")
    p.add_argument("--step", type=int, help="the checkpoint step (default: the newest complete one)")
    p.add_argument("--out", required=True, help="the model folder to write")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="weights' dtype (default: spec.model.dtype)")
    p.add_argument("--adapter", choices=["merge", "separate"], default="merge",
                   help="a LoRA actor: fold the adapter into the weights, or write the base model and OUT/adapter")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("crd", help="print the RLTrainingJob CRD generated from the spec model")
    p.add_argument("-o", "--output")
    p.set_defaults(func=cmd_crd)
    add_run_parser(sub)
    from kuberl.resilience.resize import add_scale_parser

    add_scale_parser(sub)
    from kuberl.metrics.reporter import add_report_parser

    add_report_parser(sub)
    for register in _plugins():
        register(sub)
    for command in sub.choices.values():
        logs.add_arguments(command)
    return parser


JSON_LINES = ("run",)  # commands that print only JSON lines with --log-format json (a driver pod's `kuberl run`)


def main(argv: Sequence[str] | None = None) -> int:
    """Bad input is one line and exit 1 (the commands catch it); an error nothing expected is a crash: its traceback
    and exit 5 (`ExitCode.CRASHED`), which the driver Job retries (Python's own exit 1 would read as bad input)."""
    args = build_parser().parse_args(argv)
    logs.setup(args.log_level, args.log_format)
    with logs.printed_as_json(args.log_format == "json" and args.command in JSON_LINES):
        try:
            return int(args.func(args) or 0)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return ExitCode.INTERRUPTED
        except Exception:  # a crash: reported whole
            traceback.print_exc()
            print(f"kuberl {args.command}: crashed (exit {ExitCode.CRASHED.value})", file=sys.stderr, flush=True)
            return ExitCode.CRASHED


if __name__ == "__main__":
    sys.exit(main())
