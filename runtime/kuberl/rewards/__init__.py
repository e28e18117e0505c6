"""Rule rewards: built-ins and loading a user function by import path `package.module:function`."""

from .loader import RewardFn, RewardImportError, load_reward_fn

__all__ = ["RewardFn", "RewardImportError", "load_reward_fn"]
