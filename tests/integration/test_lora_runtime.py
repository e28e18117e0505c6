"""LoRA through the runtime on CPU: the quickstart learns with adapters only, the actor with its adapters
off is the reference policy, and `kuberl export` merges the adapter or writes it apart."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from kuberl.controller.proxies import ActorProxy, RefProxy
from kuberl.metrics import read_jsonl
from kuberl.resilience import checkpoint
from kuberl.run import run_job
from kuberl.training import lora
from kuberl.training.export import export_policy
from kuberl.workers.groups import LocalWorkerGroup

from .conftest import load_example
from .test_offload import train_batch

LORA = {"rank": 16, "alpha": 32, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                   "down_proj"]}

KEYS = ("input_ids", "attention_mask", "responses", "response_mask", "old_logprobs", "advantages")


def lora_job(spec: dict = LORA, lr: float = 0.02, **overrides):
    return load_example("quickstart.yaml", **{"roles.actor.lora": spec, "roles.critic.lora": spec,
                                              "roles.actor.optim.lr": lr, "roles.critic.optim.lr": lr, **overrides})


def test_actor_with_adapters_off_is_the_reference_policy(netns):
    """After updates the adapted actor differs from the base, and its adapters-off log-probs are the ref
    role's (same base weights); the ref role can then be off: the library serves ref from the actor."""
    spec = lora_job(**{"trainer.miniBatchSize": 8, "trainer.microBatchSize": 4, "data.batchSize": 16}).spec
    actor_g, ref_g = LocalWorkerGroup("actor", spec, "cpu"), LocalWorkerGroup("ref", spec, "cpu")
    actor_g.start()
    ref_g.start()
    try:
        actor, ref = ActorProxy(actor_g), RefProxy(ref_g)
        batch = train_batch(spec, actor)
        for s in range(3):
            actor.update(batch.select(*KEYS), step=s)
        seqs = batch.select("input_ids", "attention_mask", "responses")
        from_actor = RefProxy(actor_g).compute_ref_logprobs(seqs)["ref_logprobs"]
        from_ref = ref.compute_ref_logprobs(seqs)["ref_logprobs"]
        torch.testing.assert_close(from_actor, from_ref, rtol=1e-5, atol=1e-5)
        adapted = actor.generate(batch.select("prompt_ids", "prompt_mask"), seed=1)
        assert not torch.allclose(adapted["old_logprobs"], from_ref)  # the adapters changed the policy
    finally:
        actor_g.shutdown()
        ref_g.shutdown()


def test_quickstart_learns_with_lora_and_exports(netns, tmp_path):
    """examples/quickstart-lora.yaml (LoRA on actor and critic; embeddings, norms and the adapted layers'
    biases trained too; alpha = rank; 64 prompts a step) gains >= 0.2 (docs/performance.md, "LoRA on the CPU
    quickstart": with the adapters drawn from the seed, seeds 0 to 7 and 13 gain +0.40 to +0.87; seed 0, the
    test's: +0.624); export
    merges the adapters or writes them apart, to the same model."""
    job = load_example("quickstart-lora.yaml")
    run_job(job, tmp_path, backend="local", progress=False, export=False)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    first = sum(r["reward_mean"] for r in rows[:10]) / 10
    last = sum(r["reward_mean"] for r in rows[-10:]) / 10
    print(f"quickstart with LoRA reward first10={first:.3f} last10={last:.3f} gain={last - first:.3f}")
    assert "kl" in rows[-1]
    merged, apart = tmp_path / "merged", tmp_path / "apart"
    root, name = checkpoint.root_for(job.spec, tmp_path), job.metadata.name
    step = export_policy(root, name, job.spec, merged)
    assert export_policy(root, name, job.spec, apart, adapter="separate") == step
    config = json.loads((apart / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == job.spec.roles.actor.lora.rank
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    m = AutoModelForCausalLM.from_pretrained(merged)
    base = AutoModelForCausalLM.from_pretrained(apart)
    assert not any(lora.is_adapter(k) for k in m.state_dict())
    lora.apply_lora(base, job.spec.roles.actor.lora)
    from safetensors.torch import load_file

    tensors = load_file(str(apart / "adapter" / "adapter_model.safetensors"))
    base.load_state_dict({k.removeprefix("base_model.model.").removesuffix(".weight"): v
                          for k, v in tensors.items()}, strict=False)
    torch.testing.assert_close(m(ids).logits, base(ids).logits, rtol=1e-4, atol=1e-4)
    with pytest.raises(AssertionError):
        with lora.adapters_off(base):
            torch.testing.assert_close(m(ids).logits, base(ids).logits, rtol=1e-4, atol=1e-4)
    assert last - first >= 0.2  # last: the export checks above run whatever the gain
