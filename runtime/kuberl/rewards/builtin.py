"""Built-in rule rewards. Signature: fn(prompt: str, response: str, answer: str | None) -> float in [0, 1]."""

from __future__ import annotations

import re

_GSM8K = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def repeat_letter(prompt: str, response: str, answer: str | None) -> float:
    """Share of the response's characters equal to the requested letter (0 for an empty response)."""
    if not response or not answer:
        return 0.0
    return sum(ch == answer for ch in response) / len(response)


def environment_only(prompt: str, response: str, answer: str | None = None) -> float:
    """0: under spec.environment, a trajectory's reward is then the environment's rewards alone."""
    return 0.0


def gsm8k_answer(text: str) -> str | None:
    """The number after the last `#### ` marker, commas removed, or None."""
    found = _GSM8K.findall(text)
    return found[-1].replace(",", "") if found else None


def gsm8k(prompt: str, response: str, answer: str | None) -> float:
    """1.0 when the response's `#### <n>` equals the reference (the reference may be a full GSM8K solution)."""
    if answer is None:
        return 0.0
    want = gsm8k_answer(answer) or answer.strip().replace(",", "")
    got = gsm8k_answer(response)
    if got is None:
        return 0.0
    try:
        return float(float(got) == float(want))
    except ValueError:
        return float(got == want)
