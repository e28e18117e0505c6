"""Role workers; each runs in its own process (a Ray actor) or in-process for the local backend."""

from ..spec import JobSpec
from .actor import ActorWorker
from .base import Worker
from .critic import CriticWorker
from .ref import RefWorker
from .reward import RewardWorker

WORKERS: dict[str, type[Worker]] = {"actor": ActorWorker, "critic": CriticWorker, "ref": RefWorker,
                                    "reward": RewardWorker}


def worker_class(spec: JobSpec, role: str) -> type[Worker]:
    """The worker class of a role: a built-in one."""
    return WORKERS[role]


__all__ = ["WORKERS", "ActorWorker", "CriticWorker", "RefWorker", "RewardWorker", "Worker", "worker_class"]
