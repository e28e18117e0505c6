"""kuberl.controller.dynamic_sampling: which groups carry a signal, and a step's batch assembled from rollouts."""

from __future__ import annotations

import pytest
import torch

from kuberl.controller import dynamic_sampling
from kuberl.data.batch import Batch

T = torch.tensor


def rollout(scores: list[float], width: int, tag: int, group_size: int = 2) -> Batch:
    """A scored rollout: prompts `width` tokens wide (id `tag`, left-padded by one token), responses of 3."""
    n = len(scores)
    prompt = torch.full((n, width), tag)
    prompt[:, 0] = 0
    pmask = torch.ones(n, width, dtype=torch.long)
    pmask[:, 0] = 0
    resp = torch.full((n, 3), tag + 100)
    return Batch({"prompt_ids": prompt, "prompt_mask": pmask, "responses": resp, "scores": T(scores),
                  "group_index": torch.arange(n) // group_size, "input_ids": torch.cat([prompt, resp], 1),
                  "attention_mask": torch.cat([pmask, torch.ones(n, 3, dtype=torch.long)], 1)},
                 {"answer": [f"{tag}-{i}" for i in range(n)]})


def test_informative_rows_are_those_of_groups_whose_scores_differ():
    scores, group = T([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.2]), T([4, 4, 9, 9, 2, 2, 7])
    # group 4 all 1, group 9 differs, group 2 all 0.5, group 7 a single row (nothing to compare)
    assert dynamic_sampling.informative(scores, group).tolist() == [False, False, True, True, False, False, False]


def test_a_batch_keeps_the_informative_groups_in_order_and_refills_from_later_rollouts():
    first = rollout([0, 0, 1, 0, 1, 1], width=4, tag=1)       # groups: (0, 0) no, (1, 0) yes, (1, 1) no
    second = rollout([0, 1, 0.5, 0.5, 1, 0], width=6, tag=2)  # (0, 1) yes, (0.5, 0.5) no, (1, 0) yes
    assert dynamic_sampling.count_informative([first, second], 2) == 3
    out, kept = dynamic_sampling.assemble([first, second], groups=3, group_size=2, pad_id=0)
    assert kept == 3 and len(out) == 6
    assert out.meta["answer"] == ["1-2", "1-3", "2-0", "2-1", "2-4", "2-5"]
    assert out["scores"].tolist() == [1, 0, 0, 1, 1, 0]
    assert out["group_index"].tolist() == [0, 0, 1, 1, 2, 2]
    # the first rollout's prompts widened to the second's 6 tokens on the left, masked out
    assert out["prompt_ids"].shape == (6, 6) and out["prompt_ids"][0].tolist() == [0, 0, 0, 1, 1, 1]
    assert out["prompt_mask"][0].tolist() == [0, 0, 0, 1, 1, 1] and out["prompt_mask"][2].tolist() == [0] + [1] * 5
    assert out["input_ids"].shape == (6, 9) and out["attention_mask"][0].tolist() == [0, 0, 0] + [1] * 6
    assert torch.equal(out["responses"][:2], torch.full((2, 3), 101))


def test_a_short_batch_is_filled_with_uninformative_groups_and_says_how_many_carry_a_signal():
    only = rollout([0, 0, 1, 0, 1, 1], width=4, tag=1)
    out, kept = dynamic_sampling.assemble([only], groups=3, group_size=2, pad_id=0)
    assert kept == 1 and out.meta["answer"] == ["1-2", "1-3", "1-0", "1-1", "1-4", "1-5"]
    with pytest.raises(ValueError, match="2 rows drawn for a batch of 6"):
        dynamic_sampling.assemble([rollout([0, 1], width=4, tag=1)], groups=3, group_size=2, pad_id=0)
