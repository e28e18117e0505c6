"""The driver's side of spec.rollout.async: prompt batches queued at the rollout role, taken in order.

The rollout role (`kuberl.workers.rollout`) generates the tickets sent to it one after another, apart from the
step. The driver keeps maxStaleness of them queued beyond the one it waits for (none past the run's last step), so
that the rollout never waits for the trainer, and no batch can lag more than maxStaleness versions;
`StalenessGate` drops one that does (after a rollout worker's restart, for instance) and counts it. A restarted
rollout worker gets the newest pushed weights before anything else (`Roles.on_restart`), and generates nothing
before them; a ticket that its predecessor took with it comes back as None and is counted as lost.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kuberl.controller.roles import Roles
from kuberl.data.batch import Batch
from kuberl.data.prompts import Prompts
from kuberl.rollout.versions import StalenessGate
from kuberl.spec import JobSpec


@dataclass
class Ticket:
    """Prompts sent to the rollout role: its number, the prompt batch, the data position before it was drawn."""

    number: int
    prompts: Batch
    data_before: dict[str, int]


class AsyncRollout:
    """The queue of tickets at the rollout role, the weights pushed to it, and the gate batches pass."""

    def __init__(self, spec: JobSpec, roles: Roles, prompts: Prompts):
        self.spec, self.roles, self.prompts = spec, roles, prompts
        self.depth = spec.rollout.async_.max_staleness  # tickets queued beyond the one being waited for
        self.gate = StalenessGate(spec.rollout.async_.max_staleness)
        self.pending: deque[Ticket] = deque()
        self.next_ticket = 0
        self.version = 0  # of the weights pushed last
        roles.on_restart.append(self._restarted)

    def start(self, trained: int) -> None:
        """Push the actor's weights (version `trained`) and fill the queue; tickets are numbered from there."""
        self.next_ticket = trained
        self.push(trained)
        self._fill(self.spec.trainer.steps - trained)

    def push(self, version: int) -> None:
        """The actor's weights after update `version`, to every rollout rank (applied as partial says)."""
        self.version = version
        self.roles.rollout.push_weights(self.roles.actor.policy_weights()[0], version)

    def _restarted(self, rec) -> None:
        """A role restarted (`Roles.on_restart`): a new rollout worker gets the newest weights first."""
        if rec.role == "rollout":
            self.push(self.version)

    def take(self, trained: int) -> Batch:
        """The oldest queued ticket fresh enough for a trainer at version `trained`: its prompts with its rollout
        (responses, masks, rollout_logprobs, token_versions); the queue refilled before each wait, for the steps
        after this one only."""
        steps = self.spec.trainer.steps
        while True:
            if not self.pending:  # every queued ticket was lost or dropped: this step still needs one
                self._fill(steps - trained)
            ticket = self.pending.popleft()
            self._fill(steps - trained - 1)
            parts = self.roles.rollout.collect(ticket.number)
            if any(p is None for p in parts):  # its worker died with it (the new one got the weights on restart)
                self.gate.count_lost(len(ticket.prompts))
                continue
            out = Batch.concat(parts)
            if self.gate.admit(out["token_versions"], out["response_mask"], trained):
                return ticket.prompts.update(out)

    def data_before(self, otherwise: Callable[[], dict[str, int]]) -> dict[str, int]:
        """The data position before the oldest queued prompts (a resume draws them again); `otherwise()` if none."""
        return self.pending[0].data_before if self.pending else otherwise()

    def _fill(self, needed: int) -> None:
        """Queue tickets up to the depth, and no more than the `needed` steps still to take one."""
        while len(self.pending) < min(self.depth, needed):
            data_before = self.prompts.state_dict()
            batch = self.prompts.next_batch()
            number, self.next_ticket = self.next_ticket, self.next_ticket + 1
            seed = self.spec.trainer.seed * 100_003 + number
            self.roles.rollout.submit(batch.select("prompt_ids", "prompt_mask"), number, seed)
            self.pending.append(Ticket(number, batch, data_before))
