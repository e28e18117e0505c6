"""The rollout comparison of issues 16 and 19 (item 9) in one lease: run it unit by unit, then render its tables.

    python3 bench/compare_rollout.py list                                   # units, order, time estimates
    python3 bench/compare_rollout.py run --out $OUT --units hf-0.5b,tf-0.5b-cb
    python3 bench/compare_rollout.py run --out $OUT --part vllm --budget-s 470
    python3 bench/compare_rollout.py table results/*.jsonl                  # markdown for docs/performance.md
    python3 bench/compare_rollout.py run --quick --out /tmp/q               # CPU smoke test (what a test runs)

Each unit is one subprocess (bench/rollout.py, bench/ppo_step.py or pytest) with its own timeout, killed
with its process group when it runs over; its measurements are appended to OUT/results.jsonl as they are
made (a unit that dies keeps what it had written), a failed or timed-out unit is recorded and the next
one starts. Everything it prints goes to stdout as it comes (prefixed with the unit's name) and to
OUT/log.txt. `--budget-s` is the whole run's wall-clock budget: a unit starts only if its estimate fits
in what is left, and its timeout never passes the budget.

Units run in the order listed (most important first within each part). The `hf` part needs no vLLM;
the `vllm` part needs vLLM 0.26.0 (carried to the device by ../shared/tools/device-vllm). One vLLM
engine per model shape serves every vLLM measurement of that shape (start-up is ~45 s, torch.compile
and CUDA graphs on: the configuration the throughput figures are for); the engine tests use
enforce_eager (they test behaviour, and start in seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
ROLL = [PY, "bench/rollout.py"]
PPO = [PY, "bench/ppo_step.py", "--no-train-bench", "--steps", "8"]  # 5+ steady steps: bench/ppo_step.py


@dataclass
class Unit:
    name: str
    part: str                 # "hf" (no vLLM) or "vllm"
    estimate_s: int           # expected wall time on one H200 (a guess before the lease; see docs)
    argv: list[str]
    kind: str = "bench"       # bench (writes JSON lines itself), ppo (a --json summary) or tests (pytest)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def timeout_s(self) -> int:
        return int(self.estimate_s * 2 + 60)


def roll(*a: str) -> list[str]:
    return [*ROLL, *a]


FULL = ["--batch", "256,1024", "--top-p", "1.0,0.9"]
UNITS: list[Unit] = [
    # -- hf part: our fast path, transformers' own paths, the GPU tests, PPO with hf ----------------------
    Unit("gpu-tests", "hf", 150, [PY, "-m", "pytest", "-q", "-rs", "-m", "gpu", "tests/gpu", "-s"], "tests"),
    Unit("hf-0.5b", "hf", 80, roll("--engine", "hf", "--model", "qwen2-0.5b", *FULL, "--variants", "fast",
                                   "--profile")),
    Unit("tf-0.5b-cb", "hf", 60, roll("--engine", "hf", "--model", "qwen2-0.5b", "--batch", "256",
                                      "--top-p", "1.0,0.9", "--variants", "cb", "--repeats", "2")),
    Unit("tf-0.5b-static", "hf", 90, roll("--engine", "hf", "--model", "qwen2-0.5b", "--batch", "256",
                                          "--top-p", "1.0,0.9", "--variants", "generate-static", "--repeats", "1")),
    Unit("tf-0.5b-generate", "hf", 40, roll("--engine", "hf", "--model", "qwen2-0.5b", "--batch", "256",
                                            "--top-p", "1.0", "--variants", "generate")),
    Unit("hf-1.5b", "hf", 90, roll("--engine", "hf", "--model", "qwen2-1.5b", *FULL, "--variants", "fast",
                                   "--profile")),
    Unit("hf-0.5b-graphs", "hf", 30, roll("--engine", "hf", "--model", "qwen2-0.5b", "--batch", "256",
                                          "--top-p", "1.0", "--variants", "graphs", "--profile")),
    Unit("ppo-hf-0.5b", "hf", 100, [*PPO, "--model", "qwen2-0.5b", "--engine", "hf"], "ppo"),
    Unit("tf-0.5b-cb-b1024", "hf", 50, roll("--engine", "hf", "--model", "qwen2-0.5b", "--batch", "1024",
                                            "--top-p", "1.0,0.9", "--variants", "cb", "--repeats", "2")),
    Unit("tf-1.5b-cb", "hf", 80, roll("--engine", "hf", "--model", "qwen2-1.5b", *FULL, "--variants", "cb",
                                      "--repeats", "2")),
    Unit("tf-1.5b-static", "hf", 100, roll("--engine", "hf", "--model", "qwen2-1.5b", "--batch", "256",
                                           "--top-p", "1.0,0.9", "--variants", "generate-static", "--repeats", "1")),
    Unit("ppo-hf-1.5b", "hf", 160, [*PPO, "--model", "qwen2-1.5b", "--engine", "hf"], "ppo"),
    # -- vllm part: estimates hold a cold start (2026-12-07, a fresh H100: `LLM(...)` took 218 s with empty compile
    # caches; vllm-0.5b ran 313 s and still skipped its b1024 cells and sleep at its deadline) ------------------
    Unit("vllm-tests", "vllm", 240, [PY, "-m", "pytest", "-q", "-rs", "tests/unit/test_vllm_engine.py"], "tests"),
    Unit("vllm-0.5b", "vllm", 420, roll("--engine", "vllm", "--model", "qwen2-0.5b", *FULL, "--repeats", "2",
                                        "--sync", "--checks", "--sleep")),
    Unit("ppo-vllm-0.5b", "vllm", 300, [*PPO, "--model", "qwen2-0.5b", "--engine", "vllm"], "ppo"),
    Unit("vllm-1.5b", "vllm", 450, roll("--engine", "vllm", "--model", "qwen2-1.5b", *FULL, "--repeats", "2",
                                        "--sync", "--sleep")),
    Unit("ppo-vllm-1.5b", "vllm", 380, [*PPO, "--model", "qwen2-1.5b", "--engine", "vllm"], "ppo"),
    Unit("ppo-vllm-0.5b-nosleep", "vllm", 300, [*PPO, "--model", "qwen2-0.5b", "--engine", "vllm", "--no-sleep"],
         "ppo"),
]
QUICK: list[Unit] = [
    Unit("hf-quick", "hf", 60, roll("--quick")),
    Unit("ppo-quick", "hf", 60, [PY, "bench/ppo_step.py", "--no-train-bench", "--model", "tiny", "--device", "cpu",
                                 "--steps", "2", "--batch", "8", "--micro", "4", "--prompt-len", "16",
                                 "--response-len", "16"], "ppo"),
    Unit("vllm-quick", "vllm", 60, roll("--engine", "vllm", "--model", "tiny", "--batch", "4", "--new-tokens", "8",
                                        "--prompt-len", "8", "--sync", "--checks", "--sleep")),
]


# --------------------------------------------------------------------------- run


class Runner:
    def __init__(self, out: Path, budget_s: float):
        out.mkdir(parents=True, exist_ok=True)
        self.results, self.log = out / "results.jsonl", out / "log.txt"
        self.t0, self.budget_s = time.perf_counter(), budget_s

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0) if self.budget_s else float("inf")

    def record(self, row: dict) -> None:
        line = json.dumps(row, default=str)
        print(line, flush=True)
        with open(self.results, "a") as f:
            f.write(line + "\n")

    def say(self, text: str) -> None:
        print(text, flush=True)
        with open(self.log, "a") as f:
            f.write(text + "\n")

    def run(self, unit: Unit, vllm_ok: bool) -> None:  # noqa: C901 -- one branch per unit kind and outcome (skip, timeout, parse)
        if unit.part == "vllm" and not vllm_ok:
            self.record({"kind": "skipped", "unit": unit.name, "why": "vllm is not importable here"})
            return
        if unit.estimate_s > self.left():
            why = f"budget: {self.left():.0f} s left, estimate {unit.estimate_s} s"
            self.record({"kind": "skipped", "unit": unit.name, "why": why})
            return
        timeout = min(unit.timeout_s, self.left())
        argv = list(unit.argv)
        summary = None
        if unit.kind == "bench":
            argv += ["--jsonl", str(self.results), "--deadline-s", str(max(10, int(timeout - 45)))]
        elif unit.kind == "ppo":
            summary = Path(tempfile.mkdtemp()) / "ppo.json"
            argv += ["--json", str(summary)]
        env = {**os.environ, **unit.env, "PYTHONUNBUFFERED": "1", "KUBERL_NO_NETNS": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "runtime"), os.environ.get("PYTHONPATH")) if p)}
        self.say(f"=== {unit.name} ({unit.part}, estimate {unit.estimate_s} s, timeout {timeout:.0f} s): "
                 + " ".join(argv))
        t = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        tail: list[str] = []
        timed_out = False
        try:
            deadline = t + timeout
            assert proc.stdout is not None
            for line in proc.stdout:  # the child's output as it comes
                self.say(f"[{unit.name}] {line.rstrip()}")
                tail = (tail + [line.rstrip()])[-40:]
                if time.perf_counter() > deadline:
                    raise subprocess.TimeoutExpired(argv, timeout)
            proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # the unit and its children (vLLM's engine process)
            proc.wait()
        seconds = time.perf_counter() - t
        row = {"kind": "unit", "unit": unit.name, "rc": proc.returncode, "timed_out": timed_out, "seconds": seconds}
        if unit.kind == "tests":
            row["summary"] = next((x for x in reversed(tail) if " passed" in x or " failed" in x or "error" in x), "")
            row["tail"] = tail[-15:]
        if unit.kind == "ppo" and summary is not None and summary.exists():
            data = json.loads(summary.read_text())
            self.record({"kind": "ppo", "unit": unit.name, "args": data["args"], "summary": data["summary"]})
        elif proc.returncode:
            row["tail"] = tail[-15:]
        self.record(row)


def vllm_importable() -> bool:
    """Whether the units' interpreter finds vLLM (without importing it: that takes seconds)."""
    return subprocess.run([PY, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
                          capture_output=True).returncode == 0


def cmd_run(args) -> None:
    units = QUICK if args.quick else UNITS
    if args.units:
        names = args.units.split(",")
        unknown = [n for n in names if n not in {u.name for u in units}]
        if unknown:
            sys.exit(f"--units: unknown {', '.join(unknown)} (see `list`)")
        units = [u for n in names for u in units if u.name == n]
    elif args.part != "all":
        units = [u for u in units if u.part == args.part]
    runner = Runner(Path(args.out), args.budget_s)
    ok = vllm_importable() if any(u.part == "vllm" for u in units) else False
    for unit in units:
        runner.run(unit, ok)
    runner.say(f"=== done in {time.perf_counter() - runner.t0:.0f} s; results in {runner.results}")
    print(render(load([runner.results])))


def cmd_list(_args) -> None:
    for part in ("hf", "vllm"):
        units = [u for u in UNITS if u.part == part]
        print(f"{part} part: {sum(u.estimate_s for u in units)} s estimated")
        for u in units:
            print(f"  {u.name:24s} {u.estimate_s:4d} s  {' '.join(u.argv[1:])}")


# --------------------------------------------------------------------------- tables


def load(paths: list[Path]) -> list[dict]:
    rows = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def _k(x: float | None) -> str:
    return "–" if x is None else f"{x / 1000:,.1f}k"


def render(rows: list[dict]) -> str:  # noqa: C901 -- one table section per figure kind
    out: list[str] = []
    tput: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.get("kind") == "throughput":
            key = (r["model"], r["batch"], r["top_p"])
            tput.setdefault(key, {})[r["variant"]] = r["tokens_per_s"]
    cols = [("vllm-plain", "plain vLLM"), ("vllm-seeded", "vLLM, per-request seeds"),
            ("vllm-logprobs", "vLLM, seeds + drawn log-probs"),
            ("vllm-engine", "our vLLM engine"), ("fast", "our hf fast path"), ("graphs", "hf graphs, no compile"),
            ("generate", "transformers generate"), ("generate-static", "generate, static cache + compile"),
            ("cb", "transformers continuous batching")]
    if tput:
        out.append("| model | batch | top_p | " + " | ".join(c[1] for c in cols) + " | engine / plain vLLM | "
                   "best transformers / our fast path |")
        out.append("| --- " * (len(cols) + 5) + "|")
        for (model, batch, top_p), v in sorted(tput.items()):
            ratio = f"{v['vllm-engine'] / v['vllm-plain']:.1%}" if "vllm-engine" in v and "vllm-plain" in v else "–"
            tf = [v[c] for c in ("generate", "generate-static", "cb") if c in v]
            tf_ratio = f"{max(tf) / v['fast']:.1%}" if tf and "fast" in v else "–"
            out.append(f"| {model} | {batch} | {top_p} | " + " | ".join(_k(v.get(c)) for c, _ in cols)
                       + f" | {ratio} | {tf_ratio} |")
        out.append("")
    for r in rows:
        kind = r.get("kind")
        if kind == "sync" and r.get("variant") != "first":
            last = r.get("last", {})
            out.append(f"weight sync {r['model']} {r['variant']}: median {r['seconds_median']:.3f} s over "
                       f"{len(r['seconds_all'])} (copy+load {last.get('copy_and_load_s', 0):.3f} s, "
                       f"{last.get('buckets')} buckets, {last.get('bytes', 0) / 2**20:.0f} MiB)")
        elif kind == "checks":
            out.append(f"checks {r['model']}: new weights change output {r['new_weights_change_output']}; "
                       f"restored weights restore the model {r.get('restored_weights_restore_the_model')} "
                       f"(teacher-forced max |d log p|: same weights {r.get('logprob_gap_same_weights')}, restored "
                       f"{r.get('logprob_gap_restored')}, other weights {r.get('logprob_gap_other_weights')}); "
                       f"sampled tokens reproduced: restored {r['restored_weights_reproduce_output']}, same weights "
                       f"{r.get('same_weights_reproduce_output_fresh')}; prefix-cache tokens: first "
                       f"{r['cached_tokens_first']}, repeat {r['cached_tokens_repeat']}, after a sync "
                       f"{r['cached_tokens_after_sync']}, after restoring {r['cached_tokens_after_restore']}")
        elif kind == "sleep":
            out.append(f"sleep {r['model']}: device used awake {r['used_awake_gib']} GiB, asleep "
                       f"{r['used_asleep_gib']} GiB (freed {r['freed_gib']}), sleep {r['sleep_s']:.3f} s, "
                       f"wake+sync {r['wake_and_sync_s']:.3f} s")
        elif kind == "start":
            where = "this" if r["in_process"] else "its own"
            out.append(f"vLLM start {r['model']}: {r['seconds']:.1f} s (engine in {where} process)")
        elif kind == "profile":
            cats = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["by_category_us"].items(), key=lambda kv: -kv[1]))
            out.append(f"profile {r['model']} {r['variant']} b{r['batch']} p{r['top_p']}: "
                       f"{r['wall_us_per_step']:.0f} us per step wall, {r['kernel_us_per_step']:.0f} us kernels, "
                       f"{r['kernels_per_step']:.0f} kernels (us: {cats})")
        elif kind in ("error", "skipped") or (kind == "unit" and (r.get("rc") or r.get("timed_out"))):
            why = r.get("why") or r.get("error") or ("timed out" if r.get("timed_out") else f"exit {r.get('rc')}")
            out.append(f"{kind}: {r.get('unit') or r.get('model', '')} {r.get('variant', '')} {why}")
        elif kind == "unit" and "summary" in r:
            out.append(f"tests {r['unit']}: {r['summary']}")
    ppo = [r for r in rows if r.get("kind") == "ppo"]
    if ppo:
        phases = ["rollout", "reward", "ref", "values", "advantage", "update_critic", "update_actor", "weight_sync"]
        out.append("")
        out.append("| phase (s) | " + " | ".join(r["unit"] for r in ppo) + " |")
        out.append("| --- " * (len(ppo) + 1) + "|")
        for p in phases:
            out.append(f"| {p} | " + " | ".join(f"{r['summary']['phases_s'].get(p, 0):.3f}" for r in ppo) + " |")
        for key, label in (("step_s", "**step total**"), ("first_step_s", "first step"),
                           ("rollout_tokens_per_s", "rollout tokens/s"), ("gpu_peak_gib", "peak GiB, this process"),
                           ("device_peak_gib", "peak GiB, whole device (NVML)")):
            vals = [r["summary"].get(key) for r in ppo]
            cells = ["–" if v is None else f"{v:,.3f}" if v < 100 else f"{v:,.0f}" for v in vals]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def cmd_table(args) -> None:
    print(render(load([Path(p) for p in args.files])))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--part", default="all", choices=["all", "hf", "vllm"])
    r.add_argument("--units", default="", help="comma-separated unit names (overrides --part)")
    r.add_argument("--budget-s", type=float, default=0.0)
    r.add_argument("--quick", action="store_true", help="CPU smoke units (tiny model)")
    sub.add_parser("list")
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    {"run": cmd_run, "list": cmd_list, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main()
