"""Where a benchmark's seconds go: a sampler of every thread's Python stack, grouped by the step in progress.

    with StackSampler() as sampler:
        for step in ...:
            sampler.label = step
            ...
    print(sampler.report(step))   # the stacks that held the most samples while `step` ran

Python's cycle collector is timed too (its pauses hold the GIL, so no stack is sampled during one). Each sample
is one frame per busy thread, taken every `interval_s` seconds: the innermost frame of the project's own
code (`kuberl/`), with the innermost frame below it (a torch call, a lock, a sleep) for context. A frame seen in
many samples of a slow step is where that step's time went; in-process only (the bench's LocalWorkerGroup).
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections import Counter
from types import FrameType

OWN = ("/kuberl/",)  # frames of the project's own code
IDLE = ("concurrent/futures/thread.py", "threading.py", "queue.py", "selectors.py",  # waiting, outside our code
        "subproc_pool.py", "timer.py", "devmem.py")  # torch.compile's idle workers, the bench's NVML sampler


def _where(frame: FrameType | None) -> str | None:
    """`own_file:line func <- innermost_file:line func`, or the innermost frame alone outside the project; None
    for an idle thread (a pool's worker waiting for work, a thread of someone else's waiting on a lock)."""
    inner, own = frame, None
    while frame is not None:
        if own is None and any(part in frame.f_code.co_filename for part in OWN):
            own = frame
        frame = frame.f_back
    fmt = lambda f: f"{f.f_code.co_filename.rsplit('/', 2)[-1]}:{f.f_lineno} {f.f_code.co_name}"  # noqa: E731
    if inner is None or (own is None and inner.f_code.co_filename.endswith(IDLE)):
        return None
    return fmt(inner) if own is None or own is inner else f"{fmt(own)} <- {fmt(inner)}"


class StackSampler:
    """A daemon thread sampling every other thread's stack every `interval_s` seconds, keyed by `label`."""

    def __init__(self, interval_s: float = 0.02):
        self.interval_s, self.label = interval_s, None
        self.samples: dict[object, Counter[tuple[str, str]]] = {}
        self.gc_s: dict[object, Counter[int]] = {}  # label -> generation -> seconds in the cycle collector
        self.late_s: dict[object, list[float]] = {}  # label -> the sampler's wake-ups past their time, seconds: it
        # waits for the interpreter like any thread, so a long one is another thread holding the GIL (or
        # the process not running) that long
        self._gc_start = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def __enter__(self) -> StackSampler:
        gc.callbacks.append(self._gc)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._gc)
        self._stop.set()
        self._thread.join()

    def _gc(self, phase: str, info: dict) -> None:
        """A collection's pause (the collector holds the GIL: no stack is sampled meanwhile)."""
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_s.setdefault(self.label, Counter())[info["generation"]] += time.perf_counter() - self._gc_start

    def _run(self) -> None:
        me = threading.get_ident()
        due = time.perf_counter() + self.interval_s
        while not self._stop.wait(max(due - time.perf_counter(), 0.0)):
            now = time.perf_counter()
            self.late_s.setdefault(self.label, []).append(now - due)
            due = now + self.interval_s
            names = {t.ident: t.name for t in threading.enumerate()}
            counts = self.samples.setdefault(self.label, Counter())
            for ident, frame in sys._current_frames().items():
                where = _where(frame) if ident != me else None
                if where is not None:
                    counts[(names.get(ident, str(ident)), where)] += 1

    def report(self, label: object, top: int = 8) -> str:
        """The `top` most sampled (thread, frame) pairs while `label` ran, with their seconds (samples x interval)."""
        counts = self.samples.get(label, Counter())
        top_pairs = counts.most_common(top)
        lines = [f"  {n * self.interval_s:6.2f} s  [{thread}] {where}" for (thread, where), n in top_pairs]
        pauses = self.gc_s.get(label, Counter())
        lines.append("  cycle collector: " + (", ".join(f"generation {g} {s:.2f} s" for g, s in sorted(pauses.items()))
                                              or "no collection"))
        late = sorted(self.late_s.get(label, []))
        if late:
            lines.append(f"  the sampler woke late (the GIL held elsewhere, or no CPU): {sum(late):.2f} s in all, the "
                         f"longest {late[-1] * 1000:.0f} ms, {sum(x > 0.05 for x in late)} wake-ups over 50 ms")
        return "\n".join(lines)

