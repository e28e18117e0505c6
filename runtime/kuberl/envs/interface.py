"""The environment contract (spec.environment): a user's class with `reset(row)` and `step(action_text)`.

    class CalculatorEnv:
        def reset(self, row: dict) -> str | list[dict]:
            self.answer = row["answer"]
            return row["prompt"]                       # the first observation, or chat messages
        def step(self, action_text: str) -> EnvStep:   # or a tuple (observation, reward, done, info)
            done = self.answer in action_text
            return EnvStep("" if done else "try again", float(done), done, {})

One instance runs one trajectory at a time: `reset` starts it, each `step` answers one policy turn, and an optional
`close()` is called once the rollout is over (`close_all`). What a user's
method returns is checked here (`coerce_step`, `coerce_reset`), so a wrong shape is one line naming
spec.environment.class and the fix, not a failure deep in the rollout.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, Protocol, runtime_checkable

from kuberl import logs

FIELD = "spec.environment.class"
Messages = list[dict[str, str]]
"""Chat messages: [{"role": "system" | "user" | "assistant" | "tool", "content": text}, ...]."""


class EnvStepError(ValueError):
    """An environment's reset or step returned something the rollout cannot use; names the field and the fix."""


@dataclass(frozen=True)
class EnvStep:
    """What one `step` gives back: the observation text put before the policy's next turn, the reward of this
    turn, whether the trajectory is over, and free-form info (kept with the trajectory, e.g. for metrics)."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment. `reset(row)` starts a trajectory from one data row (every field of the jsonl line
    or parquet row) and gives the first observation (text) or chat messages; `step(action_text)` takes the
    policy's turn, decoded, and gives an `EnvStep` (or a tuple (observation, reward, done, info))."""

    def reset(self, row: dict[str, Any]) -> str | Messages:
        """Start a trajectory: the first observation, or the chat messages the policy answers first."""
        ...

    def step(self, action_text: str) -> EnvStep:
        """Answer one policy turn."""
        ...


def _kind(value: Any) -> str:
    """A short name of what a value is, for an error line: 'a list of 3', 'None', 'an int'."""
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def coerce_step(value: Any, where: str = "") -> EnvStep:
    """What a user's `step` returned -> EnvStep: an EnvStep, or a 4-tuple (observation: str, reward: number,
    done: bool, info: dict or None). Anything else is an EnvStepError naming spec.environment.class (`where`: the
    class, e.g. my_env.CalculatorEnv) and the fix."""
    at = f"{FIELD} {where}".rstrip()
    fix = ("(fix: return kuberl.envs.EnvStep(observation, reward, done, info), or a tuple (observation: str, "
           "reward: float, done: bool, info: dict))")
    if isinstance(value, EnvStep):
        observation, reward, done, info = value.observation, value.reward, value.done, value.info
    elif isinstance(value, (tuple, list)) and len(value) == 4:
        observation, reward, done, info = value
    else:
        raise EnvStepError(f"{at}: step() returned {_kind(value)}, not an EnvStep or a 4-tuple {fix}")
    if not isinstance(observation, str):
        raise EnvStepError(f"{at}: step()'s observation is {_kind(observation)}, not a str {fix}")
    if isinstance(reward, bool) or not isinstance(reward, Real) or not math.isfinite(float(reward)):
        raise EnvStepError(f"{at}: step()'s reward is {_kind(reward)} ({reward!r}), not a finite number {fix}")
    if type(done).__name__ not in ("bool", "bool_"):  # Python's bool, or numpy's
        raise EnvStepError(f"{at}: step()'s done is {_kind(done)} ({done!r}), not True or False {fix}")
    if info is not None and not isinstance(info, dict):
        raise EnvStepError(f"{at}: step()'s info is {_kind(info)}, not a dict {fix}")
    return EnvStep(observation, float(reward), bool(done), dict(info or {}))


def coerce_reset(value: Any, where: str = "") -> str | Messages:
    """What a user's `reset` returned, checked: a str, or a non-empty list of {"role": str, "content": str}
    messages. Anything else is an EnvStepError naming spec.environment.class and the fix."""
    at = f"{FIELD} {where}".rstrip()
    fix = '(fix: return the first observation as a str, or a list of {"role": ..., "content": ...} messages)'
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise EnvStepError(f"{at}: reset() returned {_kind(value)}, not a str or a list of messages {fix}")
    for i, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise EnvStepError(f"{at}: reset()'s message [{i}] is {_kind(message)} without a str role and a str "
                               f"content {fix}")
    return value


def close_all(envs: Iterable[Any], where: str = "") -> None:
    """A rollout's environments, dropped: each one's own `close()` called, where it has one. One that raises is
    logged (a warning naming spec.environment.class) and the others are closed still."""
    for env in envs:
        close = getattr(env, "close", None)
        if not callable(close):
            continue
        try:
            close()
        except Exception as exc:  # the user's code: reported, not fatal
            logs.get("rollout").warning(f"{FIELD} {where}: close() raised {type(exc).__name__}: {exc}; ignored")
