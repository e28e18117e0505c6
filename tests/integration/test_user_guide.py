"""docs/user-guide.md, end to end on CPU: every `kuberl` command and Python block of the guide, in order."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from kuberl.metrics import read_jsonl

from .conftest import REPO

GUIDE = REPO / "docs" / "user-guide.md"


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced code block."""
    return re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)


def guide_steps() -> list[tuple[str, str]]:
    """('kuberl', command line) for each `kuberl ...` line of a bash block, ('python', code) per python block."""
    steps = []
    for lang, body in blocks(GUIDE.read_text()):
        if lang == "bash":
            steps += [
                ("kuberl", line.split("#")[0].strip()) for line in body.splitlines() if line.startswith("kuberl ")
            ]
        elif lang == "python":
            steps.append(("python", body))
    return steps


def test_the_user_guide_runs_as_written(netns, tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples" / "byo", tmp_path / "examples" / "byo")
    for name in ("agent.yaml", "letter_env.py"):  # section 14's agent
        shutil.copy(REPO / "examples" / name, tmp_path / "examples" / name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "runtime"), str(REPO / "operator")])}
    outputs = []
    for kind, text in guide_steps():
        argv = (
            [sys.executable, "-m", "kuberl.cli", *text.split()[1:]]
            if kind == "kuberl"
            else [sys.executable, "-c", text]
        )
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{text}\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, proc.stderr
        outputs.append((text, proc.stdout))
    said = "\n".join(out for _, out in outputs)
    assert [kind for kind, _ in guide_steps()].count("kuberl") >= 6
    assert "done: job 'byo', 4 steps (steps 1-4 in this run)" in said and "eval_reward_mean=" in said
    assert "job 'byo' is already finished: 4/4 steps in runs/byo" in said
    assert "[byo] resuming from step 4" in said and "done: job 'byo', 6 steps (steps 5-6 in this run)" in said
    run = tmp_path / "runs" / "byo"
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and "eval_reward_mean" in rows[3]
    assert (run / "model" / "model.safetensors").is_file() and (run / "tensorboard").is_dir()
    assert (tmp_path / "runs" / "byo-step4" / "config.json").is_file()
    assert "done: job 'agent', 4 steps" in said and (tmp_path / "runs" / "agent-model" / "config.json").is_file()
    assert [r["env_turns_mean"] for r in read_jsonl(tmp_path / "runs" / "agent" / "metrics.jsonl")] == [2.0] * 4
