"""A role of one's own: a rule engine that checks each response against rules from the spec.

Three steps, as for any extra role:

1. the worker class (below): a `kuberl.workers.Worker` whose methods carry `@register(Dispatch...)`;
2. the spec entry (examples/remax.yaml)::

       roles:
         extra:
           rules:
             worker: examples.rule_engine:RuleEngineWorker
             replicas: 1
             resources: {cpu: 250m, memory: 1Gi}
             maxRestarts: 2
             config:
               rules:
                 - {name: no-digits, pattern: "[0-9]", penalty: 0.5}

3. a call from a control flow: ``roles.proxy("rules", RuleEngine).penalties(batch)`` (examples/remax.py).

The role gets its own WorkerGroup and placement group, is restarted alone when it fails, and has
its own status, in `kuberl run` and in the operator's RayCluster (a worker group named `rules`).
"""

from __future__ import annotations

import re

import torch

from kuberl.controller.proxies import RoleProxy, remote
from kuberl.data.batch import Batch
from kuberl.training.sequence import decode_responses
from kuberl.workers import Worker
from kuberl.workers.dispatch import Dispatch, register


class RuleEngineWorker(Worker):
    """`config.rules`: a list of {name, pattern (a regular expression), penalty (default 1)}; a response
    breaks a rule when the pattern occurs in its text."""

    def setup(self) -> None:
        rules = self.role_spec.config.get("rules", [])
        self.rules = [(r["name"], re.compile(r["pattern"]), float(r.get("penalty", 1.0))) for r in rules]

    @register(Dispatch.SPLIT)
    def penalties(self, batch: Batch) -> Batch:
        """penalties [B] (float32, >= 0): the summed penalty of the rules each response breaks; meta
        `broken_rules`: their names. Reads responses [B, R] and response_mask [B, R]."""
        texts = decode_responses(self.tokenizer, batch["responses"], batch["response_mask"])
        broken = [[name for name, pattern, _ in self.rules if pattern.search(t)] for t in texts]
        cost = {name: penalty for name, _, penalty in self.rules}
        values = [sum(cost[name] for name in names) for names in broken]
        return Batch({"penalties": torch.tensor(values, dtype=torch.float32)}, {"broken_rules": broken})


class RuleEngine(RoleProxy):
    """The rule engine's typed proxy: `rules.penalties(batch)`, or `rules.penalties.submit(batch)`."""

    penalties = remote(RuleEngineWorker.penalties)
