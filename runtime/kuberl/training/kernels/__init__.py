"""Training kernels: the fused LM head (`lm_head`), optimiser steps on local shards (`optim`), and the
explicit choice of which a worker uses (`options.KernelOptions`)."""

from kuberl.training.kernels.options import KernelOptions

__all__ = ["KernelOptions"]
