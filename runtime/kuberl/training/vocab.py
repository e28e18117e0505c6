"""The built-in models' character vocabulary (no torch, no transformers: the preflight uses it)."""

from __future__ import annotations

import string
from collections import Counter
from collections.abc import Iterable

SPECIALS = ["<pad>", "<eos>", "<unk>"]
_FIRST = string.ascii_lowercase + string.digits + " :+-=#?.,"  # the original vocabulary keeps its ids
CHARS = _FIRST + "".join(c for c in string.printable if c not in _FIRST and c not in "\r\x0b\x0c")
"""Printable ASCII plus newline and tab: every other character becomes <unk>."""


def unknown_characters(texts: Iterable[str]) -> Counter:
    """Characters of `texts` outside the built-in vocabulary, with their counts."""
    known = set(CHARS)
    return Counter(c for text in texts for c in text if c not in known)
