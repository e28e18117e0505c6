"""Rule rewards: built-ins and loading a user function by import path `package.module:function`."""

from .loader import RewardCall, RewardFn, RewardFunctionError, RewardImportError, add_import_dir, load_reward_fn

__all__ = ["RewardCall", "RewardFn", "RewardFunctionError", "RewardImportError", "add_import_dir", "load_reward_fn"]
