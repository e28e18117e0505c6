"""Python's cycle collector kept off the training path.

A full (oldest-generation) collection walks every object the process tracks. After the first step a role holds
millions of them for good: the model's modules and parameters, torch.compile's graphs and guards, CUDA graphs,
the tokenizer. Walking them took seconds on an H200 at 0.5B, in the middle of a later step (a stall, issue 27).
`settle()` runs once, after a process's first step: one collection frees the garbage made so far, then
`gc.freeze()` moves every surviving object to the permanent generation, which no later collection walks (vLLM
does the same after its CUDA graphs are captured). Later collections see only what later steps allocate.

Objects frozen here that become cyclic garbage later are not freed until `thaw()` (the roles' shutdown); what
a later step allocates is not frozen, so that is bounded by what was alive after the first step.
"""

from __future__ import annotations

import gc

_settled = False


def settle() -> bool:
    """Collect, then freeze every surviving object; once per process (later calls do nothing). Returns whether
    this call did it."""
    global _settled
    if _settled:
        return False
    gc.collect()
    gc.freeze()
    _settled = True
    return True


def thaw() -> None:
    """Give the frozen objects back to the collector (the roles shut down: the in-process backend's models go), so
    that the next run in this process settles anew."""
    global _settled
    gc.unfreeze()
    _settled = False
