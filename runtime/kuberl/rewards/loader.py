"""Rule reward functions by name or import path `package.module:function`, with errors that name the field."""

from __future__ import annotations

from typing import Callable, Optional

from ..registry import Registry
from ..spec.model import REWARD_FUNCTION_NAMES

RewardFn = Callable[[str, str, Optional[str]], float]
FIELD = "spec.reward.function"


class RewardImportError(ValueError):
    """The reward function cannot be loaded; the message names the field and the fix."""


REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward function", FIELD, REWARD_FUNCTION_NAMES, RewardImportError)
REWARD_FUNCTIONS.lazy("repeat-letter", "kuberl.rewards.builtin:repeat_letter")
REWARD_FUNCTIONS.lazy("gsm8k", "kuberl.rewards.builtin:gsm8k")


def load_reward_fn(path: str) -> RewardFn:
    """A built-in reward function by name, or a user's by import path `package.module:function`."""
    return REWARD_FUNCTIONS.get(path)
