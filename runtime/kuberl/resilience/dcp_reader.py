"""Reading a torch DCP checkpoint without running code from it.

DCP writes its index, `<folder>/.metadata`, with pickle, and its reader unpickles it as it is: a folder
that another process could write (a PVC shared with another job) could then run code in the job that
loads it. `SafeReader` reads the same file with an unpickler that builds only what DCP's metadata is
made of (its dataclasses and enum, `torch.Size`, dtypes, layouts, paths) and refuses any other global, so a
planted `.metadata` fails the load with `CheckpointRefused` instead of running. The shards themselves
are read by DCP as before (raw tensor bytes; other entries through `torch.load(weights_only=True)`).
"""

from __future__ import annotations

import enum
import pickle
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader, Metadata

_DCP = "torch.distributed.checkpoint"
ALLOWED: dict[str, frozenset[str]] = {
    f"{_DCP}.metadata": frozenset({"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                   "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta",
                                   "_MEM_FORMAT_ENCODING"}),
    f"{_DCP}.filesystem": frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "Path"}),
    "collections": frozenset({"OrderedDict"}),
}
"""module -> the names a DCP `.metadata` may refer to (besides `torch.<dtype>`)."""


class CheckpointRefused(ValueError):
    """A checkpoint's `.metadata` refers to something DCP's metadata never holds."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in ALLOWED.get(module, ()) or (module == "torch" and _is_dtype(name)):
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):  # how Python 3.12 pickles an enum member
            return self._member
        raise self._refused(f"{module}.{name}")

    def _member(self, owner: Any, name: str) -> Any:
        """getattr(owner, name) for a member of an allowed Enum only (anything else could reach a method)."""
        if isinstance(owner, type) and issubclass(owner, enum.Enum) and isinstance(name, str) \
                and name in owner.__members__:
            return owner[name]
        raise self._refused(f"getattr({getattr(owner, '__qualname__', type(owner).__name__)}, {name!r})")

    def _refused(self, what: str) -> CheckpointRefused:
        return CheckpointRefused(
            f"{self.path} refers to {what}, which no DCP checkpoint holds: refused to load it (the folder was "
            f"written by something other than kuberl; delete the step_* folder it is in, or resume elsewhere)")


def _is_dtype(name: str) -> bool:
    import torch

    return isinstance(getattr(torch, name, None), torch.dtype)


def read_metadata(path: Path) -> Metadata:
    """Unpickle a DCP `.metadata` file, building only the allowed classes."""
    with open(path, "rb") as f:
        metadata = _MetadataUnpickler(f, path).load()
    if not isinstance(metadata, Metadata):
        raise CheckpointRefused(f"{path} holds a {type(metadata).__name__}, not DCP metadata: refused to load it")
    return metadata


def load(state: dict[str, Any], folder: str | Path, **kwargs: Any) -> None:
    """`torch.distributed.checkpoint.load` of `folder` into `state`, its `.metadata` checked first (DCP would
    log a refusal as a warning and fail later with an unrelated message) and read by `SafeReader`."""
    import torch.distributed.checkpoint as dcp

    read_metadata(Path(folder) / ".metadata")
    dcp.load(state, storage_reader=SafeReader(str(folder)), **kwargs)


class SafeReader(FileSystemReader):
    """DCP's filesystem reader, with `.metadata` read by `read_metadata` (rank-local metadata files too)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
