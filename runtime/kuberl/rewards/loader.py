"""Rule reward functions by name (the built-ins) or import path `package.module:function`, with errors that
name the field.

Two signatures are accepted:

- positional, as before: ``fn(prompt, response, answer) -> float`` (any parameter names);
- by keyword: any of ``prompt``, ``response``, ``answer`` and ``row`` (the whole data row, every field
  of the jsonl line or parquet row), e.g. ``fn(response, row)``; a ``**kwargs`` function gets all four.

The reward "needs" the answer when it takes one without a default: then every data row must hold
`spec.data.answerKey` (checked before the job starts).
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl.registry import Registry
from kuberl.spec.model import REWARD_FUNCTION_NAMES

RewardFn = Callable[..., float]
FIELD = "spec.reward.function"
KEYWORDS = ("prompt", "response", "answer", "row")


class RewardImportError(ValueError):
    """The reward function cannot be loaded; the message names the field and the fix."""


REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward function", FIELD, REWARD_FUNCTION_NAMES, RewardImportError)
REWARD_FUNCTIONS.lazy("repeat-letter", "kuberl.rewards.builtin:repeat_letter")
REWARD_FUNCTIONS.lazy("gsm8k", "kuberl.rewards.builtin:gsm8k")
REWARD_FUNCTIONS.lazy("environment", "kuberl.rewards.builtin:environment_only")


class RewardFunctionError(RuntimeError):
    """The user's reward function raised (or returned a non-number) on one sample; the message gives the
    user's file and line, the exception and the sample, on one line, for the driver's log. ``public`` leaves out
    the exception's message and the sample (either may hold prompt or response text): it is what goes into the
    job's status and Events."""

    def __init__(self, message: str, public: str):
        super().__init__(message)
        self.public = public

    def __reduce__(self):  # Ray pickles it from the worker to the driver: both texts travel
        return type(self), (str(self), self.public)


def add_import_dir(folder: Path) -> None:
    """Make modules in `folder` (a manifest's own folder) importable here and in processes started from
    here (a local Ray's workers inherit PYTHONPATH)."""
    folder_s = str(folder.resolve())
    if folder_s not in sys.path:
        sys.path.insert(0, folder_s)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder_s not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([*parts, folder_s])


@dataclass(frozen=True)
class RewardCall:
    """A loaded reward function and how to call it: `call(prompt, response, answer, row) -> float`."""

    path: str
    fn: RewardFn
    keywords: tuple[str, ...] | None  # None: positional (prompt, response, answer)
    needs_answer: bool

    def __call__(self, prompt: str, response: str, answer: str | None, row: dict[str, Any]) -> float:
        if self.keywords is None:
            return self.fn(prompt, response, answer)
        given = {"prompt": prompt, "response": response, "answer": answer, "row": row}
        return self.fn(**{k: given[k] for k in self.keywords})

    def score(self, prompt: str, response: str, answer: str | None, row: dict[str, Any], origin: str) -> float:
        """One sample's score as a float; a failure is a RewardFunctionError naming the user's line and the sample."""
        try:
            value = self(prompt, response, answer, row)
            return float(value)
        except Exception as exc:  # the user's code: report it, whatever it raised
            raise RewardFunctionError(*self._describe(exc, origin, prompt, response)) from None

    def _describe(self, exc: Exception, origin: str, prompt: str, response: str) -> tuple[str, str]:
        """(the message for the log, the one for the status)."""
        try:
            user_file = os.path.realpath(inspect.getsourcefile(self.fn) or "")
        except TypeError:  # a builtin
            user_file = ""
        frames = traceback.extract_tb(exc.__traceback__)
        mine = [f for f in frames if user_file and os.path.realpath(f.filename) == user_file]
        frame = (mine or frames or [None])[-1]
        where = f" at {frame.filename}:{frame.lineno} (in {frame.name})" if frame is not None else ""
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return (f"{FIELD} {self.path} raised {type(exc).__name__}: {text}{where}, on sample {origin} "
                f"(prompt {prompt[:60]!r}, response {response[:60]!r})",
                f"{FIELD} {self.path} raised {type(exc).__name__}{where}, on sample {origin} (its message and the "
                f"sample: the driver's log)")


def load_reward_fn(path: str) -> RewardCall:
    """A built-in reward function by name, or a user's by import path, and how to call it; RewardImportError
    names the fix."""
    fn = REWARD_FUNCTIONS.get(path)
    keywords, needs_answer = calling_convention(fn, path)
    return RewardCall(path, fn, keywords, needs_answer)


def calling_convention(fn: RewardFn, path: str) -> tuple[tuple[str, ...] | None, bool]:
    """(keywords to pass, or None for positional (prompt, response, answer); whether it needs the answer)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: trust the documented positional form
        return None, False
    kinds = inspect.Parameter
    if any(p.kind == kinds.VAR_KEYWORD for p in params):
        return KEYWORDS, False
    named = [p for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    required = [p for p in params if p.default is p.empty and p.kind not in (kinds.VAR_POSITIONAL,)]
    if "response" in {p.name for p in named} and all(p.name in KEYWORDS for p in required):
        wanted = tuple(p.name for p in named if p.name in KEYWORDS)
        answer = next((p for p in named if p.name == "answer"), None)
        return wanted, answer is not None and answer.default is answer.empty
    positional = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    takes_three = len(positional) >= 3 or any(p.kind == kinds.VAR_POSITIONAL for p in params)
    if takes_three and all(p.kind != kinds.KEYWORD_ONLY or p.default is not p.empty for p in params) \
            and sum(p.default is p.empty for p in positional) <= 3:
        third = positional[2] if len(positional) >= 3 else None
        return None, third is not None and third.default is third.empty
    shown = ", ".join(p.name for p in params)
    raise RewardImportError(f"{FIELD}: {path}({shown}) cannot be called as a reward (fix: define "
                            "fn(prompt, response, answer), or take keyword parameters among "
                            "prompt, response, answer, row)")
