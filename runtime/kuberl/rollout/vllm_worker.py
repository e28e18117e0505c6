"""Runs inside vLLM's worker processes: the receiving end of the weight sync (see `weight_sync.py`).

vLLM mixes `KuberlWorkerExtension` into its GPU worker class (`LLM(worker_extension_cls=...)` names it by
qualified name, so the worker process imports this module; it must not import vLLM at module level).
The actor calls its methods through `LLM.collective_rpc`; arguments and results are plain msgpack data.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from .weight_sync import BufferRef, StagedEntry, device_uuid, import_buffer


class KuberlWorkerExtension:
    """Methods added to each vLLM worker (`self` is the worker: `self.device`, `self.get_model()`)."""

    def kuberl_worker_info(self) -> dict[str, Any]:
        """Process id and GPU of this worker: the actor uses CUDA IPC only across processes."""
        device = self.device  # type: ignore[attr-defined]
        return {"pid": os.getpid(), "device_uuid": device_uuid(device.index)}

    def kuberl_param_names(self) -> list[str]:
        """vLLM's own parameter names (fused qkv_proj, gate_up_proj, ...): what one full sync must load."""
        return sorted(name for name, _ in self.get_model().named_parameters())  # type: ignore[attr-defined]

    def kuberl_open_staging(self, ref: BufferRef) -> int:
        """Map the actor's staging buffer (kept for later syncs); returns its length in elements."""
        self._kuberl_staging = import_buffer(ref)
        return self._kuberl_staging.numel()

    def kuberl_load_staged(self, entries: list[StagedEntry]) -> list[str]:
        """Load one bucket: views of the staging buffer under their HF names, through the model's own
        `load_weights` (which maps q/k/v and gate/up onto fused parameters and shards for tensor
        parallelism). Returns the vLLM parameters written; waits for the copies before returning, since the
        actor overwrites the buffer with the next bucket as soon as this call returns."""
        buf = self._kuberl_staging
        weights = [(name, buf[off:off + math.prod(shape)].view(shape)) for name, off, shape in entries]
        loaded = self.get_model().load_weights(weights=weights)  # type: ignore[attr-defined]
        if buf.is_cuda:
            torch.cuda.synchronize(buf.device)
        return sorted(loaded) if loaded is not None else []
