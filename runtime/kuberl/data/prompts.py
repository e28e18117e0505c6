"""The job's prompts, as the tokenized batches a program's rollout starts from (`kuberl.library` re-exports it)."""

from __future__ import annotations

from kuberl.data.batch import Batch
from kuberl.spec import JobSpec


class Prompts:
    """The job's prompts as tokenized batches, in the seeded, resumable order of `spec.data`.

    `next_batch()` -> Batch: prompt_ids [N, P] and prompt_mask [N, P] (left-padded), group_index [N]
    (equal for the samples of one prompt), meta `tasks.META_KEYS`; N = data.batchSize x samples per
    prompt, each prompt repeated that many times in a row."""

    def __init__(self, spec: JobSpec):
        from kuberl.data.tasks import PromptLoader, load_rows
        from kuberl.training.models import load_tokenizer

        self.spec = spec
        self.tokenizer = load_tokenizer(spec.model)
        self.tokenizer.truncation_side = "left"
        self.loader = PromptLoader(load_rows(spec.data), spec.data.batch_size, spec.trainer.seed, spec.data.shuffle)

    def next_batch(self) -> Batch:
        from kuberl.data.tasks import prompt_batch

        spec = self.spec
        return prompt_batch(self.loader.next_batch(), self.tokenizer, spec.samples_per_prompt,
                            spec.data.max_prompt_length)

    def state_dict(self) -> dict[str, int]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loader.load_state_dict(state)
