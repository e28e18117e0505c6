"""LoRA (Hu et al. 2021) on the linear layers of a transformer: `W x + (alpha / r) B A dropout(x)`.

Our own small layer, not `peft`: a `LoRALinear` is an `nn.Linear` (its `weight` and `bias` keep their
names, so the rollout engine, the checkpoint and export keep reading Hugging Face names) with two
extra parameters `lora_A` [r, in] and `lora_B` [out, r] (B starts at zero: the adapted model starts as
the base model). Applied before FSDP2 shards the model; FSDP2 shards frozen and trainable parameters
of one unit together and reduces gradients of the trainable ones only. `adapters(model, False)` turns
every adapter off, which gives the base model (the reference policy) from the same weights.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from kuberl.spec.model import LoraSpec

A, B = "lora_A", "lora_B"


class LoRALinear(nn.Linear):
    """An nn.Linear plus a low-rank update; `enabled` switches the update off (the base layer alone)."""

    @classmethod
    def wrap(cls, base: nn.Linear, rank: int, alpha: float, dropout: float,
             generator: torch.Generator | None = None) -> LoRALinear:
        """A LoRALinear that shares `base`'s weight and bias (no copy); `generator` (a CPU one) draws A."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = base.in_features, base.out_features
        layer.weight, layer.bias = base.weight, base.bias
        dev, dt = base.weight.device, base.weight.dtype
        a = torch.empty(rank, base.in_features, dtype=dt)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        layer.lora_A = nn.Parameter(a.to(dev))
        layer.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=dev, dtype=dt))
        layer.scaling, layer.enabled = alpha / rank, True
        layer.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        out = super().forward(x)
        if not self.enabled:
            return out
        return out + (self.dropout(x) @ self.lora_A.t().to(x.dtype)) @ self.lora_B.t().to(x.dtype) * self.scaling


def apply_lora(model: nn.Module, spec: LoraSpec, trainable: tuple[str, ...] = (), seed: int = 0) -> int:
    """Replace every nn.Linear whose name ends in one of `spec.target_modules` by a LoRALinear and
    freeze everything but the adapters, the modules named by `spec.train_modules`, the biases `spec.bias`
    names (those of the adapted layers, or all) and the parameters whose names start with one of
    `trainable` (e.g. the critic's value head). The adapters' A matrices are drawn from `seed`, in layer
    order: every run and every rank of a job starts from the same adapters. Returns the number of layers adapted."""
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in spec.target_modules]
    generator = torch.Generator().manual_seed(seed)
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear.wrap(linear, spec.rank, spec.alpha, spec.dropout, generator))
    for name, p in model.named_parameters():
        module = name.rsplit(".", 2)[-2] if name.count(".") else ""
        full = name.startswith(trainable) or module.endswith(tuple(spec.train_modules))
        p.requires_grad_(is_adapter(name) or bool(full) or trains_bias(name, module, spec))
    return len(targets)


def trains_bias(name: str, module: str, spec: LoraSpec) -> bool:
    """Whether parameter `name` (of the module named `module`, its last part) is a bias `spec.bias` trains."""
    if not name.endswith(".bias") or spec.bias == "none":
        return False
    return spec.bias == "all" or module in spec.target_modules


def is_adapter(name: str) -> bool:
    """Whether a parameter name (a state-dict key) is a LoRA adapter's."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf in (A, B)


def adapter_layers(model: nn.Module) -> Iterator[LoRALinear]:
    return (m for m in model.modules() if isinstance(m, LoRALinear))


@contextmanager
def adapters_off(model: nn.Module):
    """The base model inside the block (every adapter off), the adapted one again after it."""
    layers = list(adapter_layers(model))
    for m in layers:
        m.enabled = False
    try:
        yield model
    finally:
        for m in layers:
            m.enabled = True


def merge(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A full state dict with adapters -> the base model's names only, each adapted weight
    W + scaling * B @ A (in float32, cast back to W's dtype). Other entries are passed through."""
    out = {k: v for k, v in state.items() if not is_adapter(k)}
    for key in state:
        if key.endswith("." + A):
            prefix = key[: -len(A)]
            w = out[prefix + "weight"]
            delta = state[prefix + B].float() @ state[key].float()
            out[prefix + "weight"] = (w.float() + scaling * delta.to(w.device)).to(w.dtype)
    return out


def adapter_only(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if is_adapter(k)}


def fold(model: nn.Module, merge: bool = True) -> nn.Module:
    """Replace every LoRALinear by a plain nn.Linear, in place: with `merge` its weight becomes
    W + scaling * B @ A (the adapted layer), without it the base layer alone. Returns `model`."""
    for name, m in list(model.named_modules()):
        if not isinstance(m, LoRALinear):
            continue
        plain = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
        with torch.no_grad():
            if merge:
                m.weight += (m.scaling * (m.lora_B.float() @ m.lora_A.float())).to(m.weight.dtype)
        plain.weight, plain.bias = m.weight, m.bias
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, plain)
    return model


def write_adapter(model: nn.Module, spec: LoraSpec, out: Path, base: str) -> None:
    """The adapters as a PEFT-style LoRA folder: adapter_model.safetensors (keys
    base_model.model.<module>.lora_A.weight [r, in] / lora_B.weight [out, r], and with `spec.bias` the
    trained biases as base_model.model.<module>.bias, as PEFT writes them) and adapter_config.json."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    tensors = {f"base_model.model.{k.rsplit('.', 1)[0]}.{k.rsplit('.', 1)[1]}.weight": v.detach().contiguous()
               for k, v in adapter_only(state).items()}
    tensors |= {f"base_model.model.{k}": v.detach().contiguous() for k, v in state.items()
                if trains_bias(k, k.rsplit(".", 2)[-2] if k.count(".") else "", spec)}
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.rank, "lora_alpha": spec.alpha,
              "lora_dropout": spec.dropout, "target_modules": list(spec.target_modules), "bias": spec.bias,
              "base_model_name_or_path": base}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1))
