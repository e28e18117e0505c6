"""`vllm` rollout: vLLM's offline `LLM` engine, fed with the actor's weights after each update.

UNVERIFIED HERE. vLLM cannot be installed in this project's environment (its wheels pin a
different torch than the runtime's), so this engine is written against vLLM's public API (the V1
engine's `LLM`, `SamplingParams`, `collective_rpc`) and its unit tests skip unless `vllm` imports;
it has not run. What it relies on:

* `vllm.LLM(model=..., tensor_parallel_size=..., gpu_memory_utilization=..., dtype=..., seed=...,
  max_model_len=..., worker_extension_cls=...)` and `LLM.generate(prompts, sampling_params)` with
  token-id prompts (`{"prompt_token_ids": [...]}`) and one `SamplingParams` per prompt; outputs come
  back in input order.
* Weight sync by vLLM's documented RLHF path: a *worker extension* class (named by its qualified
  name, mixed into every vLLM worker) whose method calls the vLLM model's
  `load_weights(iterable of (hf_name, tensor))`, invoked on all workers with
  `LLM.collective_rpc(method_name, args=...)`. vLLM's loader maps HF names (q/k/v, gate/up ->
  fused, tied lm_head) and shards each full tensor for its tensor-parallel rank. Tensors travel to
  the workers by value, on CPU, in buckets of `SYNC_BUCKET_BYTES`; a CUDA-IPC / NCCL path would be
  faster and is future work. After a sync the prefix cache is reset: KV blocks computed with the
  old weights must not be reused.

Built-in models (`spec.model.builtin`) exist only in code: vLLM needs a directory, so the built-in
model (seeded, identical to the actor's initial weights) and its character tokenizer are written
with `save_pretrained` to a temporary directory that lives as long as the engine. vLLM is started
with `skip_tokenizer_init=True` all the same: prompts go in as token ids, responses come out as
token ids (`detokenize=False`), EOS stops via `stop_token_ids` from the runtime's tokenizer, and
reloading the saved character tokenizer with `AutoTokenizer` next to a qwen2 `config.json` yields a
`Qwen2Tokenizer` that tokenizes differently (it drops spaces).

Not done: sleep mode (`enable_sleep_mode` + `LLM.sleep()/wake_up()`) to free the KV cache during
training; the KV cache share is `spec.rollout.gpuMemoryUtilization`, sized to sit beside the FSDP
actor on the same GPU. tensorParallelSize > 1 needs the vLLM workers to see that many GPUs, which a
one-GPU actor rank does not.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from ..spec import JobSpec

SYNC_BUCKET_BYTES = 512 << 20
EXTENSION = f"{__name__}.KuberlWorkerExtension"


class KuberlWorkerExtension:
    """Mixed into each vLLM worker (`worker_extension_cls`); runs in the worker process."""

    def kuberl_load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        device = self.device  # type: ignore[attr-defined]
        loaded = self.model_runner.model.load_weights(weights=[(n, t.to(device)) for n, t in weights])  # type: ignore[attr-defined]
        return len(loaded) if loaded is not None else len(weights)


def _import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise RuntimeError(
            f"spec.rollout.engine: vllm is not installed in this runtime ({exc}) "
            "(fix: use engine hf or the CUDA runtime image, which installs vLLM)"
        ) from None
    return vllm


class VLLMRollout:
    """RolloutEngine on vLLM. Prompts [B,P] left-padded -> responses [B,R] right-padded with pad."""

    def __init__(self, spec: JobSpec, tokenizer):
        vllm = _import_vllm()
        self.spec, self.tok = spec, tokenizer
        self._SamplingParams = vllm.SamplingParams
        self._tmp: Any = None
        model = self._model_dir()
        r = spec.rollout
        self.llm = vllm.LLM(
            model=model,
            tensor_parallel_size=r.tensor_parallel_size,
            gpu_memory_utilization=r.gpu_memory_utilization,
            dtype=spec.model.dtype,
            seed=spec.trainer.seed,
            max_model_len=spec.data.max_prompt_length + r.max_new_tokens,
            worker_extension_cls=EXTENSION,
            skip_tokenizer_init=True,  # prompts are token ids and outputs stay ids: no tokenizer needed
        )

    def _model_dir(self) -> str:
        """A path or hub id vLLM can load; built-ins are saved to a temporary directory first."""
        src = self.spec.model
        if not src.builtin:
            return src.path or src.hub
        from ..models import load_causal_lm

        dtype = getattr(torch, self.spec.model.dtype)
        self._tmp = tempfile.TemporaryDirectory(prefix=f"kuberl-vllm-{src.builtin}-")
        load_causal_lm(src, dtype=dtype, seed=self.spec.trainer.seed).save_pretrained(self._tmp.name)
        self.tok.save_pretrained(self._tmp.name)
        return self._tmp.name

    def _sampling_params(self, seed: int):
        r = self.spec.rollout
        return self._SamplingParams(
            n=1,
            temperature=r.temperature,
            top_p=r.top_p,
            max_tokens=r.max_new_tokens,
            ignore_eos=r.fixed_length,
            stop_token_ids=None if r.fixed_length or self.tok.eos_token_id is None else [self.tok.eos_token_id],
            seed=seed,
            detokenize=False,
        )

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, value in state_dict.items():
            t = value.detach().to("cpu").contiguous()
            bucket.append((name, t))
            size += t.numel() * t.element_size()
            if size >= SYNC_BUCKET_BYTES:
                self.llm.collective_rpc("kuberl_load_weights", args=(bucket,))
                bucket, size = [], 0
        if bucket:
            self.llm.collective_rpc("kuberl_load_weights", args=(bucket,))
        self.llm.reset_prefix_cache()

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, seed: int) -> torch.Tensor:
        R, pad = self.spec.rollout.max_new_tokens, self.tok.pad_token_id
        ids, mask = input_ids.cpu(), attention_mask.cpu().bool()
        prompts = [{"prompt_token_ids": row[m].tolist()} for row, m in zip(ids, mask)]
        # One seed per sample: GRPO repeats each prompt groupSize times, and a shared seed would
        # give every copy the same response (zero advantage). Seeds come from a generator so that
        # consecutive steps (seed, seed + 1) do not reuse each other's per-sample streams.
        gen = torch.Generator().manual_seed(seed)
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=gen).tolist()
        outputs = self.llm.generate(prompts, [self._sampling_params(s) for s in seeds], use_tqdm=False)
        responses = torch.full((len(prompts), R), pad, dtype=torch.long)
        for i, out in enumerate(outputs):
            tokens = list(out.outputs[0].token_ids)[:R]
            if tokens:
                responses[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        return responses
