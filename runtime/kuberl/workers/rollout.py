"""Rollout role (spec.rollout.async): an hf engine that generates continuously, apart from the actor.

The driver sends prompt batches (`submit`, one ticket each) and collects them in order (`collect`); a thread of
this worker generates them one after another, with the newest weights the actor pushed (`push_weights`). Every
response token is tagged with the version of the weights that drew it: under partial `finish` new weights wait
for the generation in flight to end, under `continue` they are applied between two decode steps (the KV cache
of the tokens before stays as the old weights made it). A worker that dies loses the tickets it held: a new one
answers `collect` of a ticket it never got with None, which the driver counts as lost.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref

import torch

from kuberl.data.batch import Batch
from kuberl.rollout import response_batch
from kuberl.rollout.hf import HFRollout
from kuberl.rollout.versions import StagedWeights, token_versions
from kuberl.workers.dispatch import Dispatch, register

from .base import Worker


class RolloutWorker(Worker):
    def setup(self) -> None:
        self.engine = HFRollout(self.spec, self.device, self.dtype, self.tokenizer, fast=False)
        self.staged = StagedWeights()
        self.work: queue.Queue[tuple[int, Batch, int]] = queue.Queue()
        self.known: set[int] = set()  # tickets sent to this worker and not yet collected
        self.done: dict[int, Batch | BaseException] = {}
        self.ready = threading.Condition()
        threading.Thread(target=generate_forever, args=(weakref.ref(self), self.work), name="rollout",
                         daemon=True).start()

    def resident_modules(self) -> list[torch.nn.Module]:
        return self.engine.resident_modules()

    @register(Dispatch.ALL, faults=False, repeatable=True)
    def push_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Stage the actor's weights after update `version`; the generating thread applies them (module doc)."""
        self.staged.push(state, version)

    @register(Dispatch.SPLIT, faults=False)
    def submit(self, prompts: Batch, ticket: int, seed: int) -> None:
        """Queue the prompts (prompt_ids, prompt_mask [B, P]) as `ticket`, to be generated after those before."""
        with self.ready:
            self.known.add(ticket)
        self.work.put((ticket, prompts.select("prompt_ids", "prompt_mask").to("cpu"), seed + self.rank))

    @register(Dispatch.ALL)
    def collect(self, ticket: int) -> Batch | None:
        """`ticket`'s rollout once generated: responses, response_mask, input_ids, attention_mask,
        rollout_logprobs, token_versions [B, R]; meta gen_seconds. None when this worker never got it (it was
        sent to one that died)."""
        with self.ready:
            if ticket not in self.known:
                return None
            self.ready.wait_for(lambda: ticket in self.done)
            self.known.discard(ticket)
            out = self.done.pop(ticket)
        if isinstance(out, BaseException):
            raise out
        return out

    def _apply_staged(self) -> None:
        staged = self.staged.take()
        if staged is not None:
            self.engine.load_weights(staged[0])
            self.staged.version = staged[1]

    def _run(self, ticket: int, prompts: Batch, seed: int) -> None:
        """Generate one ticket and hand it (or its error) to `collect`."""
        try:
            out: Batch | BaseException = self._generate(prompts, seed)
        except BaseException as exc:  # noqa: BLE001 - handed to the driver's collect
            out = exc
        with self.ready:
            self.done[ticket] = out
            self.ready.notify_all()

    def _generate(self, prompts: Batch, seed: int) -> Batch:
        self.staged.received.wait()  # a new worker holds the model path's weights: it waits for the actor's
        self._apply_staged()  # weights pushed since the last generation, under either partial mode
        steps: list[int] = []
        continue_ = self.spec.rollout.async_.partial == "continue"

        def every_token() -> None:
            steps.append(self.staged.version)  # the version that drew this step's token
            if continue_:
                self._apply_staged()

        t0 = time.perf_counter()
        ids, pmask = prompts["prompt_ids"].to(self.device), prompts["prompt_mask"].to(self.device)
        responses = self.engine.generate(ids, pmask, seed=seed, every_token=every_token)
        gen_s = time.perf_counter() - t0
        eos = None if self.spec.rollout.fixed_length else self.tokenizer.eos_token_id
        out = response_batch(ids, pmask, responses, eos)
        out.tensors["rollout_logprobs"] = self.engine.rollout_logprobs().to(self.device) * out["response_mask"]
        out.tensors["token_versions"] = token_versions(steps, len(out), responses.shape[1])
        return Batch({k: v.cpu() for k, v in out.tensors.items()}, {"gen_seconds": [gen_s] * len(out)})


def generate_forever(ref: weakref.ref[RolloutWorker], work: queue.Queue[tuple[int, Batch, int]]) -> None:
    """A worker's generating thread: its tickets in order; it ends once the worker is gone (an in-process group
    dropped it), holding it only while it generates."""
    worker = ref()
    if worker is not None and worker.device.type == "cuda":
        torch.cuda.set_device(worker.device)  # the current device is per thread: this rank's GPU, not cuda:0
    del worker
    while True:
        try:
            item = work.get(timeout=1.0)
        except queue.Empty:
            if ref() is None:
                return
            continue
        worker = ref()
        if worker is None:
            return
        worker._run(*item)
        del worker
