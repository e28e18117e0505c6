"""What the state writes cost per PPO step: per-step snapshots (zero lost steps) and asynchronous checkpoints.

    PYTHONPATH=runtime python bench/saves.py --quick                     # CPU smoke (a test runs it)
    PYTHONPATH=runtime python bench/saves.py --device cpu --steps 8      # CPU, the quickstart's shape
    PYTHONPATH=runtime python bench/saves.py --device cuda --model qwen2-0.5b --steps 5 --batch 16 \\
        --prompt-len 64 --response-len 64                                # H200, about a minute

Full PPO steps through the runtime's Driver, in-process (LocalWorkerGroup, no Ray), one fresh driver
per variant, in one process:
    off               no snapshots, no checkpoints: the baseline step
    snapshots         a per-step snapshot of actor and critic (kuberl.resilience.snapshots: each rank's shards copied
                      in a background thread into a memory-mapped slot file, in host memory for GPU roles, beside the
                      next step's rollout, reward, ref and values; the role's next update waits for it). What it
                      puts on the training path is timed inside the run (staging, and the next update's wait for
                      a copy still in flight); the copy alone is also timed apart from the step (whole-step
                      medians are noisy on a busy machine)
    snapshots_unchunked   the same, each GPU copy queued whole instead of in `snapshots.CHUNK_BYTES` pieces (the
                      training stream's small copies then wait behind it)
    checkpoint_sync   a checkpoint every step, each waited for before the step ends (DCP writes blocking)
    checkpoint_async  a checkpoint every step, its writes overlapping the next step (the runtime's way)
Per variant (after a 2-step warm-up run): the median step time over the steps between the first and the
last (every variant checkpoints its last step), and its overhead over `off`. Prints
one JSON line per variant, then a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ppo_step import build_spec, write_prompts  # noqa: E402

from kuberl.controller.driver import Driver  # noqa: E402
from kuberl.resilience import snapshots  # noqa: E402
from kuberl.workers.groups import LocalWorkerGroup  # noqa: E402

CHUNK_BYTES = snapshots.CHUNK_BYTES

VARIANTS = ("off", "snapshots", "checkpoint_sync", "checkpoint_async")
EXTRA = ("snapshots_unchunked",)  # named with --variants only


class SyncCheckpoints(Driver):
    """Each checkpoint written to the end before the step ends, as a blocking DCP save would."""

    def save_checkpoint(self, data_state=None) -> None:
        super().save_checkpoint(data_state)
        self.roles.commit()


def run_variant(name: str, args, data: Path, out: Path) -> dict:
    spec = build_spec(args, data)
    every = name.startswith("checkpoint")
    trainer = spec.trainer.model_copy(update={"checkpoint": spec.trainer.checkpoint.model_copy(
        update={"interval": 1 if every else 10_000, "keep": 1})})
    resilience = spec.resilience.model_copy(update={"snapshots": "on" if name.startswith("snapshots") else "off"})
    snapshots.CHUNK_BYTES = 1 << 62 if name == "snapshots_unchunked" else CHUNK_BYTES
    spec = spec.model_copy(update={"trainer": trainer, "resilience": resilience})
    cls = SyncCheckpoints if name == "checkpoint_sync" else Driver
    driver = cls(spec, f"saves-{name}", out, lambda role: LocalWorkerGroup(role, spec, args.device), progress=False)
    driver.start()
    try:
        t0 = time.perf_counter()
        records = driver.run()
        wall = time.perf_counter() - t0
        direct = {**on_path(driver, len(records)), **snapshot_costs(driver)} if name.startswith("snapshots") else {}
    finally:
        driver.shutdown()
    timed = records[1:-1] or records  # not the first (warm-up) nor the last (a final checkpoint in every variant)
    steps = [r.step_s for r in timed]
    ckpt = [r.phases.get("checkpoint", 0.0) for r in timed]
    phases = {k: round(statistics.median(r.phases.get(k, 0.0) for r in timed), 4) for k in timed[0].phases}
    return {"variant": name, "step_s_median": statistics.median(steps), "step_s_all": [r.step_s for r in records],
            "phase_s_median": phases,
            "checkpoint_phase_s_median": statistics.median(ckpt) if ckpt else 0.0, "wall_s": wall, **direct}


def on_path(driver: Driver, steps: int) -> dict[str, float]:
    """Per step, summed over actor and critic: the seconds the snapshots took on the training path during the
    run (staging after each update; the next update's wait for a copy still in flight)."""
    savers = {role: driver.groups[role].worker.trainer.saver for role in ("actor", "critic")}
    return {"snapshot_staged_s_per_step": sum(s.staged_s for s in savers.values()) / steps,
            "snapshot_waited_s_per_step": sum(s.waited_s for s in savers.values()) / steps,
            "snapshot_copies_s": {role: [round(c, 4) for c in s.copies_s] for role, s in savers.items()}}


def snapshot_costs(driver: Driver, reps: int = 10) -> dict[str, float]:
    """The snapshot itself, per step, timed apart from the step (whole-step medians are noisy on a busy
    machine): staging (on the training path) and the background copy, summed over actor and critic."""
    stage, write = [], []
    for _ in range(reps):
        s = w = 0.0
        for role in ("actor", "critic"):
            trainer = driver.groups[role].worker.trainer
            t0 = time.perf_counter()
            trainer.saver.snapshot(trainer.model, trainer.optimizer.optimizer, trainer.trained_step)
            t1 = time.perf_counter()
            trainer.saver.wait()
            s, w = s + t1 - t0, w + time.perf_counter() - t1
        stage.append(s)
        write.append(w)
    return {"snapshot_stage_s_median": statistics.median(stage), "snapshot_write_s_median": statistics.median(write)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CPU smoke: tiny model, 3 steps, small batch")
    ap.add_argument("--model", default="tiny", choices=["tiny", "qwen2-0.5b", "qwen2-1.5b"])
    ap.add_argument("--device", default="cpu", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--response-len", type=int, default=8)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    if unknown := set(args.variants.split(",")) - {*VARIANTS, *EXTRA}:
        ap.error(f"unknown --variants {', '.join(sorted(unknown))}: choose from {', '.join(VARIANTS + EXTRA)}")
    if args.quick:
        args.model, args.device, args.steps, args.batch, args.prompt_len, args.response_len = "tiny", "cpu", 3, 8, 8, 8
        args.micro = 8
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: use --device cpu")
    # build_spec's other knobs: the rollout as transformers runs it (no compile: one variant must not pay for it)
    args.engine, args.mini, args.no_fast_rollout, args.gpu_memory_utilization, args.no_sleep = "hf", 0, True, 0.25, True
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        write_prompts(data, max(256, args.batch * (args.steps + 1)), args.prompt_len)
        run_variant("off", argparse.Namespace(**{**vars(args), "steps": 2}), data, Path(tmp) / "warm-up")
        for i, name in enumerate(args.variants.split(",")):  # a variant may be named twice (noise)
            row = run_variant(name, args, data, Path(tmp) / f"{i}-{name}")
            row.update(model=args.model, device=device, torch=torch.__version__, batch=args.batch,
                       prompt_len=args.prompt_len, response_len=args.response_len, steps=args.steps)
            rows.append(row)
            print(json.dumps(row), flush=True)
    offs = [r["step_s_median"] for r in rows if r["variant"] == "off"]
    base = statistics.median(offs) if offs else None  # a variant named twice: the median of its runs
    print(f"\n{args.model} on {device}, batch {args.batch} x ({args.prompt_len} + {args.response_len}) tokens, "
          f"{args.steps} steps (median of steps 2-{max(2, args.steps - 1)})")
    print("| variant | step s (median) | overhead vs off | checkpoint phase s |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        over = f"{100 * (r['step_s_median'] / base - 1):+.1f}%" if base else "-"
        print(f"| {r['variant']} | {r['step_s_median']:.3f} | {over} | {r['checkpoint_phase_s_median']:.3f} |")
    for r in rows:
        if "snapshot_stage_s_median" in r and base:
            st, wa = r["snapshot_staged_s_per_step"], r["snapshot_waited_s_per_step"]
            wr = r["snapshot_write_s_median"]
            print(f"\nsnapshots per step (actor + critic), in the run: staging {1000 * st:.1f} ms and waits for a "
                  f"copy {1000 * wa:.1f} ms on the training path = {100 * (st + wa) / base:.2f}% of the `off` step; "
                  f"the copy itself (timed apart) {1000 * wr:.1f} ms, {100 * wr / base:.2f}% if it overlapped nothing")


if __name__ == "__main__":
    main()
