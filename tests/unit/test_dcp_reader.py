"""A checkpoint is data, not code: a planted DCP `.metadata` is refused before anything of it runs."""

from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from kuberl.resilience import checkpoint, dcp_reader


class Payload:
    """What another job's code could write as `.metadata`: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def saved(folder: Path) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A model and a stepped AdamW, saved as DCP into `folder` (in one process)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2).to(torch.bfloat16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model[1](model[0](torch.randn(2, 4)).to(torch.bfloat16)).float().sum().backward()
    optimizer.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(checkpoint.trainable_state(model, optimizer), checkpoint_id=str(folder), no_dist=True)
    return model, optimizer


def test_a_real_checkpoint_loads_through_the_allow_list(tmp_path: Path) -> None:
    model, optimizer = saved(tmp_path)
    other = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2).to(torch.bfloat16))
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        checkpoint.load_trainable(other, other_opt, str(tmp_path))
    for a, b in zip(model.state_dict().values(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    moments = [s["exp_avg"] for s in other_opt.state.values()]
    assert moments and all(m.abs().sum() > 0 for m in moments)


def test_a_planted_metadata_is_refused_and_never_runs(tmp_path: Path) -> None:
    saved(tmp_path)
    marker = tmp_path / "ran"
    (tmp_path / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2).to(torch.bfloat16))
    with pytest.raises(dcp_reader.CheckpointRefused, match=r"refers to posix\.system, which no DCP checkpoint holds"):
        checkpoint.load_trainable(model, torch.optim.AdamW(model.parameters()), str(tmp_path))
    assert not marker.exists()
    with pytest.raises(AttributeError):  # torch's own reader unpickles it as it is: the command runs
        dcp.FileSystemReader(str(tmp_path)).read_metadata()
    assert marker.exists()


class Member:
    """An enum member as Python 3.12 pickles it (the runtime image's): getattr(the enum, its name)."""

    def __reduce__(self):
        from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

        return getattr, (_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT")


class Method:
    """getattr to reach a method of an allowed class, then call it: `Path(marker).touch()`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return self.marker.touch, ()


def test_getattr_gives_an_enum_member_and_nothing_else(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    (tmp_path / "member").write_bytes(pickle.dumps(Member()))
    with open(tmp_path / "member", "rb") as f:
        assert dcp_reader._MetadataUnpickler(f, tmp_path).load() is _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
    marker = tmp_path / "ran"
    (tmp_path / ".metadata").write_bytes(pickle.dumps(Method(marker)))
    with pytest.raises(dcp_reader.CheckpointRefused, match=r"refers to getattr\(PosixPath, 'touch'\)"):
        dcp_reader.read_metadata(tmp_path / ".metadata")
    assert not marker.exists()


def test_metadata_that_is_not_dcps_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": {}}))
    with pytest.raises(dcp_reader.CheckpointRefused, match="holds a dict, not DCP metadata"):
        dcp_reader.read_metadata(tmp_path / ".metadata")
