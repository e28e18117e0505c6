"""`kuberl export RUN_DIR [--step N] --out DIR`: a checkpoint's policy as a Hugging Face model folder.

    DIR/config.json, model.safetensors, generation_config.json, tokenizer files, kuberl_export.json

The actor's checkpoint is torch DCP, sharded by whatever world size wrote it; DCP reads it back in one
process (no process group) into a plain model of the job's architecture, so any checkpoint exports the
same way. The result loads with `AutoModelForCausalLM.from_pretrained(DIR)` (and vLLM).

The steps, each its own function:
    policy_state(actor_dir, model)  DCP "model" entries -> the model's parameters
    with LoRA (spec.roles.actor.lora): the checkpoint holds the adapters only, read into the job's
        base model with its adapters; `--adapter merge` (default) folds each pair into its base weight,
        W + (alpha / r) B A (`lora.fold`); `--adapter separate` writes the base model and, in DIR/adapter,
        the adapter as a PEFT-style folder (adapter_config.json + adapter_model.safetensors)
    write_folder(model, tokenizer, spec, out)
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from kuberl.resilience import checkpoint
from kuberl.resilience.identity import IDENTITY_FILE, Identity
from kuberl.spec import JobSpec
from kuberl.training import lora


class ExportError(ValueError):
    """Nothing to export where asked; the message names the fix."""


def checkpoint_root(run_dir: Path) -> Path:
    """The checkpoint folder of a run: RUN_DIR itself (a checkpoint path) or RUN_DIR/checkpoints."""
    for root in (run_dir, run_dir / "checkpoints"):
        if (root / IDENTITY_FILE).is_file():
            return root
    raise ExportError(
        f"{run_dir}: no job record ({IDENTITY_FILE}) in it or in its checkpoints/ folder "
        "(fix: give the --out folder of a `kuberl run`, or its spec.trainer.checkpoint.path)"
    )


def pick_step(root: Path, step: int | None) -> int:
    steps = checkpoint.complete_steps(root)
    if not steps:
        raise ExportError(f"{root}: no complete checkpoint (fix: run the job until its first checkpoint)")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ExportError(f"--step {step}: no complete checkpoint of that step in {root} (have: {steps})")
    return step


def build_model(spec: JobSpec):
    """A fresh causal LM of the job's architecture on CPU, in float32 (its weights are overwritten)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from kuberl.training.models import load_causal_lm, model_location

    if spec.model.builtin:  # the seed the actor built it with: a LoRA checkpoint holds no base weights
        return load_causal_lm(spec.model, seed=spec.trainer.seed)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_location(spec.model)))


def policy_state(actor_dir: Path, model) -> None:
    """Read the checkpoint's policy weights (the DCP entry "model", written at any world size) into `model`."""
    from kuberl.resilience import dcp_reader

    if not (actor_dir / ".metadata").is_file():
        raise ExportError(
            f"{actor_dir}: no DCP checkpoint here (on Kubernetes without "
            "spec.trainer.checkpoint.volumeClaim the actor's shards stay inside its pods)"
        )
    adapted = any(lora.is_adapter(k) for k in model.state_dict())
    full = model.state_dict()
    try:
        if adapted:  # the checkpoint holds what trained (adapters, spec.roles.actor.lora.trainModules) only
            meta = dcp_reader.read_metadata(actor_dir / ".metadata").state_dict_metadata
            full = {k: v for k, v in full.items() if f"model.{k}" in meta}
        state = {"model": full}
        with warnings.catch_warnings():  # this load is meant to run in one process: say nothing about it
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
            dcp_reader.load(state, actor_dir, no_dist=True)
    except dcp_reader.CheckpointRefused as exc:
        raise ExportError(str(exc)) from None
    model.load_state_dict(state["model"], strict=not adapted)
    model.tie_weights()


def write_folder(model, tokenizer, spec: JobSpec, out: Path, dtype: str) -> None:
    """config.json, model.safetensors, generation_config.json and the tokenizer into `out`."""
    import torch

    model = model.to({"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]).eval()
    gen, roll = model.generation_config, spec.rollout
    gen.pad_token_id, gen.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    gen.do_sample, gen.temperature, gen.top_p = True, roll.temperature, roll.top_p
    gen.max_new_tokens = roll.max_new_tokens
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one small folder: no "Writing model shards" bar
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)


def export(run_dir: Path, out: Path, step: int | None = None, dtype: str | None = None,
           adapter: str = "merge") -> int:
    """Export the policy of `step` (default: the newest complete checkpoint) of the run at `run_dir`
    into `out`, with the spec its job record holds; returns the step exported."""
    root = checkpoint_root(run_dir)
    ident = Identity.read(root)
    return export_policy(root, ident.name, JobSpec.model_validate(ident.spec), out, step, dtype, adapter)


def export_policy(root: Path, name: str, spec: JobSpec, out: Path, step: int | None = None,
                  dtype: str | None = None, adapter: str = "merge") -> int:
    """Export job `name`'s policy from its checkpoint folder `root` into `out`; returns the step exported.
    `adapter` (a LoRA actor only): "merge" folds the adapters into the weights, "separate" writes the
    base model into `out` and the adapter into `out`/adapter."""
    from kuberl.training.models import load_tokenizer

    step = pick_step(root, step)
    model = build_model(spec)
    spec_lora = spec.roles.actor.lora
    if spec_lora.enabled:
        lora.apply_lora(model, spec_lora)
    policy_state(checkpoint.step_dir(root, step) / "actor", model)
    dtype = dtype or spec.model.dtype
    if spec_lora.enabled and adapter == "separate":
        lora.write_adapter(model, spec_lora, out / "adapter", base=spec.model.hub or spec.model.path or str(out))
        lora.fold(model, merge=False)
    elif spec_lora.enabled:
        lora.fold(model)
    write_folder(model, load_tokenizer(spec.model), spec, out, dtype)
    record = {"job": name, "fingerprint": Identity.of(name, spec).fingerprint, "step": step, "checkpoint": str(root)}
    (out / "kuberl_export.json").write_text(json.dumps(record, indent=1))
    return step


def cmd_export(args) -> int:
    """`kuberl export`: one line on success, one `error:` line on failure."""
    try:
        step = export(Path(args.run_dir), Path(args.out), args.step, args.dtype, args.adapter)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"exported step {step} of {args.run_dir} to {args.out} (load it with "
        f"AutoModelForCausalLM.from_pretrained({str(args.out)!r}))"
    )
    return 0
