"""What setting up the snapshot slots costs a training loop running beside it (GPU only).

    python3 bench/pinning.py --gib 8

A slot is a file in /dev/shm, reserved (`posix_fallocate`: the kernel zero-fills its pages), mapped, and
page-locked (`cudaHostRegister`) so that the GPU can copy into it by DMA. Each of those is timed here on its own
thread while the main thread runs a stand-in for training (bf16 matmuls, each synchronised): the table gives each
set-up's seconds and how much slower the matmuls ran meanwhile (their median and worst time against the same
loop alone). Pinning is timed whole (one call) and in pieces (`--piece-mib` each), then a device-to-host copy of
the whole buffer on a side stream.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

import torch


def matmul_loop(stop: threading.Event, n: int = 4096) -> list[float]:
    """Seconds of each synchronised bf16 matmul (n x n) until `stop` is set."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    times = []
    while not times or not stop.is_set():  # at least one, so a set-up faster than one matmul still has a row
        t0 = time.perf_counter()
        for _ in range(4):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.current_stream().synchronize()  # its own stream, as training waits (a side stream's copies not)
        times.append(time.perf_counter() - t0)
    return times


def check(err: object) -> None:
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {int(err)}")


def beside(work: Callable[[], None]) -> tuple[float, list[float]]:
    """Run `work` on a thread while the matmul loop runs here; (work's seconds, the loop's times meanwhile)."""
    stop, took = threading.Event(), []

    def run() -> None:
        t0 = time.perf_counter()
        work()
        took.append(time.perf_counter() - t0)
        stop.set()

    thread = threading.Thread(target=run)
    thread.start()
    times = matmul_loop(stop)
    thread.join()
    return took[0], times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=8.0, help="the slot's size")
    ap.add_argument("--piece-mib", type=int, default=256, help="pinning in pieces of this size")
    args = ap.parse_args()
    size = int(args.gib * 2**30)
    stop = threading.Event()
    threading.Timer(3.0, stop.set).start()
    alone = matmul_loop(stop)[3:]
    base = statistics.median(alone)
    rows = [("matmul loop alone", 0.0, alone)]
    cudart = torch.cuda.cudart()
    with tempfile.NamedTemporaryFile(dir="/dev/shm") as f:
        rows.append(("posix_fallocate", *beside(lambda: os.posix_fallocate(f.fileno(), 0, size))))
        buf = torch.from_file(f.name, shared=True, size=size, dtype=torch.uint8)
        rows.append(("touch the pages", *beside(lambda: buf.fill_(1))))
        whole = lambda: check(cudart.cudaHostRegister(buf.data_ptr(), size, 0))  # noqa: E731
        rows.append(("cudaHostRegister whole", *beside(whole)))
        check(cudart.cudaHostUnregister(buf.data_ptr()))
        piece = args.piece_mib << 20
        starts = range(0, size, piece)

        def pieces() -> None:
            for s in starts:
                check(cudart.cudaHostRegister(buf.data_ptr() + s, min(piece, size - s), 0))

        rows.append((f"cudaHostRegister in {args.piece_mib} MiB pieces", *beside(pieces)))
        src = torch.empty(size, dtype=torch.uint8, device="cuda")
        stream = torch.cuda.Stream()

        def copy() -> None:
            with torch.cuda.stream(stream):
                for s in starts:
                    buf[s:s + piece].copy_(src[s:s + piece], non_blocking=True)
            stream.synchronize()

        rows.append(("copy GPU -> pinned slot, side stream", *beside(copy)))
        for s in starts:
            cudart.cudaHostUnregister(buf.data_ptr() + s)
    print(f"slot {args.gib:g} GiB; matmul step alone: median {base * 1e3:.2f} ms")
    print("| set-up | seconds | GiB/s | matmul median x | matmul worst x |")
    print("| --- | --- | --- | --- | --- |")
    for name, seconds, times in rows:
        rate = f"{args.gib / seconds:.1f}" if seconds else ""
        print(f"| {name} | {seconds:.2f} | {rate} | {statistics.median(times) / base:.2f} | {max(times) / base:.2f} |")


if __name__ == "__main__":
    main()
