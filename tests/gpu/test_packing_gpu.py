"""Packing on a CUDA device: flash attention's varlen kernel (bf16) and the per-sequence SDPA fallback (fp32) give
the padded path's log-probs and gradients, and a compiled block takes packed rows of changing length.
Run: `pytest -m gpu tests/gpu -s` on a machine with a GPU (skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from kuberl.spec.model import ModelSource
from kuberl.training import packing
from kuberl.training.models import load_causal_lm
from kuberl.training.sequence import response_logprobs

from ..unit.test_packing import rows

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize(("dtype", "tol"), [(torch.bfloat16, 2e-2), (torch.float32, 1e-4)])
def test_packed_logprobs_and_gradients_equal_the_padded_path_on_cuda(dtype: torch.dtype, tol: float) -> None:
    b = {k: v.cuda() for k, v in rows(seed=5).items()}
    padded, packed = (load_causal_lm(ModelSource(builtin="tiny"), seed=3).to("cuda", dtype) for _ in range(2))
    packing.use_varlen(packed)
    mask = b["response_mask"]
    out = {}
    for name, model, rmask in (("padded", padded, None), ("packed", packed, mask)):
        logp, _ = response_logprobs(model, b["input_ids"], b["attention_mask"], b["responses"], chunk_size=16,
                                    fused=True, response_mask=rmask)
        (logp * mask).sum().backward()
        out[name] = (logp * mask, model.model.embed_tokens.weight.grad.float())
    if dtype is torch.bfloat16:
        assert packing.FLASH_VARLEN is not None, "this torch has no flash varlen kernel"
    torch.testing.assert_close(out["packed"][0], out["padded"][0], rtol=tol, atol=tol)
    torch.testing.assert_close(out["packed"][1], out["padded"][1], rtol=tol, atol=tol)


def test_a_compiled_block_takes_packed_rows_of_changing_length() -> None:
    model = load_causal_lm(ModelSource(builtin="tiny"), seed=3).to("cuda", torch.bfloat16)
    packing.use_varlen(model)
    for block in model.model.layers:
        block.compile()
    for n in range(2, 6):  # 2 to 5 rows: four packed lengths
        b = {k: v.cuda() for k, v in rows(seed=n, b=n).items()}
        logp, _ = response_logprobs(model, b["input_ids"], b["attention_mask"], b["responses"], chunk_size=16,
                                    fused=True, response_mask=b["response_mask"])
        assert torch.isfinite(logp).all()
