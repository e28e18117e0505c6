"""``kuberl topology``: plan GPU groups from a link matrix, or show one."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kuberl.topology.matrix import LinkMatrix, TopologyError
from kuberl.topology.nvml import read_local
from kuberl.topology.parse import parse_nvidia_smi_topo
from kuberl.topology.plan import plan_groups

_TOPO_HELP = "saved `nvidia-smi topo -m` output (default: read this machine)"


def register(subparsers: Any) -> None:
    """Add the ``topology`` command (subcommands ``plan`` and ``show``) to an argparse subparsers."""
    topology = subparsers.add_parser("topology", help="GPU link topology: show it, plan GPU groups")
    commands = topology.add_subparsers(dest="topology_command", metavar="{plan,show}", required=True)

    plan = commands.add_parser("plan", help="print the best grouping of GPUs as JSON")
    plan.add_argument("--topo", type=Path, metavar="FILE", help=_TOPO_HELP)
    plan.add_argument("--group-size", type=int, required=True, metavar="K", help="GPUs per group")
    plan.add_argument("--gpus", type=_gpu_list, metavar="0,1,2,3", help="plan only these GPU indices")
    plan.set_defaults(func=_guarded(_plan))

    show = commands.add_parser("show", help="print the link matrix as a table")
    show.add_argument("--topo", type=Path, metavar="FILE", help=_TOPO_HELP)
    show.set_defaults(func=_guarded(_show))


def _plan(args: argparse.Namespace) -> int:
    plan = plan_groups(_matrix(args.topo), args.group_size, args.gpus)
    print(json.dumps(plan.to_json()))
    return 0


def _show(args: argparse.Namespace) -> int:
    print(format_matrix(_matrix(args.topo)))
    return 0


def format_matrix(m: LinkMatrix) -> str:
    """The matrix as an aligned text table, with CPU and NUMA affinity columns."""
    header = ["", *m.names, "CPU Affinity", "NUMA Affinity"]
    rows = [
        [name, *links, cpu or "N/A", numa or "N/A"]
        for name, links, cpu, numa in zip(m.names, m.links, m.cpu_affinity, m.numa_affinity)
    ]
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows])


def _matrix(topo: Path | None) -> LinkMatrix:
    if topo is None:
        return read_local()
    return parse_nvidia_smi_topo(topo.read_text(encoding="utf-8", errors="replace"))


def _gpu_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU indices, got {text!r}") from None


def _guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn TopologyError/OSError into one ``error: ...`` line on stderr and exit code 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (TopologyError, OSError) as e:
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
            return 2

    return run


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="kuberl")
    register(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args()
    sys.exit(parsed.func(parsed))
