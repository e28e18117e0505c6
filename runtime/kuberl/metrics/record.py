"""One typed record per training step: the only thing a control flow produces for its sinks.

`metrics.jsonl`, Prometheus, the progress bar and the operator's progress document are all written
from a `StepRecord` (see `kuberl.metrics` and `kuberl.metrics.progress`); nothing parses key names back.
`flat()` gives the JSONL object, with the keys users rely on (`reward_mean`, `kl`, `time_<phase>_s`,
`restarts_<role>`, `recovery_<role>_<part>_s`, `steps_lost_<role>`, `memory_<role>_<kind>_bytes`,
`worst_link_<role>`, ...). Every recovery of the step is kept, in order, under `recoveries`; the
flat per-role keys summarise them: seconds are summed over the step's recoveries of that role and
`steps_lost_<role>` is the largest loss. Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kuberl.spec.contract import Reason

RECOVERY_PARTS = ("detect", "ready", "replay", "total")


@dataclass
class Recovery:
    """One restart of one role: what failed, and how long each part of getting back took (seconds)."""

    role: str
    step: int  # the step in progress when the role failed
    phase: str
    reason: Reason
    detail: str
    detect_s: float  # from sending the call to seeing the failure
    ready_s: float = 0.0  # tearing down, recreating and restoring the role
    replay_s: float = 0.0  # the interrupted call, sent again
    steps_lost: int = 0  # completed steps of the role's trained state that the restore did not bring back
    restored_from: str = ""
    # a hang: role, rank, innermost frame, collective or user code (kuberl.resilience.hangs.summarize)
    diagnosis: str = ""
    standby: bool = False  # a warm standby took over (spec.resilience.standby), rather than a cold start
    in_flight: list[str] = field(default_factory=list)  # the phases of the role's calls in flight when it failed
    # (`phase` is the one whose wait noticed it: with two in flight, either may be)
    hosts: list[str] = field(default_factory=list)  # where its ranks run after it, in rank order (pods' hostnames)
    attempts: int = 1  # restarts it took (a recreate that failed again is retried, within maxRestarts)

    def summary(self) -> str:
        """One line for the operator's `lastFailure`: the reason, where, and the diagnosis or detail."""
        return f"{self.reason.value} at step {self.step} ({self.phase or 'no phase'}): {self.diagnosis or self.detail}"

    @property
    def total_s(self) -> float:
        return self.detect_s + self.ready_s + self.replay_s

    def seconds(self, part: str) -> float:
        """`part` is one of RECOVERY_PARTS."""
        return self.total_s if part == "total" else getattr(self, f"{part}_s")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "reason": self.reason.value, "total_s": self.total_s}


@dataclass
class Span:
    """One phase of one step on one role ("driver" for the driver's own work), in seconds from the
    step's start. A rollout generated ahead (spec.trainer.asyncRollout) starts before its step: < 0."""

    role: str
    phase: str
    start_s: float
    end_s: float

    def overlaps(self, other: Span, offset_s: float = 0.0) -> bool:
        """Whether the two spans share time; `offset_s`: `other`'s step started this much later."""
        return self.start_s < other.end_s + offset_s and other.start_s + offset_s < self.end_s


def uncovered_s(spans: list[Span], end_s: float) -> float:
    """Seconds of the step's [0, end_s] that no span covers: its "other" (time_other_s), where no named phase
    accounts for the wall clock."""
    covered = reach = 0.0
    for s in sorted(spans, key=lambda s: s.start_s):
        start, stop = max(s.start_s, reach), min(s.end_s, end_s)
        if stop > start:
            covered += stop - start
            reach = stop
    return max(0.0, end_s - covered)


@dataclass
class RoleStep:
    """One role in one step."""

    restarts: int = 0  # since the job began
    recoveries: list[Recovery] = field(default_factory=list)  # this step's, in order
    memory: dict[str, int] = field(default_factory=dict)  # rank 0's peak bytes by kind (gpu_peak, rss_peak)
    worst_link: str | None = None  # worst GPU link inside the role's groups (NV#, PIX, ..., SYS)
    topology_source: str | None = None  # where its ranks read the links: nvml, nvidia-smi (comma-joined), none
    last_failure: str | None = None  # the newest recovery's `Recovery.summary()` since the job began (this run)
    standby_ready: bool | None = None  # whether its warm standby can take over now; None: it keeps none
    replicas: int | None = None  # spec.roles.<role>.replicas its group runs (a live resize shows here)
    hosts: list[str] | None = None  # its ranks' hostnames, in rank order (in a cluster: the pods' names)

    def recovery_seconds(self, part: str) -> float:
        return sum(r.seconds(part) for r in self.recoveries)

    @property
    def steps_lost(self) -> int:
        return max((r.steps_lost for r in self.recoveries), default=0)


@dataclass
class StepRecord:
    """What one step did. Unset (None) fields are left out of `flat()`."""

    step: int
    reward_mean: float | None = None
    reward_std: float | None = None
    response_length_mean: float | None = None  # tokens
    stats: dict[str, float] = field(default_factory=dict)  # algorithm and update statistics: kl, pg_loss, ...
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase (rollout, reward, ...)
    step_s: float | None = None
    weight_sync_worker_s: float | None = None  # the slowest rank's copy into its rollout engine
    rollout_tokens_per_s: float | None = None  # generated tokens per second of generation
    train_tokens_per_s: float | None = None  # actor training tokens per second of update
    mfu: float | None = None
    mfu_peak_tflops: float | None = None
    n_params: int | None = None
    roles: dict[str, RoleStep] = field(default_factory=dict)
    timeline: list[Span] = field(default_factory=list)  # every phase's span, per role (kuberl.controller.schedule)
    start_s: float | None = None  # when the step began, seconds since this run's driver started
    staleness: int | None = None  # updates the policy had taken since the weights that generated the batch
    extra: dict[str, Any] = field(default_factory=dict)  # what hooks add (e.g. eval_reward_mean)

    def recoveries(self) -> list[Recovery]:
        return [r for rs in self.roles.values() for r in rs.recoveries]

    def flat(self) -> dict[str, Any]:
        """The `metrics.jsonl` object of this step."""
        out: dict[str, Any] = {"step": self.step}
        for key in ("reward_mean", "reward_std", "response_length_mean"):
            _put(out, key, getattr(self, key))
        out.update(self.stats)
        out.update({f"time_{phase}_s": s for phase, s in self.phases.items()})
        _put(out, "time_step_s", self.step_s)
        _put(out, "staleness", self.staleness)
        for key in ("weight_sync_worker_s", "rollout_tokens_per_s", "train_tokens_per_s", "mfu", "mfu_peak_tflops",
                    "n_params"):
            _put(out, key, getattr(self, key))
        for role, rs in self.roles.items():
            for kind, value in rs.memory.items():
                out[f"memory_{role}_{kind}_bytes"] = value
            if rs.worst_link:
                out[f"worst_link_{role}"] = rs.worst_link
                out[f"topology_source_{role}"] = rs.topology_source or "none"
            out[f"restarts_{role}"] = rs.restarts
            if rs.recoveries:
                for part in RECOVERY_PARTS:
                    out[f"recovery_{role}_{part}_s"] = rs.recovery_seconds(part)
                out[f"steps_lost_{role}"] = rs.steps_lost
        if self.recoveries():
            out["recoveries"] = [r.to_json() for r in self.recoveries()]
        if self.timeline:
            out["step_start_s"] = self.start_s
            out["timeline"] = [asdict(s) for s in self.timeline]
        out.update(self.extra)
        return out


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        out[key] = value
