"""Which training kernels a worker uses, chosen once and passed down explicitly."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kuberl.spec.contract import Env


@dataclass(frozen=True)
class KernelOptions:
    """compile_blocks: torch.compile every transformer block (after FSDP2 sharding);
    compile_head: torch.compile the fused LM head's chunk math;
    fused_head: LM head + log-softmax fused in row chunks of `chunk_rows` (0: the logits path)."""

    compile_blocks: bool = False
    compile_head: bool = False
    fused_head: bool = False
    chunk_rows: int = 0

    @classmethod
    def for_device(cls, device: torch.device, env: Mapping[str, str] | None = None) -> KernelOptions:
        """What a job uses: on CUDA the fused head in 4096-row chunks, and both compilations unless
        Env.COMPILE is "0"; on CPU none of them (the plain logits path)."""
        if device.type != "cuda":
            return cls()
        on = (os.environ if env is None else env).get(Env.COMPILE, "1") != "0"
        return cls(compile_blocks=on, compile_head=on, fused_head=True, chunk_rows=4096)
