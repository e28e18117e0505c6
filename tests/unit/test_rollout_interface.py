"""The rollout engine interface (`kuberl.rollout.RolloutEngine`): what the actor uses of an engine, and the
greedy answers evaluation takes through it.

Greedy answers must be token for token what evaluation decoded before it went through the engine: transformers
`generate` on the engine's model, stopping at EOS even under rollout.fixedLength (the reference below is that
call as it was)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from kuberl.rollout import RolloutEngine, response_batch
from kuberl.rollout.hf import HFRollout
from kuberl.rollout.vllm import VLLMRollout
from kuberl.spec import JobSpec
from kuberl.spec.model import cross_field_problems
from kuberl.training.models import char_tokenizer

RUNTIME = Path(__file__).resolve().parents[2] / "runtime" / "kuberl"
MEMBERS = {"load_weights", "generate", "rollout_logprobs", "greedy_answers", "behaviour_model", "resident_modules",
           "turns"}
R = 12


def spec(fixed_length: bool = False) -> JobSpec:
    return JobSpec.model_validate({
        "model": {"builtin": "tiny"},
        "data": {"task": "repeat-letter", "maxPromptLength": 8},
        "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
        "rollout": {"maxNewTokens": R, "fixedLength": fixed_length},
    })


def engine(fixed_length: bool = False) -> HFRollout:
    """The hf engine on CPU, its weights perturbed so that greedy answers stop at EOS now and then."""
    eng = HFRollout(spec(fixed_length), torch.device("cpu"), torch.float32, char_tokenizer())
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in eng.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
        head = eng.model.lm_head.weight
        head[eng.tok.eos_token_id].copy_(head[17])  # EOS ties with token 17 and wins argmax's tie
    return eng


def eval_prompts() -> tuple[torch.Tensor, torch.Tensor]:
    enc = char_tokenizer()([f"say {c}:" for c in "abcdefghijklmnop"] + ["x", "yy z"], padding=True,
                           return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def reference_greedy(model: torch.nn.Module, tok, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Evaluation's decoding before the engine interface (kuberl.controller.evaluation.greedy_responses, as it was)."""
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=R,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[:, ids.shape[1]:]
    return torch.nn.functional.pad(out, (0, R - out.shape[1]), value=tok.pad_token_id)


def test_both_engines_implement_every_member_of_the_interface() -> None:
    declared = {n for n in vars(RolloutEngine) if not n.startswith("_")}
    assert declared == MEMBERS
    for cls in (HFRollout, VLLMRollout):
        assert all(callable(getattr(cls, name, None)) for name in MEMBERS), cls


def test_the_actor_uses_the_engine_through_the_interface_only() -> None:
    """Every `self.engine.<name>` in the workers is an interface member, and no worker imports the driver's side
    of evaluation (the import loop workers -> evaluation -> proxies -> workers)."""
    for path in (RUNTIME / "workers").glob("*.py"):
        tree = ast.parse(path.read_text())
        used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute) and node.value.attr == "engine"}
        assert used <= MEMBERS, (path.name, used - MEMBERS)
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not any(m and m.endswith("evaluation") for m in imported), path.name


@pytest.mark.parametrize("fixed_length", [False, True], ids=["eos", "fixed-length"])
def test_greedy_answers_are_evaluations_tokens_as_before(fixed_length: bool) -> None:
    eng = engine(fixed_length)
    ids, mask = eval_prompts()
    got = eng.greedy_answers(ids, mask)
    want = reference_greedy(eng.model, eng.tok, ids, mask)
    assert got.shape == (len(ids), R) and torch.equal(got, want)
    stopped = (got == eng.tok.eos_token_id).any(1)
    assert 0 < int(stopped.sum()) < len(ids), "the check needs answers that stop at EOS and answers that do not"
    if fixed_length:  # rollouts still ignore EOS; evaluation stops at it
        assert not torch.equal(eng.generate(ids, mask, seed=0, greedy=True), got)


def test_response_batch_masks_up_to_eos_and_joins_prompts() -> None:
    eos = 1
    prompts, pmask = torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    responses = torch.tensor([[4, 1, 0, 0], [4, 4, 4, 4]])
    out = response_batch(prompts, pmask, responses, eos)
    assert out["response_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert torch.equal(out["input_ids"], torch.cat([prompts, responses], 1))
    assert out["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 0, 0], [1] * 7]
    assert out["attention_mask"].dtype == torch.long and out["response_mask"].dtype == torch.float32
    assert response_batch(prompts, pmask, responses, None)["response_mask"].tolist() == [[1] * 4, [1] * 4]


def test_hf_engine_behaviour_model_and_resident_modules() -> None:
    eng = engine()
    assert eng.behaviour_model() is eng.model and eng.resident_modules() == [eng.model]


def test_evaluation_with_vllm_is_not_refused_by_the_spec() -> None:
    """The vllm engine answers eval prompts through the same interface (greedy_answers), so the spec takes both."""
    s = JobSpec.model_validate({
        "model": {"builtin": "tiny"},
        "data": {"task": "repeat-letter", "maxPromptLength": 8, "eval": {"interval": 2}},
        "reward": {"function": "kuberl.rewards.builtin:repeat_letter"},
        "rollout": {"engine": "vllm", "maxNewTokens": R},
        "roles": {"actor": {"gpus": 1}},
    })
    assert s.data.eval is not None and cross_field_problems(s) == []
