"""Token sampling for the fast decoder: Gumbel-max over counter-based noise, and nucleus (top-p) sampling
without sorting the vocabulary.

Every function takes logits [B, V] (any float dtype) and returns tokens [B] (int64) with fixed shapes and
no host synchronisation, so it runs inside a captured CUDA graph and compiles with torch.compile into a
few reductions over the logits (no [B, V] float32 copy is needed).

Noise. `gumbel(seed, step, B, V)` is a pure function of (seed, step, row, column): a 32-bit integer hash
(two rounds of the "lowbias32" mixer) of the element's index keyed by the seed and the decode step,
mapped to a uniform in (0, 1) with 24 bits and then to Gumbel noise -log(-log(u)). Being a function and
not a random stream, it can be recomputed wherever it is needed: the nucleus search below reads the same
noise in every round without storing it.

Plain sampling is Gumbel-max: argmax(logits / T + g) is an exact draw from softmax(logits / T).

Nucleus sampling. The nucleus N is every token whose strictly-more-likely tokens hold less than top_p of
the mass (the smallest top set reaching top_p; ties at the edge are all in or all out). Gumbel-max
restricted to N, argmax over N of (x + g), is an exact draw from softmax restricted to N, and it is found
without knowing N: take the unrestricted argmax s; if s is in N it is the answer; if not, every token of
N is strictly above s, so take the argmax over the tokens above s and check again. Each check is one
pass over the logits (the mass strictly above a token, the next candidate beside it). A draw is
unresolved after k checks with probability P * sum_{j>=k} (-ln P)^j / j! (P = top_p), whatever the
logits (exact for a long tail; computed in `nucleus_rounds`): for top_p 0.9 that is 1e-1, 5e-3, 2e-4,
5e-6, 1e-7 after 1..5 checks. `nucleus_rounds` picks enough checks for 1e-6 (at most MAX_ROUNDS); a draw
still unresolved takes the most likely token (always in N), and `sample` returns which rows did, so the
decoder can count them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MASK32 = 0xFFFFFFFF
UNRESOLVED_TARGET = 1e-6  # probability that a nucleus draw is left unresolved (then: the most likely token)
MAX_ROUNDS = 12


@dataclass(frozen=True)
class SamplingParams:
    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    suppress_eos: bool = False  # fixed-length responses: EOS can never be drawn


def nucleus_rounds(top_p: float, target: float = UNRESOLVED_TARGET, cap: int = MAX_ROUNDS) -> int:
    """Checks needed so that a nucleus draw is unresolved with probability <= target (1 <= result <= cap)."""
    lam = -math.log(top_p)
    term, tail = top_p, 1.0  # term: P * lam^j / j! (j = k - 1); tail: P(unresolved after k checks)
    for k in range(1, cap + 1):
        tail -= term  # 1 - P * sum_{j < k} lam^j / j!
        if tail <= target:
            return k
        term *= lam / k
    return cap


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def gumbel(seed: torch.Tensor, step: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Gumbel(0, 1) noise [rows, cols] (float32), a pure function of seed [1], step [1] (int64) and the index."""
    k1 = _mix32(seed & MASK32)
    k2 = _mix32(((step * 0x9E3779B9) ^ (seed >> 32) ^ k1) & MASK32)
    idx = torch.arange(rows * cols, device=seed.device, dtype=torch.int64).view(rows, cols)
    h = _mix32(_mix32((idx & MASK32) ^ k1) ^ k2)
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(u))


def _chunks(vocab: int) -> int:
    """Split rows into this many chunks for two-level reductions (more parallel work per row on a GPU)."""
    c = 64
    while c > 1 and (vocab % c or vocab // c < 512):
        c //= 2
    return c


def _row_argmax(v: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim of [B, V] -> [B] (the first maximum), through a two-level reduction."""
    b, n = v.shape
    c = _chunks(n)
    if c == 1:
        return v.argmax(-1)
    best, where = v.view(b, c, n // c).max(-1)            # [B, c] each
    chunk = best.argmax(-1, keepdim=True)                  # [B, 1] first chunk holding the maximum
    return (chunk * (n // c) + where.gather(-1, chunk)).squeeze(-1)


def _row_sum(v: torch.Tensor) -> torch.Tensor:
    b, n = v.shape
    c = _chunks(n)
    return v.view(b, c, n // c).sum(-1).sum(-1) if c > 1 else v.sum(-1)


def _row_max_and_logsum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row max m [B] and Z = sum(exp(x - m)) [B], with per-chunk maxima (no overflow, one pass per chunk)."""
    b, n = x.shape
    c = _chunks(n)
    x3 = x.view(b, c, n // c)
    cm = x3.amax(-1)                                                   # [B, c]
    cs = torch.exp(x3 - cm.unsqueeze(-1)).sum(-1)                      # [B, c]
    m = cm.amax(-1)
    return m, (cs * torch.exp(cm - m.unsqueeze(-1))).sum(-1)


def sample(logits: torch.Tensor, sp: SamplingParams, eos_id: int | None, seed: torch.Tensor,
           step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next tokens [B] from logits [B, V]; with top_p < 1 also the rows left unresolved [B] (bool), else None.

    seed [1] and step [1] are int64 tensors keying the noise (same key, same tokens)."""
    return sample_scalars(logits, sp.greedy, sp.temperature, sp.top_p, sp.suppress_eos, eos_id, seed, step)


def sample_scalars(logits: torch.Tensor, greedy: bool, temperature: float, top_p: float, suppress_eos: bool,
                   eos_id: int | None, seed: torch.Tensor,
                   step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sample` with the parameters as plain Python scalars (what torch.compile specialises on)."""
    b, v = logits.shape
    lv = logits.float()
    eos = suppress_eos and eos_id is not None
    if eos:
        lv = _without(lv, eos_id)
    if greedy:
        return _row_argmax(lv), None
    x = lv / temperature if temperature != 1.0 else lv
    score = x + gumbel(seed, step, b, v)
    if eos:  # again after the noise: where it is +inf (u rounds to 1.0), -inf + inf is NaN, which argmax picks
        score = _without(score, eos_id)
    if top_p >= 1.0:
        return _row_argmax(score), None
    return _nucleus(lv, x, score, top_p, nucleus_rounds(top_p))


def rollout_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float,
                     suppressed: int | None = None) -> torch.Tensor:
    """The rollout log-probs of drawn `tokens` [B] under logits [B, V]: log-softmax of logits / temperature over
    the vocabulary, `suppressed` (a never-drawn EOS) left out, before top-p (float32, [B]). What the trainer
    computes for the same token, less a suppressed EOS's mass: their gap is the engine/trainer mismatch."""
    x = logits.float() / temperature
    if suppressed is not None:
        x = _without(x, suppressed)
    return x.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(x, dim=-1)


def _without(x: torch.Tensor, column: int) -> torch.Tensor:
    """x [B, V] with `column` set to -inf: never drawn."""
    return torch.where(torch.arange(x.shape[-1], device=x.device) == column, float("-inf"), x)


def _nucleus(lv: torch.Tensor, x: torch.Tensor, score: torch.Tensor, top_p: float,
             rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """argmax over the nucleus of `score` (module docstring). lv: raw logits (ranks), x = lv / T (mass)."""
    m, z = _row_max_and_logsum(x)
    weight = torch.exp(x - m.unsqueeze(-1))                             # unnormalised probabilities
    limit = (top_p * z).unsqueeze(-1)                                   # [B, 1]
    s = _row_argmax(score).unsqueeze(-1)                                # [B, 1] first candidate
    done = torch.zeros_like(s, dtype=torch.bool)
    for r in range(rounds):
        above = lv > lv.gather(-1, s)                                   # tokens strictly more likely than s
        inside = _row_sum(torch.where(above, weight, 0.0)).unsqueeze(-1) < limit
        done_now = done | inside
        if r + 1 < rounds:
            nxt = _row_argmax(torch.where(above, score, float("-inf"))).unsqueeze(-1)
            s = torch.where(done_now, s, nxt)
        done = done_now
    s = torch.where(done, s, _row_argmax(lv).unsqueeze(-1))            # unresolved: the most likely token
    return s.squeeze(-1), ~done.squeeze(-1)
