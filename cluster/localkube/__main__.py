"""`python -m localkube build|up|down|status` (from cluster/; the Makefile's cluster targets).

up: build what is missing, start every component in ``--state`` (default ../.cluster), write
``<state>/kubeconfig``; down: stop them; status: what runs and its memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import build, images, node, procs, stack
from .nodes import DEFAULT_NODES

REPO = Path(__file__).resolve().parents[2]


def cmd_build(args: argparse.Namespace) -> int:
    if args.if_go and build.pins.go() is None:
        print("note: no Go toolchain: the real-cluster tests will skip (install Go, then `make cluster`)")
        return 0
    return build.main()


def running(state: Path) -> list[procs.Proc]:
    return [p for p in procs.load(state / "procs.json") if p.alive()]


KUEUE_PODS_READY = ("10m", "5m")  # waitForPodsReady (timeout, recoveryTimeout), as docs/operator.md recommends


def cmd_up(args: argparse.Namespace) -> int:
    state = Path(args.state).resolve()
    if running(state):
        print(f"already running in {state} (`make cluster-down` stops it)")
        return 0
    why_not = real_node_problem() if not args.no_real_node else None
    if why_not:
        print(f"note: no real node ({why_not}); kwok nodes only")
    try:
        cache = build.ensure_built()
        tars = [t for t in map(images.tar_path, images.DEFAULT) if t.is_file()]
        real = not (args.no_real_node or why_not)
        # With the real node, CPU pods go there: the kwok nodes left are the GPU ones (tainted).
        nodes = [n for n in DEFAULT_NODES if n.gpus] if real else list(DEFAULT_NODES)
        cluster = stack.Cluster(state, cache, real_node=real, images=tars).start(nodes=nodes)
        kueue_s = cluster.start_kueue(KUEUE_PODS_READY) if args.kueue else None
    except (build.BuildError, stack.StartError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    real_text = ", and the real node node-0" if real else ""
    kueue_text = f", Kueue {build.pins.kueue_version()} (started in {kueue_s:.1f}s)" if kueue_s is not None else ""
    rel = cluster.kubeconfig.relative_to(REPO) if cluster.kubeconfig.is_relative_to(REPO) else cluster.kubeconfig
    print(f"""\
Kubernetes {build.pins.versions()["kubernetes"]} on {cluster.server} (etcd, apiserver, controller-manager, scheduler,
kwok with nodes {", ".join(n.name for n in nodes)}, KubeRay {build.pins.versions()["kuberay"]}{real_text}{kueue_text})
logs in {state}/logs
  export KUBECONFIG=$PWD/{rel} PATH={cache / "bin"}:$PATH   # kubectl {build.pins.versions()["kubernetes"]} is there
  kubectl get nodes
  make images && make install            # the chart, the operator a pod of the local image (or: kuberl operator -A)
  make cluster-down                      # stop everything""")
    return 0


def real_node_problem() -> str | None:
    """Why this machine cannot run the real node, or None."""
    if missing := node.missing_tools():
        return f"missing {', '.join(missing)}: `make node-deps`"
    if os.geteuid() != 0:
        return "needs root"
    if not images.tar_path("pause").is_file():
        return "no pause image: `make images` first"
    return None


def cmd_down(args: argparse.Namespace) -> int:
    state = Path(args.state).resolve()
    alive = running(state)
    node.teardown(state)
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

    return images.main(args.images, Path(args.state).resolve(), args.registry, args.cuda_base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localkube")
    parser.add_argument("--state", default=str(REPO / ".cluster"), help="state folder (default: .cluster in the repo)")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the missing binaries into the cache")
    b.add_argument("--if-go", action="store_true", help="do nothing (but say so) without a Go toolchain")
    b.set_defaults(func=cmd_build)
    up = sub.add_parser("up", help="build, start, write the kubeconfig")
    up.add_argument("--no-real-node", action="store_true", help="kwok nodes only (no kubelet, containerd)")
    up.add_argument("--kueue", action="store_true",
                    help="start Kueue too (its CRDs, manager and webhooks; RayClusters with a queue name)")
    up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop every process").set_defaults(func=cmd_down)
    sub.add_parser("status", help="what runs, with its memory").set_defaults(func=cmd_status)
    i = sub.add_parser("images", help="build images/ with BuildKit (no Docker, no registry); load them if a node runs")
    i.add_argument("images", nargs="*", help="pause, operator, runtime-cpu (the default three), runtime (CUDA)")
    i.add_argument("--registry", default="ghcr.io/kuberl", help="registry part of the kuberl image names")
    i.add_argument("--cuda-base", default="", metavar="REF@sha256:DIGEST",
                   help="the CUDA runtime's base, pinned by digest (the Dockerfile refuses a tag)")
    i.set_defaults(func=cmd_images)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
