"""Agentic RL end to end on CPU (examples/agent.yaml): a two-turn environment whose second turn asks, in its
observation, for another letter; GRPO on real Ray actors learns it, every trajectory takes both turns, and the
environment's figures are in metrics.jsonl. The environments live in the env role's processes: the role grows
from two to three between two steps (`kuberl scale`), and one killed during the run is restarted alone, and
training goes on. A rank whose hung environment calls hold its slots is restarted too."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from kuberl.metrics import read_jsonl
from kuberl.resilience.resize import write_request
from kuberl.run import run_job

from .conftest import load_example

GROW_AFTER, KILL_AFTER = 10, 20  # the steps after which the env role is asked for 3 ranks, and one is killed


def env_worker_pids() -> list[int]:
    """The env role's Ray actor processes (their title: ray::EnvWorker...)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"ray::EnvWorker"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def grow_then_kill(out: Path, killed: list[list[int]], stop: threading.Event) -> None:
    """Once step GROW_AFTER is in metrics.jsonl, ask for 3 env ranks (`kuberl scale`'s request); once step
    KILL_AFTER is, SIGKILL one env worker: the next step's rollout is under way."""
    grown = False
    while not stop.wait(0.05):
        done = len(read_jsonl(out / "metrics.jsonl"))
        if done >= GROW_AFTER and not grown:
            write_request(out, "env", 3)
            grown = True
        if done >= KILL_AFTER and (pids := env_worker_pids()):
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids)
            return


def mean(rows: list[dict], key: str = "reward_mean") -> float:
    return sum(r[key] for r in rows) / len(rows)


def test_a_two_turn_environment_is_learned_on_ray(ray_session, tmp_path, caplog):
    # the module as the Ray workers import it (the repository's root is on their path, as for examples.remax)
    job = load_example("agent.yaml", **{"environment.module": "examples.letter_env"})
    killed: list[list[int]] = []
    stop = threading.Event()
    killer = threading.Thread(target=grow_then_kill, args=(tmp_path, killed, stop), daemon=True)
    killer.start()
    t0 = time.perf_counter()
    try:
        run_job(job, tmp_path, backend="ray", progress=False)
    finally:
        stop.set()
        killer.join()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, job.spec.trainer.steps + 1))
    first, last = mean(rows[:10]), mean(rows[-10:])
    print(f"agent reward first10={first:.3f} last10={last:.3f} in {time.perf_counter() - t0:.0f}s")
    assert last - first >= 0.05 and last >= 2 * first
    # grown live to 3 env processes; one killed after step KILL_AFTER: only the env role restarted, once; the
    # trajectories it held in that step failed alone (counted), every other step's none
    assert "scaled env from 2 to 3 ranks after step" in caplog.text and "other roles untouched" in caplog.text
    assert len(killed) == 1 and len(killed[0]) == 3 and rows[-1]["restarts_env"] == 1
    assert all(rows[-1][f"restarts_{r}"] == 0 for r in ("actor", "ref", "reward"))
    (rec,) = [(r["step"], rec) for r in rows for rec in r.get("recoveries", [])]
    print(f"env killed after step {KILL_AFTER}: recovered in step {rec[0]}, {rec[1]['reason']}, "
          f"{rows[rec[0] - 1]['env_failed']:.0f} trajectories failed, step took {rows[rec[0] - 1]['time_step_s']:.1f}s")
    assert rec[0] == KILL_AFTER + 1 and rec[1]["role"] == "env" and rec[1]["reason"] == "WorkerDied"
    assert all(r["env_failed"] == 0.0 for r in rows if r["step"] != KILL_AFTER + 1)
    assert all(r["env_turns_mean"] == 2.0 and r["env_truncated"] == 0.0 for r in rows)
    # the reward is the environment's alone (reward.function: environment)
    assert all(abs(r["env_reward_mean"] - r["reward_mean"]) < 1e-6 for r in rows)
    # the timeline has the environment's calls on a row of their own, inside the actor's rollout
    for r in rows:
        rollout = next(s for s in r["timeline"] if (s["role"], s["phase"]) == ("actor", "rollout"))
        env = [s for s in r["timeline"] if s["role"] == "env"]
        assert {s["phase"] for s in env} == {"env_reset", "env_step"}
        assert all(rollout["start_s"] <= s["start_s"] < s["end_s"] <= rollout["end_s"] for s in env)
    assert (tmp_path / "timeline.png").exists()


def test_an_env_rank_whose_hung_calls_hold_its_slots_is_restarted(ray_session, tmp_path):
    """One env rank with 2 call slots; an environment's step hangs for good in step 3. Its trajectory fails
    after timeoutSeconds; once the call has run past the actor's wait too, a step-end check finds it and restarts
    the env role alone (WorkerHung, naming the slots), which frees the thread; no other step loses a trajectory."""
    marker, hang_at, steps = tmp_path / "hung", 3, 10  # 1.6 s a step at least after the hang: found by step 8
    letters = [{"prompt": f"say {c}:", "answer": c, "hang": str(marker)} for c in "abcdefgh"]
    rows = letters * (hang_at - 1) + [letters[0] | {"hang_here": True}] + letters * (steps - hang_at + 1)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = load_example("agent.yaml", **{
        "environment.module": "tests.integration.hanging_env", "environment.class": "HangsOnce",
        "environment.timeoutSeconds": 2, "environment.concurrency": 2, "roles.env.replicas": 1,
        "data.task": None, "data.files": [str(data)], "data.shuffle": False, "trainer.steps": steps})
    run_job(job, tmp_path / "out", backend="ray", progress=False)
    out = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in out] == list(range(1, steps + 1)) and marker.exists()
    recs = [(r["step"], rec) for r in out for rec in r.get("recoveries", [])]
    print(f"hung env call in step {hang_at}: recoveries {[(s, rec['role'], rec['reason']) for s, rec in recs]}; "
          f"env_failed per step {[r['env_failed'] for r in out]}")
    ((step, rec),) = recs
    assert step > hang_at and rec["role"] == "env" and rec["reason"] == "WorkerHung" and rec["detect_s"] > 7
    assert "1 of its 2 environment call slots held by calls running past timeoutSeconds (2s)" in rec["detail"]
    assert out[-1]["restarts_env"] == 1 and all(out[-1][f"restarts_{r}"] == 0 for r in ("actor", "ref"))
    assert out[hang_at - 1]["env_failed"] >= 1
    assert all(r["env_failed"] == 0.0 for r in out if r["step"] != hang_at)
