"""What a role that shares its GPUs does with its GPU memory between its phases (`spec.roles.<role>.idleMemory`).

Roles on the same GPUs run their phases one after another (`kuberl.controller.schedule`); each holds the GPU memory
of its phase only while the phase runs. After every call a sharing role frees what an FSDP2 forward left
gathered and the caching allocator's blocks (activations, temporaries), so that the next role's process
can allocate them; under `offload` (the default) it also moves its resident state to host memory: the
FSDP2 parameters, the AdamW moments and the actor's hf rollout model. Before its next phase the state
comes back. Already-offloaded state (`spec.roles.<role>.offload`) stays where that offload keeps it.
Costs about 2 x the state's bytes of host<->device copies per phase call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from kuberl.training.kernels.optim import ShardedAdamW, move_adamw_state

HOST = torch.device("cpu")


@dataclass
class Resident:
    """A role's GPU state between phases: its modules and its optimizer, and where the rest of the state
    lives by the role's own offload settings (`params_on_host`, `moments_on_host`: never moved here)."""

    device: torch.device
    offload: bool  # idleMemory offload (True) or free (False)
    modules: list[nn.Module] = field(default_factory=list)
    optimizer: ShardedAdamW | None = None  # its torch optimizer may be replaced (a fused fallback): read it late
    params_on_host: bool = False
    moments_on_host: bool = False
    asleep: bool = False

    @torch.no_grad()
    def sleep(self) -> None:
        """After a phase: gathered FSDP2 weights freed, state to the host (offload), and the allocator's cache
        back to the GPU's pool."""
        for module in self.modules:
            reshard(module)
        if self.offload and not self.asleep:
            self._move(HOST)
            self.asleep = True
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    @torch.no_grad()
    def wake(self) -> None:
        """Before a phase: the state back on the role's device."""
        if self.asleep:
            self._move(self.device)
            self.asleep = False

    def _move(self, to: torch.device) -> None:
        if not self.params_on_host:
            for module in self.modules:
                module.to(to)
        if self.optimizer is not None and not self.moments_on_host:
            move_adamw_state(self.optimizer.optimizer, to)


def reshard(module: nn.Module) -> None:
    """Free the unsharded parameters an FSDP2 unit keeps after a forward without reshard (one unit on one GPU)."""
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
