"""Which threads of the machine wait in the kernel, and where: every `--every` seconds, each thread in state D
(uninterruptible: a disk wait, a filesystem journal, page writeback) with its name and kernel wait channel.
Run it beside a benchmark to see what a stalled step's thread waits for (Linux only; the kernel stack needs root).

    python3 bench/blocked.py --out blocked.txt &    # lines: time  pid/tid  thread name  wchan  kernel stack
"""

from __future__ import annotations

import argparse
import glob
import time
from pathlib import Path


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def blocked_threads() -> list[tuple[str, str, str, str]]:
    """(pid/tid, thread name, wait channel, kernel stack on one line) of each thread now in state D."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/task/*/stat"):
        text = _read(stat)
        if ") D " not in text:
            continue
        task = stat[: -len("stat")]
        ids = "/".join(task.split("/")[2:5:2])
        stack = "|".join(line.split()[-1] for line in _read(task + "stack").splitlines()[:8])
        found.append((ids, _read(task + "comm").strip(), _read(task + "wchan").strip(), stack))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--every", type=float, default=0.05, help="seconds between two looks")
    args = ap.parse_args()
    with open(args.out, "w") as out:
        while True:
            now = time.time()
            for row in blocked_threads():
                out.write(f"{now:.2f} " + " ".join(row) + "\n")
            out.flush()
            time.sleep(args.every)


if __name__ == "__main__":
    main()
