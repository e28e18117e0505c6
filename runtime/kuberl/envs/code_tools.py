"""The built-in `code_tools` environment (spec.environment.module: code_tools): the tool environment with a `python`
tool, which runs the policy's program in the sandbox (`kuberl.envs.sandbox`) and gives back what it printed.

The sandbox is checked once per process, when the environment is built: where this kernel or container cannot
confine the code (no Landlock, no namespaces), the job stops at validation, naming the reason, rather than run
model-written code unconfined."""

from __future__ import annotations

import functools
from typing import ClassVar

from . import sandbox
from .calculator import calculator
from .tools import Tool, ToolEnvironment


class CodeFailed(Exception):
    """The program raised, or was stopped at a limit; the message says which (the policy reads it)."""


class SandboxUnavailable(RuntimeError):
    """This process cannot run the sandbox; the message says why."""


LIMITS = sandbox.SandboxLimits()


def python(code: str) -> str:
    """Run a Python program (standard library, no network, 5 s of CPU) and give back what it prints."""
    result = sandbox.run_python(code, LIMITS)
    if not result.ok:
        raise CodeFailed(result.report())
    return result.stdout


@functools.cache
def _unavailable() -> str | None:
    return sandbox.available()


class CodeToolEnvironment(ToolEnvironment):
    """`tools` plus `python`. Built with the same arguments; raises SandboxUnavailable where the sandbox cannot run."""

    builtin_tools: ClassVar[dict[str, Tool]] = {"calculator": calculator, "python": python}

    def __init__(self, *args, **kwargs):
        reason = _unavailable()
        if reason is not None:
            raise SandboxUnavailable(reason)
        super().__init__(*args, **kwargs)
