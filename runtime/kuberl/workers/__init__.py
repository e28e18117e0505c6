"""Role workers; each runs in its own process (a Ray actor) or in-process for the local backend."""

from .actor import ActorWorker
from .critic import CriticWorker
from .ref import RefWorker
from .reward import RewardWorker

WORKERS = {"actor": ActorWorker, "critic": CriticWorker, "ref": RefWorker, "reward": RewardWorker}

__all__ = ["WORKERS", "ActorWorker", "CriticWorker", "RefWorker", "RewardWorker"]
