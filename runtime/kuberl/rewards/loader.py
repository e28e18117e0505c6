"""Import a rule reward function from `package.module:function`, with errors that name the field."""

from __future__ import annotations

import importlib
from typing import Callable, Optional

RewardFn = Callable[[str, str, Optional[str]], float]
FIELD = "spec.reward.function"


class RewardImportError(ValueError):
    """The reward function cannot be loaded; the message names the field and the fix."""


def load_reward_fn(path: str) -> RewardFn:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise RewardImportError(f"{FIELD}: cannot import module {module_name!r} ({exc}) (fix: install the package in the runtime image or correct the path)") from None
    except Exception as exc:  # the user's module raised while importing
        raise RewardImportError(f"{FIELD}: importing {module_name!r} raised {type(exc).__name__}: {exc} (fix: make the module importable)") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise RewardImportError(f"{FIELD}: module {module_name!r} has no attribute {attr!r} (fix: check the function name)")
    if not callable(fn):
        raise RewardImportError(f"{FIELD}: {path} is not callable (fix: point it at a function)")
    return fn
