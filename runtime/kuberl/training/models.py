"""Build tokenizers and models from a `ModelSource`: a hub id, a local path, or a built-in config.

Built-ins are Qwen2-shaped and randomly initialised from a fixed seed, so every role that builds the
same built-in gets identical weights (actor and ref start equal) with no download. Their tokenizer is
a character-level tokenizer built locally with `tokenizers`, covering printable ASCII.

A hub id already in the local Hugging Face cache (HF_HUB_CACHE / HF_HOME) loads from there without
touching the network; only a model missing from the cache is downloaded.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen2Model,
)

from kuberl.spec.model import BUILTIN_MAX_POSITIONS, ModelSource
from kuberl.training.vocab import CHARS, SPECIALS

# name -> (hidden, intermediate, layers, heads, kv heads, vocab); the qwen2 shapes follow the
# published Qwen2-0.5B / Qwen2-1.5B configs (vocab 151,936, tied embeddings); qwen2-7b is Qwen2-7B's
# shape (hidden 3584, 28 layers, 28 heads, 4 kv heads, vocab 152,064) with tied embeddings (7.07B
# parameters; the published model is untied, 7.6B), the 7B-class model of the offload benchmark.
BUILTIN_SHAPES: dict[str, tuple[int, int, int, int, int, int | None]] = {
    "tiny": (64, 128, 2, 4, 2, None),
    "qwen2-0.5b": (896, 4864, 24, 14, 2, 151936),
    "qwen2-1.5b": (1536, 8960, 28, 12, 2, 151936),
    "qwen2-7b": (3584, 18944, 28, 28, 4, 152064),
}


@cache
def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over printable ASCII (`CHARS`), newline and tab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.padding_side = "left"
    return fast


def model_location(src: ModelSource) -> str:
    """What `from_pretrained` gets: the local path, the hub id's snapshot in the local cache when it is
    there (no network), else the hub id (a download)."""
    if src.path:
        return src.path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(src.hub, local_files_only=True)
    except LocalEntryNotFoundError:
        return src.hub


def load_tokenizer(src: ModelSource) -> PreTrainedTokenizerFast:
    """Tokenizer for a model source, left-padded for generation, with a pad token."""
    if src.builtin:
        return char_tokenizer()
    tok = AutoTokenizer.from_pretrained(model_location(src))
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def builtin_config(name: str, **extra) -> Qwen2Config:
    hidden, inter, layers, heads, kv, vocab = BUILTIN_SHAPES[name]
    tok = char_tokenizer()
    return Qwen2Config(
        vocab_size=vocab or len(tok),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=BUILTIN_MAX_POSITIONS,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        **extra,
    )


def _seeded(build, seed: int):
    """Run `build()` under a fixed CPU RNG seed without disturbing the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def load_causal_lm(src: ModelSource, dtype: torch.dtype = torch.float32, seed: int = 0,
                   device: torch.device | str | None = None) -> nn.Module:
    """Policy model (actor, ref, rollout). With `device`, a built-in is initialised there directly
    (fast on a GPU; the weights then differ from a CPU-built copy, so only use it where they are
    overwritten anyway, as for the rollout engine, which the actor syncs at setup)."""
    if src.builtin:
        cfg = builtin_config(src.builtin)
        if device is not None and torch.device(device).type != "cpu":
            with torch.device(device):
                return _seeded(lambda: Qwen2ForCausalLM(cfg), seed).to(dtype)
        return _seeded(lambda: Qwen2ForCausalLM(cfg), seed).to(dtype)
    return AutoModelForCausalLM.from_pretrained(model_location(src), dtype=dtype)


class ValueModel(nn.Module):
    """Critic: a transformer trunk plus a scalar head.

    forward(input_ids [B,S], attention_mask [B,S] or None, position_ids [B,S], attention kwargs) -> values [B,S].
    """

    def __init__(self, trunk: nn.Module, hidden_size: int):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None = None, **attention: object) -> torch.Tensor:
        # use_cache=False: no KV cache in a full-sequence pass (HF would build a DynamicCache and copy
        # every layer's K/V into it; under torch.compile its per-layer state also forces recompiles)
        hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False, **attention).last_hidden_state
        return self.head(hidden).sum(-1).float()  # [B,S,1] -> [B,S]; a sum, not a view (FSDP hooks)


def load_value_model(src: ModelSource, dtype: torch.dtype = torch.float32, seed: int = 0) -> ValueModel:
    if src.builtin:
        cfg = builtin_config(src.builtin)
        trunk = _seeded(lambda: Qwen2Model(cfg), seed)
    else:
        cfg = AutoConfig.from_pretrained(model_location(src))
        trunk = AutoModel.from_pretrained(model_location(src), dtype=dtype)
    return ValueModel(trunk, cfg.hidden_size).to(dtype)


def load_reward_model(src: ModelSource, dtype: torch.dtype = torch.float32, seed: int = 1) -> nn.Module:
    """Reward model with a sequence-classification head (num_labels=1): logits [B,1] = score."""
    if src.builtin:
        cfg = builtin_config(src.builtin, num_labels=1)
        return _seeded(lambda: Qwen2ForSequenceClassification(cfg), seed).to(dtype)
    model = AutoModelForSequenceClassification.from_pretrained(model_location(src), num_labels=1, dtype=dtype)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = load_tokenizer(src).pad_token_id
    return model


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of an HF causal LM / trunk, for per-layer FSDP sharding."""
    for attr in ("model.layers", "trunk.layers", "layers"):
        obj = model
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    return []


def count_params(model: nn.Module, exclude_embeddings: bool = True) -> int:
    """Parameters used for the 6·N·tokens FLOP estimate (embedding lookups excluded)."""
    total = sum(p.numel() for p in model.parameters())
    if exclude_embeddings:
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        if emb is not None and not tied:
            total -= emb.weight.numel()
    return total
