"""A Ray actor is a process of its own: it logs at the driver's level and in its format (kuberl.logs)."""

from __future__ import annotations

import logging

import pytest

from kuberl import logs
from kuberl.workers.groups import RayWorkerGroup

from .conftest import load_example


def logging_of(worker) -> tuple[int, list[str]]:
    """Run inside the actor: its `kuberl` logger's level and formatters."""
    logger = logging.getLogger("kuberl")
    return logger.level, [type(h.formatter).__name__ for h in logger.handlers]


@pytest.mark.parametrize(("level", "fmt"), [("debug", "json"), ("info", "text")])
def test_a_ray_worker_logs_as_the_driver_chose(ray_session, monkeypatch, level, fmt):
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)  # restored after the test, and so is the setup below
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    logs.setup(level, fmt)
    group = RayWorkerGroup("reward", load_example("quickstart.yaml").spec, "cpu")
    try:
        group.launch()
        seen = ray_session.get(group.actors[0].__ray_call__.remote(logging_of), timeout=120)
    finally:
        group.shutdown()
        logs.setup()
    assert seen == (logging.getLevelName(level.upper()), ["JsonFormatter" if fmt == "json" else "TextFormatter"])
