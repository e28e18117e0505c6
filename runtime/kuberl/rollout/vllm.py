"""`vllm` rollout: vLLM's offline `LLM` engine on the actor's GPU, fed with the actor's weights after each update.

Written against vLLM 0.26.0 (the version that pins the device image's torch 2.11.0; see docs/performance.md
for where it ran). What it relies on, all public API of that version:

* The engine in its own process (vLLM's default, `VLLM_ENABLE_V1_MULTIPROCESSING=1`); in-process works
  too. Processes are started with `spawn`: this module sets `VLLM_WORKER_MULTIPROC_METHOD=spawn` unless
  the environment already names a method. vLLM's default is `fork` unless CUDA is already initialised,
  and a fork of a process that has run multi-threaded torch (the built-in model is built on the CPU
  before the engine starts) can deadlock in the child: seen once on the lent H200, a hang at start-up.
  `spawn` costs a fresh interpreter (about a second) and never inherits locks.
* Weight sync by CUDA IPC, through a worker extension (`vllm_worker.KuberlWorkerExtension`, mixed into
  vLLM's GPU worker via `worker_extension_cls`) called with `LLM.collective_rpc`: the actor casts its
  weights into one staging buffer on its GPU, bucket by bucket; the engine maps that buffer once and
  loads views of it with the model's own `load_weights` (HF names; q/k/v and gate/up are fused by vLLM's
  loader, tied embeddings handled there). Only handles and names cross the process boundary (`ipc.py`).
  Why not the alternatives vLLM 0.26.0 offers: tensors passed to `collective_rpc` arrive as lists in the
  multiprocessing mode (msgpack); its weight-transfer API's `ipc` backend needs pickled handles there
  (`VLLM_ALLOW_INSECURE_SERIALIZATION=1`), imports Ray at module level and re-runs layerwise weight
  processing on each update; its `nccl` backend needs a NCCL group between trainer and engine, and NCCL
  refuses two ranks on one GPU, which is exactly this layout (engine beside the actor).
  After a sync the prefix cache is reset (`reset_prefix_cache`): no KV block computed with old weights is
  reused. Every vLLM parameter must have been written by a full sync; a missing one is an error.
* Sleep mode (`enable_sleep_mode`, `spec.rollout.sleepMode`, default on): at the end of each `generate` the
  engine sleeps at level 2, returning its KV cache and weights to the GPU (the actor trains in that
  memory); the next `load_weights` wakes the weights, writes them, then wakes the KV cache. Level 2 (weights
  discarded, not offloaded) because every step overwrites them anyway; a `generate` that finds them
  discarded without a sync in between is an error. Evaluation's `greedy_answers` (temperature 0, up to EOS
  even under fixedLength) runs between a sync and the next rollout and leaves the engine awake for it.

Built-in models (`spec.model.builtin`) exist only in code: vLLM needs a directory, so the built-in model and
its character tokenizer are saved once per (shape, dtype) under the temporary directory
(kuberl-vllm-<uid>/), reused by later engines (and by vLLM's compile cache, which is keyed by the path);
their weights there are placeholders, which the actor's first sync replaces. vLLM is started with
`skip_tokenizer_init=True`: prompts go in as token ids, responses come out as token ids
(`detokenize=False`), EOS stops via `stop_token_ids` from the runtime's tokenizer.

tensorParallelSize > 1 needs the vLLM workers to see that many GPUs, which a one-GPU actor rank does not;
it was not run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from kuberl.spec import JobSpec

from .weight_sync import StagedSender

log = logging.getLogger(__name__)

SYNC_BUCKET_BYTES = 512 << 20
EXTENSION = "kuberl.rollout.vllm_worker.KuberlWorkerExtension"


def _import_vllm():
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # see the module docstring
    try:
        import vllm
    except ImportError as exc:
        raise RuntimeError(
            f"spec.rollout.engine: vllm is not installed in this runtime ({exc}) "
            "(fix: use engine hf or the CUDA runtime image, which installs vLLM)"
        ) from None
    return vllm


def builtin_model_dir(spec: JobSpec, tokenizer, device: torch.device | None) -> str:
    """A directory holding the built-in model (placeholder weights) and tokenizer; made once, then reused."""
    from kuberl.training.models import load_causal_lm

    src, dtype = spec.model, spec.model.dtype
    root = Path(tempfile.gettempdir()) / f"kuberl-vllm-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    if root.stat().st_uid != os.getuid():
        raise RuntimeError(f"{root} belongs to another user; remove it or set TMPDIR")
    target = root / f"{src.builtin}-{dtype}"
    if (target / ".complete").exists():
        return str(target)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".partial-"))
    init_on = device if device is not None and device.type == "cuda" else None  # fast; the first sync replaces them
    load_causal_lm(src, dtype=getattr(torch, dtype), seed=spec.trainer.seed, device=init_on).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / ".complete").touch()
    try:
        tmp.rename(target)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


class VLLMRollout:
    """RolloutEngine on vLLM. Prompts [B,P] left-padded -> responses [B,R] right-padded with pad."""

    def __init__(self, spec: JobSpec, tokenizer, device: torch.device | None = None,
                 sleep: bool | None = None, enforce_eager: bool = False):
        """`sleep` overrides spec.rollout.sleepMode and `enforce_eager` skips torch.compile and CUDA graphs
        (tests: a fast start)."""
        vllm = _import_vllm()
        self.spec, self.tok = spec, tokenizer
        self.device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        self._SamplingParams = vllm.SamplingParams
        r = spec.rollout
        self.sleep_mode = r.sleep_mode if sleep is None else sleep
        self.sleep_after_generate = self.sleep_mode  # benchmarks turn it off to time generation alone
        src = spec.model
        model = builtin_model_dir(spec, tokenizer, self.device) if src.builtin else (src.path or src.hub)
        t0 = time.perf_counter()
        self.llm = vllm.LLM(
            model=model,
            tensor_parallel_size=r.tensor_parallel_size,
            gpu_memory_utilization=r.gpu_memory_utilization,
            dtype=spec.model.dtype,
            seed=spec.trainer.seed,
            max_model_len=spec.data.max_prompt_length + r.max_new_tokens,
            worker_extension_cls=EXTENSION,
            skip_tokenizer_init=True,  # prompts are token ids and outputs stay ids: no tokenizer needed
            enable_prefix_caching=True,
            enable_sleep_mode=self.sleep_mode,
            enforce_eager=enforce_eager,
        )
        self.start_s = time.perf_counter() - t0
        workers = self.llm.collective_rpc("kuberl_worker_info")
        self.in_process = all(w["pid"] == os.getpid() for w in workers)
        expected = set(self.llm.collective_rpc("kuberl_param_names")[0])
        self.sender = StagedSender(self.llm.collective_rpc, self.device, getattr(torch, spec.model.dtype),
                                   self.in_process, expected, SYNC_BUCKET_BYTES)
        self._asleep = False
        self._logprobs: torch.Tensor | None = None
        self.last_sync: dict[str, float] = {}
        self.last_cached_tokens = 0

    # -- weight sync -------------------------------------------------------------------------------
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Write the actor's full weights (HF names, any dtype, any device) into the engine; wakes it if asleep."""
        t0 = time.perf_counter()
        was_asleep = self._asleep
        if was_asleep:
            self.llm.wake_up(tags=["weights"])
        t_wake = time.perf_counter()
        stats = self.sender.send(state_dict)
        t_load = time.perf_counter()
        if was_asleep:
            torch.cuda.empty_cache()  # the KV cache comes back into memory this process's allocator may hold
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vllm weight sync: the prefix cache could not be reset (requests still running)")
        t1 = time.perf_counter()
        self.last_sync = {**stats, "seconds": t1 - t0, "wake_weights_s": t_wake - t0,
                          "wake_kv_and_reset_s": t1 - t_load, "woke": float(was_asleep)}

    # -- generation --------------------------------------------------------------------------------
    def _sampling_params(self, seed: int, greedy: bool = False, fixed_length: bool | None = None):
        """`fixed_length` None: spec.rollout.fixedLength's (no stop at EOS when set)."""
        r = self.spec.rollout
        fixed = r.fixed_length if fixed_length is None else fixed_length
        return self._SamplingParams(
            n=1,
            temperature=0.0 if greedy else r.temperature,
            top_p=r.top_p,
            max_tokens=r.max_new_tokens,
            ignore_eos=fixed,
            stop_token_ids=None if fixed or self.tok.eos_token_id is None else [self.tok.eos_token_id],
            seed=seed,
            detokenize=False,
            logprobs=0,  # the drawn token's own log-prob (vLLM's default mode: of the raw logits, temperature 1)
            flat_logprobs=True,  # FlatLogprobs: a few flat lists per request, not a dict and a Logprob per token
        )

    def sleep(self) -> None:
        """Return the KV cache and weights to the GPU until the next load_weights (vLLM sleep level 2)."""
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=2)
            self._asleep = True

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, seed: int,
                 greedy: bool = False) -> torch.Tensor:
        """Rollouts; the engine sleeps after them (`sleep_after_generate`)."""
        responses = self._decode(input_ids, attention_mask, seed, greedy, None)
        if self.sleep_after_generate:
            self.sleep()
        return responses

    @contextlib.contextmanager
    def turns(self) -> Iterator[None]:
        """Awake between the turns of a multi-turn rollout (each continues the one before from vLLM's prefix
        cache, not a new prefill: the cache is reset by a weight sync only); asleep after the last."""
        sleep_after, self.sleep_after_generate = self.sleep_after_generate, False
        try:
            yield
        finally:
            self.sleep_after_generate = sleep_after
            if sleep_after:
                self.sleep()

    def greedy_answers(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Evaluation, between a sync and the next rollout: greedy (temperature 0) up to EOS whatever
        fixedLength says; the engine stays awake for that rollout."""
        return self._decode(input_ids, attention_mask, 0, True, False)

    def behaviour_model(self) -> torch.nn.Module:
        """Refused: the model lives in vLLM's own process (the spec lets spec.rollout.asynchronous run on hf only)."""
        raise RuntimeError("vllm rollout: its model lives in vLLM's process, so it gives no behaviour log-probs "
                           "(spec.rollout.asynchronous needs engine hf)")

    def resident_modules(self) -> list[torch.nn.Module]:
        """None: vLLM's memory is its own (sleep mode returns it)."""
        return []

    def _decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, seed: int, greedy: bool,
                fixed_length: bool | None) -> torch.Tensor:
        """Left-padded prompts [B, P] -> responses [B, R] right-padded with pad (CPU, int64)."""
        if self._asleep:
            raise RuntimeError("vllm rollout: the engine's weights were released after the last rollout "
                               "(sleep mode); load_weights must run before the next generate")
        R, pad = self.spec.rollout.max_new_tokens, self.tok.pad_token_id
        ids, mask = input_ids.cpu(), attention_mask.cpu().bool()
        prompts = [{"prompt_token_ids": row[m].tolist()} for row, m in zip(ids, mask)]
        # One seed per sample: GRPO repeats each prompt groupSize times, and a shared seed would
        # give every copy the same response (zero advantage). Seeds come from a generator so that
        # consecutive steps (seed, seed + 1) do not reuse each other's per-sample streams.
        gen = torch.Generator().manual_seed(seed)
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=gen).tolist()
        params = [self._sampling_params(s, greedy, fixed_length) for s in seeds]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        self.last_cached_tokens = sum(o.num_cached_tokens or 0 for o in outputs)  # prefix-cache hits (prompt tokens)
        responses = torch.full((len(prompts), R), pad, dtype=torch.long)
        self._logprobs = torch.zeros(len(prompts), R)
        for i, out in enumerate(outputs):
            tokens = list(out.outputs[0].token_ids)[:R]
            if tokens:
                responses[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            drawn = drawn_logprobs(out.outputs[0].logprobs, tokens)
            self._logprobs[i, : len(drawn)] = torch.tensor(drawn)
        return responses

    def rollout_logprobs(self) -> torch.Tensor | None:
        """vLLM's log-prob of each drawn token in the last `_decode` ([B, R], 0 past the response). vLLM reports
        them for the raw logits (temperature 1): at another temperature they would not compare with the
        trainer's, so there are none."""
        return self._logprobs if self.spec.rollout.temperature == 1.0 else None

    def close(self) -> None:
        """Stop the engine (its process, its GPU memory) and drop the staging buffer."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.sender.staging = None


def drawn_logprobs(flat, tokens: list[int]) -> list[float]:
    """Each drawn token's log-prob from vLLM's FlatLogprobs (logprobs=0: the drawn token is each position's first
    entry, at `start_indices`; checked at the first position, not per token); [] when vLLM returned none."""
    if flat is None:
        return []
    starts = flat.start_indices[: len(tokens)]
    if starts and flat.token_ids[starts[0]] != tokens[0]:
        raise RuntimeError("vllm rollout: a position's first log-prob is not its drawn token's (vLLM's FlatLogprobs "
                           "layout changed; this engine was written against vLLM 0.26.0)")
    return [flat.logprobs[s] for s in starts]
