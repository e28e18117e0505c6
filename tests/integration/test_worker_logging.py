"""A Ray actor is a process of its own: it logs at the driver's level and in its format (kuberl.logs), and
with JSON logs what it prints reaches the driver's output as JSON objects too (kuberl.run)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kuberl import logs
from kuberl.workers.groups import RayWorkerGroup

from .conftest import REPO, load_example

REWARD = """\
import logging
import sys

from kuberl.rewards.builtin import repeat_letter


def score(prompt, response, answer):
    print("scoring one sample")
    print("scoring on stderr", file=sys.stderr)
    logging.getLogger("kuberl.rewards.mine").warning("a log line of the reward", extra={"role": "reward"})
    return repeat_letter(prompt, response, answer)
"""


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


def run_printing_job(tmp_path: Path, fmt: str) -> subprocess.CompletedProcess:
    """`kuberl run` of the quickstart on a local Ray, 2 steps, with a reward that prints and logs in its worker."""
    (tmp_path / "printing.py").write_text(REWARD)
    obj = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    obj["spec"]["reward"]["function"] = "printing:score"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(obj))
    env = {key: value for key, value in os.environ.items() if key not in (logs.LEVEL_ENV, logs.FORMAT_ENV)}
    return subprocess.run([sys.executable, "-m", "kuberl.cli", "run", str(tmp_path / "job.yaml"), "--out",
                           str(tmp_path / "out"), "--steps", "2", "--backend", "ray", "--no-progress", "--no-export",
                           "--log-format", fmt], capture_output=True, text=True, cwd=REPO, timeout=600, env=env)


def test_with_json_logs_every_line_a_ray_driver_prints_is_a_json_object(netns, tmp_path):
    proc = run_printing_job(tmp_path, "json")
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]  # each line parses, or the test fails here
    err = [json.loads(line) for line in proc.stderr.splitlines()]
    assert all(isinstance(doc, dict) for doc in out + err) and "" not in proc.stdout.splitlines()
    printed = [doc for doc in out if doc["message"] == "scoring one sample"]
    assert len(printed) == 2 * 32  # one per sample of both steps: none deduplicated
    assert printed[0].keys() == {"time", "level", "logger", "message", "actor", "pid", "ip"}
    assert (printed[0]["logger"], printed[0]["level"], printed[0]["actor"]) == ("stdout", "info", "RewardWorker")
    assert {doc["pid"] for doc in printed} == {printed[0]["pid"]} and isinstance(printed[0]["pid"], int)
    assert any(doc["message"] == "scoring on stderr" and doc["logger"] == "stderr" for doc in err)
    logged = [doc for doc in err if doc["logger"] == "kuberl.rewards.mine"]  # the worker's own JSON, with actor/pid
    assert logged[0] == {**logged[0], "level": "warning", "message": "a log line of the reward", "role": "reward",
                         "actor": "RewardWorker", "pid": printed[0]["pid"]}
    results = [doc["message"] for doc in out if doc["logger"] == "stdout" and "actor" not in doc]
    assert results[-1].startswith("done: job 'quickstart', 2 steps") and "[quickstart] step 2/2 " in results[-2]


def test_with_text_logs_the_driver_prints_as_ray_and_kuberl_always_did(netns, tmp_path):
    proc = run_printing_job(tmp_path, "text")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("done: job 'quickstart', 2 steps")
    assert any("(RewardWorker pid=" in line and line.endswith(" scoring one sample")  # Ray's prefix, in colour
               for line in proc.stdout.splitlines())
    assert "kuberl: warning: a log line of the reward" in proc.stderr
