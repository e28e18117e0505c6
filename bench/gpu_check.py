"""`make gpu-check`: the GPU tests and the key GPU figures, held to the baseline kept in the repository
(bench/gpu_baseline.json). The four units fit one device call: 481 s on a fresh H100 (2026-12-07: the GPU tests
182 s, the fast path 33 s, the PPO units 87 s and 179 s), about 420 s on an H200. A unit whose estimate does not fit
the budget left is skipped, and its figures then fail the check; run the rest with `--units` in a second call and
read both results (`--table A B`).

    python3 bench/gpu_check.py --out $OUT                      # on the device: run, compare, print the table
    python3 bench/gpu_check.py --out $OUT --update-baseline --reason "why the figures moved"
    python3 bench/gpu_check.py --table $OUT/results.jsonl      # the table again, from a run's results

The units (bench/compare_rollout.py's runner: each a subprocess with its own timeout):
  - `pytest -m gpu tests/gpu`: every GPU test must pass;
  - the hf fast path at 0.5B, B=256, top_p 1.0 and 0.9 (bench/rollout.py);
  - the PPO step at 0.5B and at 1.5B (bench/ppo_step.py, 8 steps, 64 x (128 + 384) tokens, checkpoints at steps 4
    and 8): its steady median, the checkpoint's cost per save on the training path (the worst of the two), and the
    actor's train step as the runtime runs it (MFU, 6NT).

A figure more than 10 % worse than its baseline fails the check (exit 1), as does a failed GPU test or a figure
that was not measured. Each kind of GPU has its own baseline (the device call may give an H100 or an H200, which
differ by about a fifth in memory-bound figures): a run is compared with its own device's only, and where that has
none, its figures say "no baseline". The baseline changes only with --update-baseline and a reason, both kept in
the file, with the host it was measured on. Each run records its host first (`host_figures`: the CPU, its cores,
and one core's Python and host-copy speed) and says under the table whether the baseline's was another (2026-12-07:
two H100 hosts, one tree, gave PPO steps 18-27 % apart while the memory-bound fast path agreed within 0.2 %).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_rollout import PPO, PY, REPO, Runner, Unit, load, roll  # noqa: E402

BASELINE = REPO / "bench" / "gpu_baseline.json"
TOLERANCE = 0.10  # worse by more than this fraction of the baseline: a regression
BUDGET_S = 540  # one device call is at most 10 minutes: the rest is the machine's start and the transfers
# the PPO bench with the actor's train step as the runtime runs it, median of 5, and a periodic checkpoint at step 4
# (and the last step's): the steps after it show whether its writes stall training
PPO_TRAIN = [*(a for a in PPO if a != "--no-train-bench"), "--train-reps", "5", "--no-ab", "--checkpoint-interval", "4"]

UNITS = [
    Unit("gpu-tests", "hf", 210, [PY, "-m", "pytest", "-q", "-rs", "-m", "gpu", "tests/gpu", "-s",
                                  "-p", "no:cacheprovider"], "tests"),
    Unit("hf-0.5b", "hf", 45, roll("--engine", "hf", "--model", "qwen2-0.5b", "--batch", "256", "--top-p", "1.0,0.9",
                                   "--variants", "fast")),
    Unit("ppo-0.5b", "hf", 100, [*PPO_TRAIN, "--model", "qwen2-0.5b"], "ppo"),
    Unit("ppo-1.5b", "hf", 205, [*PPO_TRAIN, "--model", "qwen2-1.5b"], "ppo"),
]


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str  # its unit of measure, for the table
    higher_is_better: bool
    read: Callable[[list[dict]], float | None]  # from the run's result rows


def _throughput(model: str, batch: int, top_p: float) -> Callable[[list[dict]], float | None]:
    def read(rows: list[dict]) -> float | None:
        found = [r["tokens_per_s"] for r in rows if r.get("kind") == "throughput" and r.get("variant") == "fast"
                 and r.get("model") == model and r.get("batch") == batch and float(r.get("top_p", -1)) == top_p]
        return found[-1] if found else None
    return read


def _ppo(model: str, pick: Callable[[dict], float | None]) -> Callable[[list[dict]], float | None]:
    def read(rows: list[dict]) -> float | None:
        found = [r["summary"] for r in rows if r.get("kind") == "ppo" and r.get("args", {}).get("model") == model]
        return pick(found[-1]) if found else None
    return read


def _mfu(summary: dict) -> float | None:
    runtime = (summary.get("train_step") or {}).get("runtime")
    return runtime["mfu_6nt"] if runtime else None


def _checkpoint(summary: dict) -> float | None:
    saves = list((summary.get("checkpoint_s") or {}).values())
    return max(saves) if saves else None


FIGURES = [
    Figure("hf fast path 0.5B B=256 top_p 1.0", "tokens/s", True, _throughput("qwen2-0.5b", 256, 1.0)),
    Figure("hf fast path 0.5B B=256 top_p 0.9", "tokens/s", True, _throughput("qwen2-0.5b", 256, 0.9)),
    Figure("train-step MFU 0.5B (6NT)", "fraction", True, _ppo("qwen2-0.5b", _mfu)),
    Figure("train-step MFU 1.5B (6NT)", "fraction", True, _ppo("qwen2-1.5b", _mfu)),
    Figure("PPO steady step 0.5B", "s", False, _ppo("qwen2-0.5b", lambda s: s.get("step_s"))),
    Figure("PPO steady step 1.5B", "s", False, _ppo("qwen2-1.5b", lambda s: s.get("step_s"))),
    Figure("checkpoint per save 0.5B", "s", False, _ppo("qwen2-0.5b", _checkpoint)),
    Figure("checkpoint per save 1.5B", "s", False, _ppo("qwen2-1.5b", _checkpoint)),
]


def measured(rows: list[dict]) -> dict[str, float | None]:
    return {f.name: f.read(rows) for f in FIGURES}


def change(figure: Figure, value: float, base: float) -> float:
    """How much worse ``value`` is than ``base``, as a fraction of it (negative: better)."""
    return (base - value) / base if figure.higher_is_better else (value - base) / base


def tests_outcome(rows: list[dict]) -> tuple[bool, str]:
    """(passed, pytest's summary line) of the GPU tests' unit."""
    unit = [r for r in rows if r.get("kind") == "unit" and r.get("unit") == "gpu-tests"]
    if not unit:
        return False, "not run"
    last = unit[-1]
    return last["rc"] == 0 and not last["timed_out"], last.get("summary") or f"rc {last['rc']}"


def verdicts(values: dict[str, float | None], baseline: dict[str, float]) -> list[tuple[Figure, str]]:
    out = []
    for f in FIGURES:
        value, base = values.get(f.name), baseline.get(f.name)
        if value is None:
            out.append((f, "FAIL: not measured"))
        elif base is None:
            out.append((f, "no baseline"))
        else:
            worse = change(f, value, base)
            out.append((f, f"FAIL: {worse:.0%} worse" if worse > TOLERANCE else "ok"))
    return out


def table(rows: list[dict], baseline: dict[str, float]) -> tuple[str, bool]:
    """The markdown table of a run against ``baseline``, and whether the check passes."""
    values = measured(rows)
    passed, summary = tests_outcome(rows)
    lines = ["| figure | measured | baseline | change | verdict |", "| --- | --- | --- | --- | --- |",
             f"| `pytest -m gpu tests/gpu` | {summary} | all pass | | {'ok' if passed else 'FAIL'} |"]
    ok = passed
    for f, verdict in verdicts(values, baseline):
        value, base = values[f.name], baseline.get(f.name)
        fmt = (lambda x: f"{x:.1%}") if f.unit == "fraction" else (lambda x: f"{x:,.0f}" if x > 100 else f"{x:.3f}")
        shown = fmt(value) if value is not None else "–"
        delta = f"{-change(f, value, base):+.1%}" if value is not None and base else ""
        lines.append(f"| {f.name} ({f.unit}) | {shown} | {fmt(base) if base else '–'} | {delta} | {verdict} |")
        ok = ok and not verdict.startswith("FAIL")
    return "\n".join(lines), ok


def host_figures() -> dict:
    """The machine beside the GPU, which moves the launch- and copy-bound figures (the PPO step, the checkpoint's
    training-path part) where the memory-bound fast path does not: the CPU's model and cores, and two short
    measurements on one core: Python's additions per second (millions) and a host copy of 256 MiB (GB/s)."""
    import torch

    cpu = platform.processor()
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    t, n = time.perf_counter(), 0
    for i in range(3_000_000):
        n += i
    python = 3.0 / (time.perf_counter() - t)
    src = torch.ones(256 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # the pages touched once before the timing
    t = time.perf_counter()
    for _ in range(4):
        dst.copy_(src)
    memcpy = 4 * src.numel() / (time.perf_counter() - t) / 1e9
    return {"kind": "host", "cpu": cpu, "cores": os.cpu_count(), "python_madds_per_s": python,
            "memcpy_gb_per_s": memcpy}


def last_host(rows: list[dict]) -> dict | None:
    """The run's `host_figures` row (the last one, where results were joined), or None."""
    return next((r for r in reversed(rows) if r.get("kind") == "host"), None)


def host_note(rows: list[dict], baseline: dict) -> str:
    """One line on this run's host against the baseline's: a different CPU, or one core more than 10 % apart in
    either measurement, says the figures compare two machines, not only two trees."""
    now, then = last_host(rows), baseline.get("host")
    if now is None:
        return "host: not recorded in these results"
    line = (f"host: {now['cpu']}, {now['cores']} cores, Python {now['python_madds_per_s']:.1f} M adds/s, "
            f"host copy {now['memcpy_gb_per_s']:.1f} GB/s")
    if then is None:
        return line + "; the baseline's host was not recorded"
    apart = now["cpu"] != then["cpu"] or any(abs(now[k] / then[k] - 1) > TOLERANCE
                                             for k in ("python_madds_per_s", "memcpy_gb_per_s"))
    verdict = (": ANOTHER HOST, so a launch- or copy-bound figure's change may be the machine's, not the code's "
               "(run the baseline's tree in the same lease to tell)" if apart else ": the same host kind")
    return line + (f"; the baseline's: {then['cpu']}, Python {then['python_madds_per_s']:.1f}, host copy "
                   f"{then['memcpy_gb_per_s']:.1f} GB/s{verdict}")


def read_baselines(path: Path = BASELINE) -> dict[str, dict]:
    """Device name (as torch names it) -> its baseline: measured (date), reason, figures."""
    return json.loads(path.read_text())["devices"] if path.exists() else {}


def read_baseline(device: str, path: Path = BASELINE) -> dict:
    """The baseline of `device`: figures are compared on the kind of GPU they were measured on only (an H100 and
    an H200 differ by a fifth in memory-bound figures), so another device's is no baseline."""
    return read_baselines(path).get(device, {"figures": {}})


def write_baseline(rows: list[dict], reason: str, device: str, path: Path = BASELINE) -> dict:
    """Write this run's figures as `device`'s baseline, the other devices' kept; returns the new entry."""
    values = {k: v for k, v in measured(rows).items() if v is not None}
    doc = {"measured": datetime.date.today().isoformat(), "reason": reason, "figures": values}
    host = last_host(rows)
    if host is not None:
        doc["host"] = {k: v for k, v in host.items() if k != "kind"}
    path.write_text(json.dumps({"devices": {**read_baselines(path), device: doc}}, indent=1) + "\n")
    return doc


def device_name(rows: Iterable[dict]) -> str:
    """The GPU the rows were measured on, as the fast-path and PPO benches name it."""
    named = (r.get("device") or (r.get("kind") == "ppo" and r["summary"].get("device")) for r in rows)
    return next((name for name in named if name), "unknown")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/gpu-check", help="folder for results.jsonl and log.txt")
    ap.add_argument("--table", metavar="RESULTS", nargs="+",
                    help="print the table of earlier runs' results.jsonl (the last measurement of a figure counts)")
    ap.add_argument("--units", default="", help=f"run only these, comma-separated: {', '.join(u.name for u in UNITS)}")
    ap.add_argument("--update-baseline", action="store_true", help="write this run's figures as the baseline")
    ap.add_argument("--reason", default="", help="why the baseline changes (required with --update-baseline)")
    args = ap.parse_args(argv)
    if args.update_baseline and not args.reason:
        print("error: --update-baseline needs --reason: say why the figures moved", file=sys.stderr)
        return 2
    if args.table:
        rows = load([Path(p) for p in args.table])
    else:
        runner = Runner(Path(args.out), BUDGET_S)
        runner.record(host_figures())
        for unit in (u for u in UNITS if not args.units or u.name in args.units.split(",")):
            runner.run(unit, vllm_ok=False)
        rows = load([runner.results])
    device = device_name(rows)
    baseline = read_baseline(device)
    text, ok = table(rows, baseline["figures"])
    others = ", ".join(sorted(set(read_baselines()) - {device})) or "none"
    print(f"\ngpu-check on {device}, baseline of {baseline.get('measured', 'none')} "
          f"({baseline.get('reason', f'no baseline for this device; other devices with one: {others}')}):")
    print(text)
    print(host_note(rows, baseline))
    if args.update_baseline:
        doc = write_baseline(rows, args.reason, device_name(rows))
        print(f"baseline written: {BASELINE.relative_to(REPO)} ({len(doc['figures'])} figures)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
