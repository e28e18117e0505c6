"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture()
def one_rank_group(netns):
    """A world-size-1 gloo process group on loopback (reuses one that is already up)."""
    import torch.distributed as dist

    from kuberl.training import dist as kdist

    mine = not dist.is_initialized()
    if mine:
        kdist.init_group(0, 1, "127.0.0.1", kdist.free_port(), torch.device("cpu"))
    yield
    if mine:
        dist.destroy_process_group()
