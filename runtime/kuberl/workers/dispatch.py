"""How a call to a role is spread over the role's ranks and how the results come back, declared once
on the worker method with `@register(Dispatch.X)`.

    SPLIT   the first argument (a Batch) is split into equal contiguous shards, one per rank; Batch
            results are concatenated in rank order; any other result must be the same on every rank
            (all-reduced statistics) and rank 0's is returned
    ONE     every rank gets the same arguments (a collective, or work done alike on every rank);
            rank 0's result is returned
    ALL     every rank gets the same arguments; the list of per-rank results is returned

`kuberl.controller.proxies` reads the mode from the method itself, so the driver never indexes a rank's result.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kuberl.data.batch import Batch

F = TypeVar("F", bound=Callable[..., Any])
_ATTR = "__kuberl_dispatch__"


class Dispatch(enum.Enum):
    SPLIT = "split"
    ONE = "one"
    ALL = "all"


@dataclass(frozen=True)
class MethodInfo:
    dispatch: Dispatch
    faults: bool  # whether injected faults (spec.resilience.faults) may hit this call
    # runs in the workers' control concurrency group, beside a stuck call (kuberl.resilience.hangs)
    control: bool = False
    state: bool = True  # needs the role's models on its device (a role sharing GPUs wakes them: kuberl.training.idle)
    trains: bool = False  # changes the role's trained state (an update): the supervisor keeps its last call
    # running it twice changes nothing: sent again when its link broke (kuberl.controller.proxies)
    repeatable: bool = False


def register(dispatch: Dispatch, *, faults: bool = True, control: bool = False, state: bool = True,
             trains: bool = False, repeatable: bool = False) -> Callable[[F], F]:
    """Declare a worker method callable from the driver, and how it is dispatched over ranks.
    `faults=False` for lifecycle calls (save, load) that fault injection must leave alone;
    `control=True` for cheap calls (ping, memory, stack dump) that must answer while a call is stuck;
    `state=False` for calls that use no model state on the device (bookkeeping; control calls never do);
    `trains=True` for an update (`update(batch, step)`: trained step `step + 1`), which a restarted role whose
    snapshot of it was not yet whole runs again (`kuberl.library.Roles.recover`);
    `repeatable=True` for a call that changes nothing when it runs twice (a read, a seeded computation, an update
    that a trainer applies once per step): when the connection to a live rank broke during it, it is sent again
    rather than the role restarted (control calls are repeatable)."""

    def mark(fn: F) -> F:
        setattr(fn, _ATTR, MethodInfo(dispatch, faults, control, state and not control, trains,
                                           repeatable or control))
        return fn

    return mark


def method_info(fn: Callable[..., Any]) -> MethodInfo:
    info = getattr(fn, _ATTR, None)
    if info is None:
        name = getattr(fn, "__qualname__", fn)
        raise TypeError(f"{name} is not a role method: decorate it with @register(Dispatch...)")
    return info


def scatter(info: MethodInfo, world_size: int, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Per-rank positional arguments: under SPLIT the first one (a Batch) is sharded."""
    if info.dispatch is not Dispatch.SPLIT:
        return [args] * world_size
    if not args or not isinstance(args[0], Batch):
        raise TypeError("a Dispatch.SPLIT method takes the Batch to split as its first argument")
    return [(shard, *args[1:]) for shard in args[0].split(world_size)]


def gather(info: MethodInfo, results: list[Any]) -> Any:
    """The caller's result from the per-rank results (in rank order)."""
    if info.dispatch is Dispatch.ALL:
        return results
    if info.dispatch is Dispatch.SPLIT and results and isinstance(results[0], Batch):
        return Batch.concat(results)
    return results[0]
