"""Job identity: which job a checkpoint folder belongs to, so a resume never mixes two jobs.

`<checkpoint root>/job.json` records the job's name, the spec fields that change what is trained and
their hash, and the whole spec (export reads the model from it). It is written before the first step.
A later run into the same folders resumes only when the name and the hash match; otherwise it stops
before anything is written, naming the difference.

Fields that change what is trained (hashed): `spec.model` (hub, path, builtin, dtype), all of `spec.algorithm`,
`spec.data` (task or files, keys, prompt length, batch size, shuffle; not `eval`), `spec.reward`, all of
`spec.environment` (nothing when unset), the rollout's sampling (`maxNewTokens`, `temperature`, `topP`, `n`,
`fixedLength`) and the trainer's hyperparameters (`ppoEpochs`, `miniBatchSize`, `gradClip`, `seed`) and each
training role's optimizer (`spec.roles.<role>.optim`). The optimizer is recorded as before that block existed, under
`spec.trainer.actorLr`, `criticLr`, `weightDecay` and `warmupSteps` (the values in effect, which validation writes
back into those deprecated fields), plus, under `spec.roles.<role>.optim.<field>`, what they cannot hold: betas
other than the default, and a weight decay or warm-up of one role's own. A job that sets none of those hashes as it
did, so its checkpoints still resume.

Not hashed, free to change between runs: `trainer.steps` (raise it to train further), checkpoint
interval/keep/path, metrics ports, tracking, evaluation, `microBatchSize` (gradient accumulation is
exact), `gradientCheckpointing`, roles and replicas (data parallelism is exact), the rollout engine and
its tuning, placement, resilience and injected faults, image, suspend.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl.resilience import checkpoint
from kuberl.spec import JobSpec
from kuberl.spec.model import ADAMW_BETAS, TRAINING_ROLES

IDENTITY_FILE = "job.json"
OUTPUT_ARTEFACTS = ("metrics.jsonl", "reward_curve.png", "tensorboard", "model")
"""What a run writes under its output folder (what --restart removes; nothing else is touched)."""

_TRAINED: dict[str, tuple[str, ...] | None] = {
    "model": ("hub", "path", "builtin", "dtype"),
    "algorithm": None,
    "data": ("task", "files", "promptKey", "answerKey", "maxPromptLength", "batchSize", "shuffle"),
    "reward": None,
    "environment": None,
    "rollout": ("maxNewTokens", "temperature", "topP", "n", "fixedLength"),
    "trainer": ("ppoEpochs", "miniBatchSize", "actorLr", "criticLr", "weightDecay", "gradClip", "warmupSteps", "seed"),
}


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k in sorted(value):
            _flatten(f"{prefix}.{k}", value[k], out)
    else:
        out[prefix] = value


def trained_fields(spec: JobSpec) -> dict[str, Any]:
    """The fields that change what is trained, as {'spec.algorithm.kl.coef': 0.01, ...}."""
    dumped = spec.model_dump(by_alias=True, mode="json")
    out: dict[str, Any] = {}
    for section, keys in _TRAINED.items():
        part = dumped[section] or {}
        _flatten(f"spec.{section}", part if keys is None else {k: part.get(k) for k in keys}, out)
    return out | _optim_beyond_trainer(spec, dumped["trainer"])


def _optim_beyond_trainer(spec: JobSpec, trainer: dict[str, Any]) -> dict[str, Any]:
    """Each training role's optimizer settings in effect that spec.trainer's deprecated fields (hashed above, as
    dumped in `trainer`) do not carry."""
    out = {}
    for role in TRAINING_ROLES:
        carried = {"lr": trainer[f"{role}Lr"], "betas": list(ADAMW_BETAS), "weightDecay": trainer["weightDecay"],
                   "warmupSteps": trainer["warmupSteps"]}
        optim = spec.optim(role).model_dump(by_alias=True, mode="json")
        out |= {f"spec.roles.{role}.optim.{k}": v for k, v in optim.items() if v != carried[k]}
    return out


def fingerprint(fields: dict[str, Any]) -> str:
    """A short hash of the trained fields (sha256 of their canonical JSON)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Identity:
    name: str
    fields: dict[str, Any]
    spec: dict[str, Any]

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.fields)

    @classmethod
    def of(cls, name: str, spec: JobSpec) -> Identity:
        return cls(name, trained_fields(spec), spec.model_dump(by_alias=True, mode="json", exclude_none=True))

    @classmethod
    def read(cls, root: Path) -> Identity | None:
        path = root / IDENTITY_FILE
        if not path.is_file():
            return None
        obj = json.loads(path.read_text())
        return cls(obj["name"], obj["fields"], obj.get("spec", {}))

    def write(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / (IDENTITY_FILE + ".tmp")
        tmp.write_text(
            json.dumps(
                {"name": self.name, "fingerprint": self.fingerprint, "fields": self.fields, "spec": self.spec}, indent=1
            )
        )
        tmp.rename(root / IDENTITY_FILE)

    def differences(self, other: Identity) -> list[str]:
        """'spec.x: old -> new' for each trained field that differs."""
        keys = sorted(set(self.fields) | set(other.fields))
        return [
            f"{k} {self.fields.get(k)!r} -> {other.fields.get(k)!r}"
            for k in keys
            if self.fields.get(k) != other.fields.get(k)
        ]


def record(root: Path) -> bytes | None:
    """The job record's bytes as they are now (None: there is none), to notice a change while the job runs."""
    path = root / IDENTITY_FILE
    return path.read_bytes() if path.is_file() else None


FIX = "fix: give --out a new folder, or pass --restart to delete them and start over"


def resume_problem(root: Path, out: Path, mine: Identity) -> str | None:
    """Why this job must not run into `root` (checkpoints) and `out` (metrics), or None when it may."""
    theirs = Identity.read(root)
    steps = checkpoint.complete_steps(root)
    if theirs is None:
        if steps:
            return (
                f"{root} holds checkpoints (up to step {steps[-1]}) without a job record ({IDENTITY_FILE}), "
                f"so they cannot be matched to job {mine.name!r} ({FIX})"
            )
        if (out / "metrics.jsonl").is_file():
            return (
                f"{out} holds the metrics.jsonl of an earlier run that cannot be matched to job {mine.name!r} ({FIX})"
            )
        return None
    upto = f" (up to step {steps[-1]})" if steps else ""
    if theirs.name != mine.name:
        return f"{root} holds the checkpoints of job {theirs.name!r}{upto}, not of {mine.name!r} ({FIX})"
    diff = theirs.differences(mine)
    if diff:
        shown = "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
        return f"{root} holds checkpoints of job {mine.name!r}{upto} trained with other settings: {shown} ({FIX})"
    return None


def clear(root: Path, out: Path) -> list[str]:
    """--restart: remove the checkpoints, the job record and the run's own output files; returns what went."""
    gone = []
    for step in sorted(p for p in root.glob("step_*") if p.is_dir()) if root.is_dir() else []:
        shutil.rmtree(step)
        gone.append(str(step))
    for path in [root / IDENTITY_FILE, *(out / name for name in OUTPUT_ARTEFACTS)]:
        if path.is_dir():
            shutil.rmtree(path)
            gone.append(str(path))
        elif path.exists():
            path.unlink()
            gone.append(str(path))
    return gone
