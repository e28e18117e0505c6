"""FSDP2 CPU offload (spec.roles.<role>.offload) on CPU: the same training with and without it.

On CPU the parameters already live in host memory, so these tests check that every offload path
(FSDP2's CPUOffloadPolicy, the streamed optimizer-only AdamW, reshard-after-forward off) runs for real
under FSDP2 on gloo and computes the same updates; the GPU memory it saves is measured by
bench/train_step.py --offload on the H200 (docs/performance.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from kuberl.controller.driver import Driver
from kuberl.controller.proxies import ActorProxy, CriticProxy
from kuberl.spec import JobSpec
from kuberl.workers.groups import LocalWorkerGroup, RayWorkerGroup

from .conftest import load_example
from .probes import ProbedActor, Probes

OVERRIDES = {"trainer.ppoEpochs": 1, "trainer.miniBatchSize": 8, "trainer.microBatchSize": 4, "data.batchSize": 16}
VARIANTS = {
    "none": {},
    "params+optimizer": {"params": True, "optimizer": True},
    "optimizer": {"optimizer": True},
    "no-reshard": {"reshardAfterForward": False},
}


def spec_with(offload: dict, **overrides) -> JobSpec:
    return load_example("quickstart.yaml", **OVERRIDES, **overrides, **{"roles.actor.offload": offload,
                                                                         "roles.critic.offload": offload}).spec


def train_batch(spec: JobSpec, actor: ActorProxy):
    """A rollout batch of the quickstart's prompts with fixed advantages, values and returns."""
    batch = Driver(spec, "offload", Path("/tmp"), lambda r: None, progress=False).make_prompts()
    batch.update(actor.generate(batch.select("prompt_ids", "prompt_mask"), seed=1))
    g = torch.Generator().manual_seed(0)
    shape = batch["responses"].shape
    batch.tensors.update(advantages=torch.randn(shape, generator=g), values=torch.randn(shape, generator=g),
                         returns=torch.randn(shape, generator=g))
    return batch


def three_updates(offload: dict) -> tuple[list[dict], list[dict], dict]:
    """Actor and critic stats over 3 updates (2 optimizer steps each) on one gloo rank, and the actor's weights."""
    spec = spec_with(offload)
    actor_g = LocalWorkerGroup("actor", spec, "cpu", worker_cls=ProbedActor)
    critic_g = LocalWorkerGroup("critic", spec, "cpu")
    actor_g.start()
    critic_g.start()
    try:
        actor, critic = ActorProxy(actor_g), CriticProxy(critic_g)
        batch = train_batch(spec, actor)
        keys = ("input_ids", "attention_mask", "responses", "response_mask", "old_logprobs", "advantages")
        a = [actor.update(batch.select(*keys), step=s) for s in range(3)]
        c = [critic.update(batch.select(*keys[:4], "values", "returns"), step=s) for s in range(3)]
        if offload.get("optimizer") and not offload.get("params"):  # the moments live in (host) memory apart
            for st in actor_g.worker.trainer.optimizer.optimizer.state.values():
                assert isinstance(st["exp_avg"], DTensor) and st["exp_avg"]._local_tensor.device.type == "cpu"
        (weights,) = actor.call(Probes.full_state_dict)
        return a, c, weights
    finally:
        actor_g.shutdown()
        critic_g.shutdown()


@pytest.fixture(scope="module")
def baseline(netns):
    return three_updates({})


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "none"])
def test_offload_trains_like_no_offload(baseline, variant):
    """Losses, gradient norms and weights after 6 AdamW steps agree with the run without offload."""
    a0, c0, w0 = baseline
    a1, c1, w1 = three_updates(VARIANTS[variant])
    for s0, s1 in zip(a0, a1):
        assert s1["pg_loss"] == pytest.approx(s0["pg_loss"], rel=1e-4, abs=1e-6)
        assert s1["actor_grad_norm"] == pytest.approx(s0["actor_grad_norm"], rel=1e-4)
    for s0, s1 in zip(c0, c1):
        assert s1["vf_loss"] == pytest.approx(s0["vf_loss"], rel=1e-4, abs=1e-6)
    assert a1[-1]["pg_loss"] != a0[0]["pg_loss"]  # it trained
    for name in w0:
        torch.testing.assert_close(w1[name], w0[name], rtol=1e-4, atol=1e-5, msg=name)


def test_offload_on_two_sharded_ranks_matches_no_offload(ray_session):
    """CPUOffloadPolicy and the streamed AdamW on 2 gloo ranks (each holding half of every parameter)."""
    groups = {name: RayWorkerGroup("actor", spec_with(VARIANTS[name], **{"roles.actor.replicas": 2}),
                                   worker_cls=ProbedActor) for name in ("none", "params+optimizer", "optimizer")}
    for g in groups.values():
        g.start()
    try:
        proxies = {name: ActorProxy(g) for name, g in groups.items()}
        spec = groups["none"].spec
        batch = train_batch(spec, proxies["none"])
        keys = ("input_ids", "attention_mask", "responses", "response_mask", "old_logprobs", "advantages")
        stats = {name: [p.update(batch.select(*keys), step=s) for s in range(2)] for name, p in proxies.items()}
        weights = {name: p.call(Probes.full_state_dict)[0] for name, p in proxies.items()}
        for name in ("params+optimizer", "optimizer"):
            for s0, s1 in zip(stats["none"], stats[name]):
                assert s1["pg_loss"] == pytest.approx(s0["pg_loss"], rel=1e-4, abs=1e-6), name
            for key in weights["none"]:
                torch.testing.assert_close(weights[name][key], weights["none"][key], rtol=1e-4, atol=1e-5)
    finally:
        for g in groups.values():
            g.shutdown()
