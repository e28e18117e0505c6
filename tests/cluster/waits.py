"""Bounded waits that say what they waited for, the last value seen, and the context (logs, objects)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(
    fn: Callable[[], T],
    timeout: float = 10,
    what: str = "a condition",
    logs: Callable[[], str] | None = None,
    interval: float = 0.1,
) -> T:
    """Poll ``fn`` until it returns something truthy; fail after ``timeout`` seconds, with context."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; last value: {value!r}" + (logs() if logs else "")
            )
        time.sleep(interval)


def holds(
    fn: Callable[[], Any], seconds: float, what: str, interval: float = 0.2, logs: Callable[[], str] | None = None
) -> None:
    """Assert that ``fn`` stays truthy for a while (for things that must not change)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert fn(), f"{what} stopped holding" + (logs() if logs else "")
        time.sleep(interval)
