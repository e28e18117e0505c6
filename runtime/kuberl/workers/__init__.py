"""Role workers; each runs in its own process (a Ray actor) or in-process for the local backend."""

from kuberl.spec import JobSpec

from .actor import ActorWorker
from .base import Worker
from .critic import CriticWorker
from .env import EnvWorker
from .ref import RefWorker
from .reward import RewardWorker
from .rollout import RolloutWorker

WORKERS: dict[str, type[Worker]] = {"actor": ActorWorker, "critic": CriticWorker, "ref": RefWorker,
                                    "reward": RewardWorker, "rollout": RolloutWorker, "env": EnvWorker}


def worker_class(spec: JobSpec, role: str) -> type[Worker]:
    """The worker class of a role: a built-in one, or an extra role's by its import path (one error
    line naming spec.roles.extra.<role>.worker when it does not resolve to a Worker subclass)."""
    if role in WORKERS:
        return WORKERS[role]
    from kuberl.registry import RegistryError, import_object

    field = f"spec.roles.extra.{role}.worker"
    path = spec.roles.extra[role].worker
    cls = import_object(path, field, "class")
    if not (isinstance(cls, type) and issubclass(cls, Worker)):
        raise RegistryError(f"{field}: {path} is not a kuberl.workers.Worker subclass (fix: subclass Worker)")
    return cls


__all__ = ["WORKERS", "ActorWorker", "CriticWorker", "EnvWorker", "RefWorker", "RewardWorker", "RolloutWorker",
           "Worker", "worker_class"]
