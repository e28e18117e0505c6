"""kuberl.training.lora: the adapter layer, adapters off (the reference policy), folding, and an FSDP2 trainer
whose checkpoints hold the adapters and their optimizer state only."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from kuberl.spec.model import LoraSpec
from kuberl.training import lora

SPEC = LoraSpec(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])


def small_lm() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, use_cache=False).logits


def perturbed(model) -> None:
    """Non-zero B (a trained adapter), so that the adapted model differs from the base."""
    with torch.no_grad():
        for m in lora.adapter_layers(model):
            m.lora_B.normal_(0, 0.5)


IDS = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(3))


def test_the_adapters_are_drawn_from_the_seed() -> None:
    """Same seed, same A in every layer, whatever the global RNG holds (runs and ranks of a job agree);
    another seed, other adapters."""
    def adapters(seed: int) -> list[torch.Tensor]:
        model = small_lm()
        torch.manual_seed(seed + 100)  # the global RNG must not matter
        lora.apply_lora(model, SPEC, seed=seed)
        return [m.lora_A.detach().clone() for m in lora.adapter_layers(model)]

    first, again, other = adapters(1), adapters(1), adapters(2)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    assert not torch.equal(first[0], first[1])  # each layer draws its own


def test_apply_keeps_names_freezes_the_base_and_starts_as_the_base() -> None:
    base = small_lm()
    model = copy.deepcopy(base)
    names = set(dict(base.named_parameters()))
    assert lora.apply_lora(model, SPEC) == 2 * 3
    adapted = dict(model.named_parameters())
    assert names <= set(adapted)  # base weights keep their Hugging Face names
    trainable = {n for n, p in adapted.items() if p.requires_grad}
    assert trainable == {n for n in adapted if lora.is_adapter(n)} and len(trainable) == 2 * 2 * 3
    torch.testing.assert_close(logits(model, IDS), logits(base, IDS))  # B = 0: the base model


def test_train_modules_train_in_full() -> None:
    model = small_lm()
    lora.apply_lora(model, SPEC.model_copy(update={"train_modules": ["norm"]}))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    norms = {n for n in trainable if not lora.is_adapter(n)}
    assert norms == {"model.norm.weight", *(f"model.layers.{i}.{k}.weight" for i in range(2)
                                             for k in ("input_layernorm", "post_attention_layernorm"))}


def test_bias_trains_the_adapted_layers_biases_or_all(tmp_path: Path) -> None:
    """bias: lora_only trains the biases of the adapted layers (Qwen2: q/k/v have one; here q and v are
    adapted), all trains every bias; the adapter file carries them under PEFT's names; the base is then
    no longer frozen (the actor cannot stand in for ref)."""
    from safetensors.torch import load_file

    def biases(bias: str) -> set[str]:
        model = small_lm()
        lora.apply_lora(model, SPEC.model_copy(update={"bias": bias}))
        return {n for n, p in model.named_parameters() if p.requires_grad and not lora.is_adapter(n)}

    per_layer = lambda *mods: {f"model.layers.{i}.self_attn.{m}.bias" for i in range(2) for m in mods}  # noqa: E731
    assert biases("none") == set()
    assert biases("lora_only") == per_layer("q_proj", "v_proj")
    assert biases("all") == per_layer("q_proj", "k_proj", "v_proj")
    spec = SPEC.model_copy(update={"bias": "lora_only"})
    model = small_lm()
    lora.apply_lora(model, spec)
    lora.write_adapter(model, spec, tmp_path, base="base")
    tensors = load_file(str(tmp_path / "adapter_model.safetensors"))
    in_file = {k for k in tensors if k.endswith(".bias")}
    assert in_file == {f"base_model.model.{n}" for n in per_layer("q_proj", "v_proj")}
    assert json.loads((tmp_path / "adapter_config.json").read_text())["bias"] == "lora_only"
    assert SPEC.base_frozen and not spec.base_frozen
    assert not SPEC.model_copy(update={"train_modules": ["norm"]}).base_frozen


def test_adapters_off_is_the_base_model_and_fold_is_the_adapted_one() -> None:
    base = small_lm()
    model = copy.deepcopy(base)
    lora.apply_lora(model, SPEC)
    perturbed(model)
    adapted = logits(model, IDS)
    assert not torch.allclose(adapted, logits(base, IDS))
    with lora.adapters_off(model):
        torch.testing.assert_close(logits(model, IDS), logits(base, IDS))
    torch.testing.assert_close(logits(model, IDS), adapted)  # on again after the block
    merged = lora.merge(model.state_dict(), SPEC.alpha / SPEC.rank)
    assert set(merged) == set(base.state_dict())
    plain = copy.deepcopy(base)
    plain.load_state_dict(merged)
    torch.testing.assert_close(logits(plain, IDS), adapted, rtol=1e-5, atol=1e-5)
    lora.fold(model)
    assert not list(lora.adapter_layers(model)) and set(model.state_dict()) == set(base.state_dict())
    torch.testing.assert_close(logits(model, IDS), adapted, rtol=1e-5, atol=1e-5)


def test_write_adapter_is_a_peft_style_folder(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = small_lm()
    lora.apply_lora(model, SPEC)
    lora.write_adapter(model, SPEC, tmp_path, base="base")
    tensors = load_file(str(tmp_path / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert len(tensors) == 12 and tensors[key].shape == (4, 32)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"


def test_trainer_trains_adapters_only_and_checkpoints_them_alone(one_rank_group, tmp_path: Path) -> None:
    """Under FSDP2 only the adapters change; the checkpoint holds adapters and their AdamW state only,
    and a fresh trainer loads it back to the same merged weights."""
    import torch.distributed.checkpoint as dcp

    from kuberl.training.trainer import FSDPTrainer

    def trainer() -> FSDPTrainer:
        return FSDPTrainer(small_lm(), torch.device("cpu"), torch.float32, lr=1e-2, weight_decay=0.0, grad_clip=1.0,
                           lora_spec=SPEC)

    t = trainer()
    before = t.full_state_dict()
    assert not any(lora.is_adapter(k) for k in before)
    opt = t.optimizer.optimizer
    for _ in range(3):
        logits(t.model, IDS).float().pow(2).mean().backward()
        t.optimizer.step()
        t.optimizer.zero_grad()
    after = t.full_state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.rsplit(".", 2)[-2] in SPEC.target_modules for k in changed)  # adapted layers only
    assert len(opt.state) == 12
    step = t.save(str(tmp_path / "ckpt"))
    t.saver.wait()  # the DCP writes run in the background
    keys = set(dcp.FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata)
    model_keys = {k for k in keys if k.startswith("model.")}
    assert model_keys and all(lora.is_adapter(k) for k in model_keys), sorted(model_keys)[:5]
    assert any(k.startswith("optim.state.") and "exp_avg" in k for k in keys)
    fresh = trainer()
    fresh.load(str(tmp_path / "ckpt"), step)
    for k, v in fresh.full_state_dict().items():
        torch.testing.assert_close(v, after[k], msg=k)
