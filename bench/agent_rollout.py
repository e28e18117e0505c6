"""Multi-turn rollout with the environments in the env role (spec.roles.env): trajectories per second, and how long
the policy's device waited on environments, at a given environment latency. One process, every role a
LocalWorkerGroup (no Ray: it runs on the device as it is), so the env role's calls are in-process ones.

    python3 bench/agent_rollout.py --model qwen2-0.5b --trajectories 256 --turns 4 --tokens-per-turn 64 --env-ms 0,50
    python3 bench/agent_rollout.py --quick      # CPU smoke test (tiny model): tests/unit/test_agent_bench.py

Each --env-ms value is one GRPO job of --steps steps (step 1 is warm-up: not counted) whose environment answers
each policy turn after that many milliseconds (`Delayed`, defined here). Per job, medians over the counted steps:
the rollout's seconds, trajectories and policy turns per second, the seconds the rollout waited on environments
with nothing to generate (`env_seconds`: the device idle on environments) and their share of the rollout, and the
whole step's seconds. One JSON line per step and per job summary on stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ppo_step import write_prompts  # noqa: E402

from kuberl.controller.driver import Driver  # noqa: E402
from kuberl.envs import EnvStep  # noqa: E402
from kuberl.spec import JobSpec  # noqa: E402
from kuberl.workers.groups import LocalWorkerGroup  # noqa: E402

GROUP = 4  # GRPO's group: trajectories per prompt
OBSERVATION = " next:"  # what the environment says after each turn but the last


class Delayed:
    """Answers each policy turn after `delay_s` (set by the bench), done after `turns` turns; rewards a turn's
    length parity (a signal GRPO can use, not a task)."""

    delay_s, turns = 0.0, 2

    def reset(self, row: dict[str, Any]) -> str:
        self.taken = 0
        return row["prompt"]

    def step(self, action_text: str) -> EnvStep:
        time.sleep(self.delay_s)
        self.taken += 1
        done = self.taken >= self.turns
        return EnvStep("" if done else OBSERVATION, float(len(action_text) % 2), done, {})


def build_spec(args: argparse.Namespace, data: Path) -> JobSpec:
    cuda = args.device == "cuda"
    room = args.turns * (args.tokens_per_turn + len(OBSERVATION))  # the turns and the observations between them
    return JobSpec.model_validate({
        "model": {"builtin": args.model, "dtype": "bfloat16" if cuda else "float32"},
        "algorithm": {"name": "grpo", "groupSize": GROUP, "kl": {"coef": 0.0}},
        "data": {"files": [str(data)], "maxPromptLength": args.prompt_len, "batchSize": args.trajectories // GROUP},
        "reward": {"function": "environment"},
        "environment": {"module": "agent_rollout", "class": "Delayed", "maxTurns": args.turns,
                        "maxTokensPerTurn": args.tokens_per_turn, "timeoutSeconds": 600,
                        "concurrency": args.trajectories},
        "rollout": {"engine": "hf", "maxNewTokens": room, "temperature": 1.0, "compile": cuda},
        "trainer": {"steps": args.steps, "ppoEpochs": 1, "miniBatchSize": args.trajectories,
                    "microBatchSize": args.micro, "seed": 0, "checkpoint": {"interval": 10_000}},
        "roles": {"actor": {"gpus": int(cuda), "optim": {"lr": 1e-6}}, "ref": {"enabled": False}, "reward": {},
                  "env": {"replicas": 1}},
        "resilience": {"snapshots": "off"},
    })


def run_job(args: argparse.Namespace, env_ms: float) -> dict[str, Any]:
    """One job at environment latency `env_ms`: its per-step lines printed, its summary returned."""
    env_cls = importlib.import_module("agent_rollout").Delayed  # as the env role imports it (not as __main__)
    env_cls.delay_s, env_cls.turns = env_ms / 1000, args.turns
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        write_prompts(data, args.trajectories * (args.steps + 1), args.prompt_len)
        spec = build_spec(args, data)
        driver = Driver(spec, "agent-bench", Path(tmp) / "out", lambda role: LocalWorkerGroup(role, spec, args.device),
                        progress=False)
        driver.start()
        rows = []
        try:
            for _ in range(args.steps):
                rec = driver.train_step().flat()
                row = {"env_ms": env_ms, "step": rec["step"], "rollout_s": rec["time_rollout_s"],
                       "env_wait_s": rec["env_seconds"], "step_s": rec["time_step_s"],
                       "turns_mean": rec["env_turns_mean"], "failed": rec["env_failed"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            driver.shutdown()
    counted = rows[1:] or rows
    rollout = statistics.median(r["rollout_s"] for r in counted)
    wait = statistics.median(r["env_wait_s"] for r in counted)
    turns = statistics.median(r["turns_mean"] for r in counted)
    return {"kind": "agent", "model": args.model, "device": device_name(args.device), "env_ms": env_ms,
            "trajectories": args.trajectories, "turns": args.turns, "tokens_per_turn": args.tokens_per_turn,
            "rollout_s": rollout, "trajectories_per_s": args.trajectories / rollout,
            "turns_per_s": args.trajectories * turns / rollout, "env_wait_s": wait, "env_wait_share": wait / rollout,
            "step_s": statistics.median(r["step_s"] for r in counted), "steps_counted": len(counted),
            "failed": sum(r["failed"] for r in rows)}


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2-0.5b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--trajectories", type=int, default=256, help="per step (a multiple of 4: GRPO groups of 4)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens-per-turn", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--env-ms", default="0,50", help="environment latencies per turn, comma-separated (ms)")
    ap.add_argument("--steps", type=int, default=4, help="per latency; the first is warm-up")
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: tiny model, 16 trajectories, 2 steps")
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.device, args.trajectories, args.turns, args.tokens_per_turn = "tiny", "cpu", 16, 2, 8
        args.prompt_len, args.steps, args.micro, args.env_ms = 16, 2, 16, "0,20"
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    out = []
    for env_ms in (float(ms) for ms in args.env_ms.split(",")):
        out.append(run_job(args, env_ms))
        print(json.dumps(out[-1]), flush=True)
    return out


if __name__ == "__main__":
    main()
