"""How fast a checkpoint is written from a snapshot slot (GB/s of state), four ways, in one process:

    PYTHONPATH=runtime python bench/checkpoint_write.py                 # 1 GiB of fp32 tensors, 3 reps each
    PYTHONPATH=runtime python bench/checkpoint_write.py --gib 8 --dir /mnt/checkpoints

    runtime     the runtime's way: typed views each with a storage of its own (`snapshots._views`), written by
                `saves.writer` (no CRC-32 of the bytes)
    crc         the same views, written by DCP's own FileSystemWriter (a CRC-32 of every byte)
    whole_slot  views into the whole slot's storage (DCP's loader copies each tensor before it writes it), no CRC
    before      views into the whole slot and a CRC: the runtime's way before 2026-12-04 (issue 27)

Each write goes to the page cache (no fsync: the runtime gives the slot back before it syncs), into a fresh
folder under --dir. Beside each write a Python thread loops (as a training thread issuing kernels would): the
longest it waited for the interpreter during the write (`probe_max_gap_ms`) shows whether the write holds the GIL.
Prints one JSON line per variant (the median of --reps writes), then a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from kuberl.resilience import saves, snapshots  # noqa: E402

VARIANTS = ("runtime", "crc", "whole_slot", "before")


def whole_slot_views(buf: torch.Tensor, layout: list[snapshots.Entry]) -> list[torch.Tensor]:
    """Typed views that share the whole slot's storage (the old `snapshots._views`)."""
    return [buf[e.offset:e.offset + e.nbytes].view(getattr(torch, e.dtype)).view(e.shape) for e in layout]


class Probe:
    """A thread of short Python steps; `max_gap_s`: the longest time between two of them (its wait for the GIL)."""

    def __init__(self):
        self.stop, self.max_gap_s = threading.Event(), 0.0
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        last = time.perf_counter()
        while not self.stop.is_set():
            sum(range(100))
            now = time.perf_counter()
            self.max_gap_s, last = max(self.max_gap_s, now - last), now

    def __enter__(self) -> Probe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def write_rate(views: list[torch.Tensor], folder: Path, own_writer: bool) -> tuple[float, float]:
    """(GB/s, the probe's longest wait in ms) of one DCP save of `views` into `folder` (no process group)."""
    shutil.rmtree(folder, ignore_errors=True)
    make = saves.writer(str(folder), sync=False) if own_writer else FileSystemWriter(
        str(folder), sync_files=False, thread_count=1, per_thread_copy_ahead=0)
    with Probe() as probe:
        t0 = time.perf_counter()
        dcp.save({f"t{i}": v for i, v in enumerate(views)}, storage_writer=make, no_dist=True)
        seconds = time.perf_counter() - t0
    return sum(v.nbytes for v in views) / seconds / 1e9, 1e3 * probe.max_gap_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="state size, in 64 MiB fp32 tensors")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    count = max(1, round(args.gib * 16))
    tensors = [torch.randn(16 << 20) for _ in range(count)]
    layout = snapshots.layout_of(tensors)
    buf = torch.empty(snapshots.slot_size(tensors), dtype=torch.uint8)
    own = snapshots._views(buf, layout)
    for dst, src in zip(own, tensors):
        dst.copy_(src)
    del tensors
    whole = whole_slot_views(buf, layout)
    ways = {"runtime": (own, True), "crc": (own, False), "whole_slot": (whole, True), "before": (whole, False)}
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for name in VARIANTS:
            views, own_writer = ways[name]
            rates, gaps = zip(*(write_rate(views, Path(tmp) / name, own_writer) for _ in range(args.reps)))
            rows.append({"variant": name, "gb_per_s": statistics.median(rates), "all": rates,
                         "probe_max_gap_ms": max(gaps), "state_gb": sum(v.nbytes for v in views) / 1e9})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{rows[0]['state_gb']:.2f} GB of fp32 state, median of {args.reps} writes, "
          f"{torch.get_num_threads()} threads")
    print("| variant | GB/s | vs runtime | longest wait of a Python thread beside it, ms |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['variant']} | {r['gb_per_s']:.2f} | {r['gb_per_s'] / rows[0]['gb_per_s']:.2f}x | "
              f"{r['probe_max_gap_ms']:.1f} |")


if __name__ == "__main__":
    main()
