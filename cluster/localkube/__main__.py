"""`python -m localkube build|up|down|status` (from cluster/; the Makefile's cluster targets).

up: build what is missing, start every component in ``--state`` (default ../.cluster), write
``<state>/kubeconfig``; down: stop them; status: what runs and its memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import build, procs, stack
from .nodes import DEFAULT_NODES

REPO = Path(__file__).resolve().parents[2]


def cmd_build(args: argparse.Namespace) -> int:
    if args.if_go and build.pins.go() is None:
        print("note: no Go toolchain: the real-cluster tests will skip (install Go, then `make cluster`)")
        return 0
    return build.main()


def running(state: Path) -> list[procs.Proc]:
    return [p for p in procs.load(state / "procs.json") if p.alive()]


def cmd_up(args: argparse.Namespace) -> int:
    state = Path(args.state).resolve()
    if running(state):
        print(f"already running in {state} (`make cluster-down` stops it)")
        return 0
    try:
        cache = build.ensure_built()
        cluster = stack.Cluster(state, cache).start(nodes=DEFAULT_NODES)
    except (build.BuildError, stack.StartError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rel = cluster.kubeconfig.relative_to(REPO) if cluster.kubeconfig.is_relative_to(REPO) else cluster.kubeconfig
    print(f"""\
Kubernetes {build.pins.versions()["kubernetes"]} on {cluster.server} (etcd, apiserver, controller-manager, scheduler,
kwok with nodes {", ".join(n.name for n in DEFAULT_NODES)}, KubeRay {build.pins.versions()["kuberay"]})
logs in {state}/logs
  export KUBECONFIG=$PWD/{rel} PATH={cache / "bin"}:$PATH   # kubectl {build.pins.versions()["kubernetes"]} is there
  kubectl get nodes
  make install                           # the chart; run the operator here: kuberl operator -A
  make cluster-down                      # stop everything""")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    state = Path(args.state).resolve()
    alive = running(state)
    procs.stop_all(alive)
    left = [p.name for p in alive if p.alive()]
    (state / "procs.json").unlink(missing_ok=True)
    if left:
        print(f"error: still running: {', '.join(left)}", file=sys.stderr)
        return 1
    print(f"stopped {len(alive)} processes" if alive else "nothing was running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = Path(args.state).resolve()
    alive = running(state)
    print(json.dumps({p.name: {"pid": p.pid, "rss_mib": round(p.rss_mib(), 1)} for p in alive}, indent=1))
    return 0 if alive else 1


def cmd_images(args: argparse.Namespace) -> int:
    from . import images

    return images.main(args.images, Path(args.state).resolve(), args.registry)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localkube")
    parser.add_argument("--state", default=str(REPO / ".cluster"), help="state folder (default: .cluster in the repo)")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the missing binaries into the cache")
    b.add_argument("--if-go", action="store_true", help="do nothing (but say so) without a Go toolchain")
    b.set_defaults(func=cmd_build)
    sub.add_parser("up", help="build, start, write the kubeconfig").set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop every process").set_defaults(func=cmd_down)
    sub.add_parser("status", help="what runs, with its memory").set_defaults(func=cmd_status)
    i = sub.add_parser("images", help="build images/ with BuildKit (no Docker, no registry); load them if a node runs")
    i.add_argument("images", nargs="*", help="pause, operator, runtime-cpu (the default three), runtime (CUDA)")
    i.add_argument("--registry", default="ghcr.io/kuberl", help="registry part of the kuberl image names")
    i.set_defaults(func=cmd_images)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
