"""Device-wide GPU memory for the benchmarks: what every process on the GPU holds (vLLM's engine runs in its
own process, so torch.cuda.max_memory_allocated of this process does not see it).

Read through NVML (nvidia-ml-py), never through the CUDA runtime, so the sampling thread cannot disturb a
CUDA graph capture in the main thread. Without NVML the readings are None.
"""

from __future__ import annotations

import threading
import time


def _handle(index: int):
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # no NVML library or no driver
        return None, None


def used_gib(index: int = 0) -> float | None:
    """Memory in use on GPU `index` now, all processes, in GiB (None without NVML)."""
    nvml, h = _handle(index)
    return nvml.nvmlDeviceGetMemoryInfo(h).used / 2**30 if h is not None else None


class PeakSampler:
    """Samples the device-wide used memory every `period` seconds in a thread; `peak_gib` after `stop()`."""

    def __init__(self, index: int = 0, period: float = 0.01):
        self.nvml, self.handle = _handle(index)
        self.period, self.peak_gib = period, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        peak = 0
        while not self._stop.is_set():
            peak = max(peak, self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)
            time.sleep(self.period)
        self.peak_gib = peak / 2**30

    def __enter__(self) -> PeakSampler:
        if self.handle is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self._stop.set()
            self._thread.join()
