"""Checkpoint layout on disk (a PVC in Kubernetes).

    <root>/step_000010/actor/      torch DCP (sharded, loadable at any world size)
    <root>/step_000010/critic/
    <root>/step_000010/trainer_state.json   step, data position, KL controller, restarts — written last,
                                            so a directory without it is incomplete and ignored.
    <root>/snapshots/<run>/<role>.<n>/      each stateful role's per-step snapshot slots (kuberl.resilience.snapshots;
                                            roles with GPUs keep theirs in host memory instead)
    <root>/job.json                         the job's name, its trained fields and their hash, its spec
                                            (kuberl.resilience.identity): written before the first step
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kuberl import logs

if TYPE_CHECKING:  # torch is imported by the functions that use it: the CLI's checks run without it
    from torch import nn
    from torch.optim import Optimizer

log = logs.get("checkpoint")
STATE_FILE = "trainer_state.json"


def root_for(spec: Any, out: Path) -> Path:
    """A job's checkpoint folder: spec.trainer.checkpoint.path, else <out>/checkpoints."""
    path = spec.trainer.checkpoint.path
    return Path(path) if path else out / "checkpoints"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def fresh_step_dir(root: Path, step: int) -> Path:
    """An empty folder for checkpointing `step`. A folder already there is left over from a save that
    did not complete (a complete one is never saved again): it goes, so DCP writes into a clean folder
    and no stale shard can mix with the new ones."""
    d = step_dir(root, step)
    if d.exists():
        log.info(f"removing {d}: an incomplete checkpoint left by an interrupted save", extra={"step": step})
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def complete_steps(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / STATE_FILE).is_file() and p.name[5:].isdigit())


def prune_incomplete(root: Path) -> list[int]:
    """Remove every `step_*` folder without a state file (a save that never completed: a torn or partial
    checkpoint is never loaded); returns their steps. Run on start, before the resume point is chosen."""
    if not root.is_dir():
        return []
    pruned = []
    for d in sorted(root.glob("step_*")):
        if d.is_dir() and not (d / STATE_FILE).is_file():
            log.info(f"removing {d}: an incomplete checkpoint (no {STATE_FILE}) left by an interrupted save")
            shutil.rmtree(d, ignore_errors=True)
            pruned.append(int(d.name[5:]) if d.name[5:].isdigit() else -1)
    return pruned


def latest(root: Path) -> int | None:
    steps = complete_steps(root)
    return steps[-1] if steps else None


def write_state(root: Path, step: int, state: dict[str, Any], keep: int) -> None:
    """Commit a checkpoint: write the driver state atomically, then prune all but the newest `keep`. A write that
    fails (no room) leaves no state file, so the checkpoint is not complete, and raises."""
    d = step_dir(root, step)
    tmp = d / (STATE_FILE + ".tmp")
    try:
        tmp.write_text(json.dumps(state, indent=1))
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    tmp.rename(d / STATE_FILE)
    for old in complete_steps(root)[:-keep]:
        shutil.rmtree(step_dir(root, old), ignore_errors=True)


def read_state(root: Path, step: int) -> dict[str, Any]:
    return json.loads((step_dir(root, step) / STATE_FILE).read_text())


def trainable_state(model: nn.Module, optimizer: Optimizer, trainable_only: bool = False) -> dict[str, Any]:
    """A role's model and optimizer state dicts for torch DCP (sharded, loadable at any world size);
    `trainable_only`: the parameters that train (LoRA adapters) and not the frozen ones."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer, options=_options(trainable_only))
    return {"model": _trainable(model, msd) if trainable_only else msd, "optim": osd}


def load_trainable(model: nn.Module, optimizer: Optimizer, path: str, trainable_only: bool = False) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from kuberl.resilience import dcp_reader

    options = _options(trainable_only)
    msd, osd = get_state_dict(model, optimizer, options=options)
    state = {"model": _trainable(model, msd) if trainable_only else msd, "optim": osd}
    dcp_reader.load(state, path)  # its .metadata unpickled by an allow-list
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)


def _trainable(model: nn.Module, msd: dict) -> dict:
    """Only the entries of parameters that train (DCP's ignore_frozen_params keeps a tied frozen
    weight under its second name, e.g. lm_head.weight)."""
    names = {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
    return {k: v for k, v in msd.items() if k in names}


def _options(trainable_only: bool):
    """DCP state-dict options: with `trainable_only`, frozen parameters are neither saved nor expected."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)
