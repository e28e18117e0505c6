"""`kuberl operator` (run the operator in this process) and `kuberl render JOB.yaml` (no cluster).

``register(subparsers)`` adds both to the `kuberl` command; every command returns an exit code.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
from pathlib import Path

import yaml

from kuberl import logs
from kuberl.spec import SpecInvalid, load_manifest, parse_yaml
from kuberl.spec.quantity import parse_quantity

from . import builders, job_policy, names, placement
from .config import (
    CONCURRENT_PASSES,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_GPUS_PER_NODE,
    LEASE_NAME,
    MIN_LEASE_SECONDS,
    OperatorConfig,
)
from .network import Scrapers

EPHEMERAL_CHECKPOINTS = ("note: spec.trainer.checkpoint.volumeClaim is not set: checkpoints are written inside the "
                         "pods and do not survive a pod restart, so a restarted role or driver cannot restore from "
                         "them; name a ReadWriteMany PersistentVolumeClaim there to keep them")
EPHEMERAL_ARTEFACTS = ("note: metrics.jsonl and reward_curve.png go to {out} in the driver pod, an emptyDir that "
                       "vanishes with the pod: copy them while it runs (kubectl cp <driver pod>:{out} .), or read the "
                       "metrics from the driver's log or Prometheus; with a volumeClaim they go to "
                       "<checkpoint path>/runs/<job> on it")


def cmd_render(args: argparse.Namespace) -> int:
    """Print every object the operator would create for a job, as one YAML stream (notes on stderr)."""
    try:
        job = load_manifest(args.job)
    except SpecInvalid as exc:
        return exc.report()
    problems = job_policy.violations(job, args.job_policy) or placement.static_problems(job, args.max_gpus_per_node)
    if problems:  # the operator would fail the job (PolicyDenied or PlacementDegraded) and create nothing
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1
    namespace = args.namespace or job.metadata.namespace or "default"
    opts = builders.BuildOptions(namespace=namespace, image=args.image, head=args.head_resources,
                                 driver=args.driver_resources, cpu_limits=args.cpu_limits, scratch=args.scratch,
                                 network_policy=args.network_policy, scrapers=scrapers(args),
                                 gang_scheduling=args.gang_scheduling)
    raw_spec = parse_yaml(Path(args.job).read_text())["spec"]
    objects = builders.all_objects(job, raw_spec, None, opts)  # the operator makes the Ray token; render shows none
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    if not job.spec.trainer.checkpoint.volume_claim:
        print(EPHEMERAL_CHECKPOINTS, file=sys.stderr)
        print(EPHEMERAL_ARTEFACTS.format(out=builders.driver_out(job)), file=sys.stderr)
    else:
        print(f"note: metrics.jsonl and reward_curve.png go to {builders.driver_out(job)}, in folder "
              f"{names.claim_folder(job.metadata.name)} of the checkpoint volume "
              f"({job.spec.trainer.checkpoint.volume_claim})", file=sys.stderr)
    return 0


def scrapers(args: argparse.Namespace) -> Scrapers:
    return Scrapers(tuple(args.metrics_from), tuple(args.metrics_from_cidr))


def cidr(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text, strict=True))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}: give an address block such as 10.0.0.0/24") from None


def lease_seconds(text: str) -> int:
    """--lease-seconds: MIN_LEASE_SECONDS to 300."""
    value = int(text)
    if not MIN_LEASE_SECONDS <= value <= 300:
        raise argparse.ArgumentTypeError(f"must be {MIN_LEASE_SECONDS} to 300 seconds, got {value}")
    return value


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def cmd_operator(args: argparse.Namespace) -> int:
    """Run the operator (kopf) until interrupted."""
    if args.namespace and args.all_namespaces:
        print("error: give --namespace or --all-namespaces, not both", file=sys.stderr)
        return 2
    import kopf

    from . import (
        handlers,  # noqa: F401  (registers the handlers)
        leader,
    )
    from .metrics import Metrics

    kopf_logging("debug" if args.verbose else args.log_level, args.log_format)
    config = OperatorConfig(image=args.image, metrics_port=args.metrics_port, metrics_address=args.metrics_address,
                            max_gpus_per_node=args.max_gpus_per_node, head=args.head_resources,
                            driver=args.driver_resources, cpu_limits=args.cpu_limits, scratch=args.scratch,
                            job_policy=args.job_policy, concurrent_passes=args.concurrent_passes,
                            network_policy=args.network_policy, scrapers=scrapers(args),
                            gang_scheduling=args.gang_scheduling)
    metrics = Metrics()
    server = metrics.serve(config.metrics_port, config.metrics_address) if config.metrics_port is not None else None
    elector = standby = None
    # Until kopf's own handlers take over, SIGTERM unwinds through `finally`: a Lease just taken is released.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        if args.leader_elect:
            metrics.leading = False
            elector = leader.Elector(leader.Terms(args.leader_elect_namespace, args.lease_name, leader.identity(),
                                                  args.lease_seconds))
            standby = elector.acquire(args.liveness)  # serves liveness until kopf's startup handler closes it
            metrics.leading = True
        kopf.run(
            standalone=True,  # one replica acts: the Lease (--leader-elect), or the only one
            namespaces=args.namespace,
            clusterwide=args.all_namespaces or not args.namespace,
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(config=config, metrics=metrics, standby=standby),
        )
    finally:
        metrics.leading = False
        if standby is not None:
            standby.close()
        if elector is not None:
            elector.release()
        if server is not None:
            server.shutdown()
            server.server_close()
    return 0


def kopf_logging(level: str, fmt: str) -> None:
    """kopf's own logging, on the root logger (kopf's records and the operator's, `kuberl_operator.*`), at `level`
    and in kopf's JSON or its usual text format as --log-format says. kopf's JSON lines carry the object a
    record is about (namespace, name), never a Secret's data."""
    import kopf

    kopf.configure(verbose=level == "debug", log_format=kopf.LogFormat.JSON if fmt == "json" else kopf.LogFormat.FULL)
    logging.getLogger().setLevel(level.upper())


def liveness_url(text: str) -> str:
    """`http://HOST:PORT/PATH`, with a bare IPv6 HOST (the pod's IP as the downward API gives it) bracketed."""
    scheme, sep, rest = text.partition("://")
    netloc, slash, path = rest.partition("/")
    host, colon, port = netloc.rpartition(":")
    if not (sep and colon and port.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: give http://HOST:PORT/PATH, e.g. http://127.0.0.1:8081/healthz")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}{slash}{path}"


def cpu_memory(text: str) -> dict[str, str]:
    """`cpu=200m,memory=2Gi` -> {"cpu": "200m", "memory": "2Gi"} (both keys, valid quantities)."""
    pairs = key_values(text)
    if set(pairs) != {"cpu", "memory"}:
        raise argparse.ArgumentTypeError(f"{text!r}: give cpu=<quantity>,memory=<quantity>, e.g. cpu=1,memory=4Gi")
    return quantities(pairs)


def scratch_sizes(text: str) -> dict[str, str]:
    """`tmp=8Gi,cache=100Gi` -> the emptyDir sizeLimits (builders.SCRATCH), the keys not given at their default."""
    pairs = key_values(text)
    if not pairs or set(pairs) - set(builders.SCRATCH):
        keys = ",".join(f"{k}=<quantity>" for k in builders.SCRATCH)
        raise argparse.ArgumentTypeError(f"{text!r}: give some of {keys}, e.g. cache=100Gi")
    return {**builders.SCRATCH, **quantities(pairs)}


def key_values(text: str) -> dict[str, str]:
    """`a=1,b=2` -> {"a": "1", "b": "2"}."""
    return dict(item.partition("=")[::2] for item in text.split(",") if item)


def quantities(pairs: dict[str, str]) -> dict[str, str]:
    """``pairs`` if every value is a Kubernetes quantity."""
    for key, value in pairs.items():
        try:
            parse_quantity(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key}={value!r} is not a Kubernetes quantity (e.g. 500m, 2Gi)") from None
    return pairs


def policy(text: str) -> job_policy.JobPolicy:
    try:
        return job_policy.parse(text)
    except job_policy.PolicyInvalid as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def job_options(p: argparse.ArgumentParser) -> None:
    """What `operator` and `render` both take: the head and driver pods' sizes, scratch, CPU limits, the job policy."""
    for flag, default, what in (("--head-resources", builders.HEAD_RESOURCES, "each job's Ray head pod (GCS only)"),
                                ("--driver-resources", builders.DRIVER_RESOURCES, "each job's driver pod")):
        text = ",".join(f"{k}={v}" for k, v in default.items())
        p.add_argument(flag, type=cpu_memory, default=dict(default), metavar="cpu=Q,memory=Q",
                       help=f"requests and limits of {what} (default {text})")
    text = ",".join(f"{k}={v}" for k, v in builders.SCRATCH.items())
    p.add_argument("--scratch", type=scratch_sizes, default=dict(builders.SCRATCH), metavar="KEY=Q,...",
                   help=f"sizeLimit of each job pod's emptyDirs (default {text}); a container's ephemeral-storage "
                        "limit is their sum and 1Gi for its logs")
    p.add_argument("--no-cpu-limits", dest="cpu_limits", action="store_false",
                   help="give every pod CPU requests but no CPU limit (Burstable: pods may use a node's idle "
                        "cores; a small or shared CPU node). Default: limits equal requests (Guaranteed)")
    p.add_argument("--no-network-policy", dest="network_policy", action="store_false",
                   help="make no NetworkPolicy for a job. Default: each job's pods admit connections from its own "
                        "pods only, and on their `metrics` ports from the --metrics-from namespaces and address "
                        "blocks")
    p.add_argument("--no-gang-scheduling", dest="gang_scheduling", action="store_false",
                   help="let each pod of a job through to the scheduler on its own. Default: a job's pods are made "
                        "with a scheduling gate that the operator lifts from all of them at once, when the whole set "
                        "fits the nodes' free capacity (no job holds part of its pods while it waits)")
    p.add_argument("--metrics-from", action="append", default=[], metavar="NAMESPACE",
                   help="a namespace where Prometheus runs: its pods may reach the job pods' metrics ports "
                        "(repeatable; the chart's networkPolicy.metricsNamespaces)")
    p.add_argument("--metrics-from-cidr", action="append", type=cidr, default=[], metavar="CIDR",
                   help="an address block that may reach the job pods' metrics ports: a Prometheus outside the "
                        "cluster or on a node's host network (repeatable; the chart's networkPolicy.metricsCIDRs)")
    p.add_argument("--job-policy", type=policy, default=job_policy.JobPolicy(), metavar="JSON",
                   help="what a job's author may choose, as the chart's jobPolicy in JSON (allowedImages, "
                        "allowedVolumeClaims, forbiddenMountPaths, allowed*Classes, allowWildcardTolerations); a job "
                        "that breaks it fails with reason PolicyDenied. Default: system mount paths forbidden, no "
                        "wildcard tolerations, anything else allowed")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `operator` and `render` to a `kuberl` argument parser."""
    env = OperatorConfig.from_env()
    p = subparsers.add_parser("operator", help="run the RLTrainingJob operator (kopf) in this process")
    p.add_argument("-n", "--namespace", action="append", default=[],
                   help="watch this namespace (repeatable; glob patterns allowed); default: all")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--metrics-port", type=int, default=env.metrics_port,
                   help="serve Prometheus /metrics on this port (default: off, or $KUBERL_METRICS_PORT)")
    p.add_argument("--metrics-address", default=env.metrics_address,
                   help="bind address for /metrics (default 127.0.0.1; the Helm chart sets the pod's IP)")
    p.add_argument("--liveness", metavar="URL", type=liveness_url,
                   help="health endpoint for liveness/readiness probes, e.g. http://127.0.0.1:8081/healthz "
                        "(an IPv6 host may be written bare, as the pod's IP comes: http://fd00::5:8081/healthz)")
    p.add_argument("--image", default=env.image,
                   help="runtime image for Ray pods and the driver, unless a job sets spec.image "
                        f"(default {env.image})")
    p.add_argument("--max-gpus-per-node", type=positive, default=env.max_gpus_per_node,
                   help="the most GPUs any node has: under placement policy required, a role needing more per "
                        f"replica fails at once (default {DEFAULT_MAX_GPUS_PER_NODE}, or $KUBERL_MAX_GPUS_PER_NODE)")
    p.add_argument("--concurrent-passes", type=positive, default=env.concurrent_passes,
                   help="passes over jobs that run at once, each one job's requests in a row (default "
                        f"{CONCURRENT_PASSES}, or $KUBERL_CONCURRENT_PASSES): more only lengthen the API server's "
                        "queue")
    p.add_argument("--leader-elect", action="store_true",
                   help="run as one of several replicas: act only while holding the Lease --lease-name (a "
                        "standby serves its liveness and metrics and takes over when the leader stops renewing)")
    p.add_argument("--lease-name", default=LEASE_NAME,
                   help=f"the leader Lease's name (default {LEASE_NAME}; the chart gives its release's full name)")
    p.add_argument("--leader-elect-namespace", default=os.environ.get("POD_NAMESPACE") or "default",
                   help="namespace of the Lease (default $POD_NAMESPACE, the chart's release namespace, else default)")
    p.add_argument("--lease-seconds", type=lease_seconds, default=DEFAULT_LEASE_SECONDS,
                   help=f"the Lease's duration, {MIN_LEASE_SECONDS} to 300: a dead leader is replaced after about "
                        "this and two retry periods (duration/7.5 each); the leader renews every third of it "
                        f"(default {DEFAULT_LEASE_SECONDS})")
    job_options(p)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging (as --log-level debug)")
    p.set_defaults(func=cmd_operator)

    p = subparsers.add_parser("render", help="print the objects the operator would create for a job (no cluster)")
    p.add_argument("job", help="RLTrainingJob manifest (YAML)")
    p.add_argument("-n", "--namespace", help="namespace of the objects (default: the manifest's, else default)")
    p.add_argument("--image", default=env.image,
                   help=f"runtime image unless the job sets spec.image (default {env.image})")
    p.add_argument("--max-gpus-per-node", type=positive, default=env.max_gpus_per_node,
                   help=f"as for `kuberl operator` (default {env.max_gpus_per_node})")
    job_options(p)
    p.set_defaults(func=cmd_render)


def main(argv: list[str] | None = None) -> int:
    """`python -m kuberl_operator COMMAND`: the same commands without the rest of `kuberl`."""
    parser = argparse.ArgumentParser(prog="kuberl-operator")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    for command in sub.choices.values():
        logs.add_arguments(command)
    args = parser.parse_args(argv)
    logs.setup(args.log_level, args.log_format)
    return int(args.func(args) or 0)
