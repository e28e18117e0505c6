"""A user's own job end to end on CPU: job identity and resume, preflight, bring-your-own reward and data,
export to a Hugging Face folder, held-out evaluation, TensorBoard, hub ids from the local cache."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from kuberl.metrics import read_jsonl

from .conftest import REPO, load_example
from .probes import PROBED, Probes


def kuberl(*args: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kuberl.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600, env=full_env
    )


def write_job(path: Path, base: str = "quickstart.yaml", **spec_changes) -> Path:
    obj = yaml.safe_load((REPO / "examples" / base).read_text())
    for dotted, value in spec_changes.items():
        node = obj
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(obj))
    return path


def test_another_job_or_spec_is_refused_then_resume_and_finish(netns, tmp_path: Path) -> None:
    """quickstart then grpo into one folder: refused before anything is written; resume says so; a
    finished job says it is finished; the closing summary covers the whole run."""
    out = tmp_path / "out"
    first = kuberl(
        "run", "examples/quickstart.yaml", "--steps", "2", "--backend", "local", "--no-progress", "--out", str(out)
    )
    assert first.returncode == 0, first.stderr
    before = (out / "metrics.jsonl").read_text()
    ident = json.loads((out / "checkpoints" / "job.json").read_text())
    assert (
        ident["name"] == "quickstart" and len(ident["fingerprint"]) == 16 and "spec.algorithm.name" in ident["fields"]
    )

    other = kuberl(
        "run", "examples/grpo.yaml", "--steps", "4", "--backend", "local", "--no-progress", "--out", str(out)
    )
    assert other.returncode == 1 and other.stderr.count("\n") == 1 and "Traceback" not in other.stderr
    assert "holds the checkpoints of job 'quickstart' (up to step 2), not of 'grpo'" in other.stderr
    assert "--out" in other.stderr and "--restart" in other.stderr
    changed = kuberl(
        "run", "examples/quickstart.yaml", "--set", "roles.actor.optim.lr=0.01", "--backend", "local", "--out", str(out)
    )
    assert changed.returncode == 1 and "spec.trainer.actorLr 0.003 -> 0.01" in changed.stderr
    assert (out / "metrics.jsonl").read_text() == before and json.loads(
        (out / "checkpoints" / "job.json").read_text()
    ) == ident

    resumed = kuberl(
        "run", "examples/quickstart.yaml", "--steps", "3", "--backend", "local", "--no-progress", "--out", str(out)
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "[quickstart] resuming from step 2" in resumed.stdout
    assert "done: job 'quickstart', 3 steps (steps 3-3 in this run); reward_mean first3=" in resumed.stdout
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]

    again = kuberl("run", "examples/quickstart.yaml", "--steps", "3", "--backend", "local", "--out", str(out))
    assert again.returncode == 0 and again.stdout.startswith(
        f"job 'quickstart' is already finished: 3/3 steps in {out}"
    )
    assert f"model in {out / 'model'}" in again.stdout and "reward_mean first3=" in again.stdout

    restart = kuberl(
        "run",
        "examples/grpo.yaml",
        "--steps",
        "1",
        "--backend",
        "local",
        "--no-progress",
        "--out",
        str(out),
        "--restart",
    )
    assert restart.returncode == 0, restart.stderr
    assert (
        "--restart: removed" in restart.stdout
        and json.loads((out / "checkpoints" / "job.json").read_text())["name"] == "grpo"
    )
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1] and "time_values_s" not in read_jsonl(
        out / "metrics.jsonl"
    )[0]


def test_default_output_folder_is_per_job(netns, tmp_path: Path) -> None:
    job = write_job(tmp_path / "mine.yaml", metadata__name="my-job", spec__trainer__steps=1)
    proc = kuberl("run", str(job), "--backend", "local", "--no-progress", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "runs" / "my-job" / "checkpoints" / "job.json").is_file()
    assert (tmp_path / "runs" / "my-job" / "model" / "model.safetensors").is_file()


def test_a_local_run_starts_a_ray_of_its_own_where_another_clusters_address_file_is_left(netns, tmp_path: Path) -> None:
    """`ray start` leaves /tmp/ray/ray_current_cluster, and Ray's own default joins the cluster it names: a local run
    (no --ray-address) starts a private Ray anyway. Seen here: a stale file failed every local run."""
    marker = Path("/tmp/ray/ray_current_cluster")
    if marker.exists():
        pytest.skip(f"{marker} is there already (a Ray cluster of someone's): not this test's to replace")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("127.0.0.1:9\n")  # a cluster that is not there
    try:
        job = write_job(tmp_path / "mine.yaml", metadata__name="own-ray", spec__trainer__steps=1)
        proc = kuberl("run", str(job), "--no-progress", "--out", str(tmp_path / "run"), cwd=tmp_path)
    finally:
        marker.unlink(missing_ok=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: job 'own-ray', 1 steps" in proc.stdout


BAD_INPUTS = [  # (spec changes, the field the one error line names)
    ({"spec__data": {"files": ["/nonexistent/prompts.jsonl"]}}, "spec.data.files[0]"),
    ({"spec__reward": {"function": "no_such_pkg.rewards:score"}}, "spec.reward.function"),
    ({"spec__reward": {"function": "kuberl.rewards.builtin:no_such_fn"}}, "spec.reward.function"),
    ({"spec__data__batch_size": 4}, "spec.data.batch_size"),
    ({"spec__tracking": {"wandb": {"project": "p"}}}, "spec.tracking.wandb"),
]


@pytest.mark.parametrize("changes, field", BAD_INPUTS)
def test_bad_jobs_fail_in_about_a_second_before_ray(netns, tmp_path: Path, changes: dict, field: str) -> None:
    import importlib.util

    if field == "spec.tracking.wandb" and importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here: its absence cannot be shown")
    job = write_job(tmp_path / "job.yaml", **changes)
    for cmd in (["validate", str(job)], ["run", str(job), "--out", str(tmp_path / "out")]):
        t0 = time.perf_counter()
        proc = kuberl(*cmd)
        elapsed = time.perf_counter() - t0
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {field}: ") and "fix:" in lines[0], proc.stderr
        assert elapsed < 5.0, f"{cmd[0]} took {elapsed:.1f}s to refuse a bad job"  # no torch, no Ray: ~0.5 s idle
    assert not (tmp_path / "out").exists()  # nothing half-created


def test_byo_reward_next_to_manifest_gets_the_row_and_its_errors_name_the_line(netns, tmp_path: Path) -> None:
    """`kuberl run` on Ray from another folder: the manifest's folder is importable (by the Ray workers
    too), the reward sees the row's extra fields, and a raise in it names the user's file, line and sample.
    The driver's report for the job's status (its progress file, as in a driver pod) names the same file, line
    and sample, but holds neither the exception's message nor any prompt or response text."""
    job_dir = tmp_path / "myjob"
    job_dir.mkdir()
    (job_dir / "myreward.py").write_text(
        "def score(response, row):\n"
        "    if row['level'] == 'boom':\n"
        "        raise KeyError('no judge for ' + row['level'])\n"
        "    return response.count(row['want']) / max(len(response), 1)\n"
    )
    rows = [{"prompt": f"Say {c}:", "want": c, "level": "boom" if i == 6 else "easy"} for i, c in enumerate("abcdabcd")]
    (job_dir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = write_job(
        job_dir / "job.yaml",
        spec__data={"files": [str(job_dir / "train.jsonl")], "batchSize": 4, "shuffle": False},
        spec__reward={"function": "myreward:score"},
        spec__trainer={"steps": 2, "miniBatchSize": 4, "microBatchSize": 4},
    )
    reports = tmp_path / "progress"
    reports.mkdir()
    proc = kuberl("run", str(job), "--no-progress", "--out", str(tmp_path / "out"),  # from the repository root
                  env={"KUBERL_PROGRESS_DIR": str(reports)})
    assert proc.returncode == 3, proc.stderr
    assert [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl")] == [1]  # step 1 scored every row
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert "myreward:score raised KeyError: 'no judge for boom'" in line and "Traceback" not in proc.stderr
    assert f"at {job_dir / 'myreward.py'}:3 (in score)" in line and f"on sample {job_dir / 'train.jsonl'}:7" in line
    assert "Say " in line  # the log shows the sample
    report = json.loads((reports / "progress.json").read_text())
    assert report["phase"] == "Failed" and report["reason"] == "RoleError", report
    public = report["message"]
    assert "myreward:score raised KeyError" in public and f"on sample {job_dir / 'train.jsonl'}:7" in public, public
    assert "no judge" not in public and "Say " not in public and "boom" not in public, public


def actor_logits(state: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    from kuberl.spec.model import ModelSource
    from kuberl.training.models import load_causal_lm

    model = load_causal_lm(ModelSource(builtin="tiny")).eval()
    model.load_state_dict(state, strict=False)
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_export_of_a_two_rank_checkpoint_loads_with_transformers(ray_session, tmp_path: Path) -> None:
    """Two FSDP ranks write the actor's DCP checkpoint; the exported folder's logits equal the actor's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kuberl.controller.driver import Driver
    from kuberl.resilience.identity import Identity
    from kuberl.training.export import export
    from kuberl.workers.groups import RayWorkerGroup

    job = load_example(
        "quickstart.yaml", **{"trainer.steps": 2, "roles.actor.replicas": 2, "trainer.microBatchSize": 8}
    )
    out = tmp_path / "run"
    Identity.of("two-ranks", job.spec).write(out / "checkpoints")
    driver = Driver(job.spec, "two-ranks", out,
                    lambda role: RayWorkerGroup(role, job.spec, worker_cls=PROBED.get(role)), progress=False)
    driver.start()
    try:
        driver.run()
        trained = driver.roles.actor.call(Probes.full_state_dict)[0]
    finally:
        driver.shutdown()
    assert export(out, tmp_path / "hf") == 2
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = tok(["say a: aaaa", "say Q"], padding=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, actor_logits(trained, ids), rtol=0, atol=0)
    assert {p.name for p in (tmp_path / "hf").iterdir()} >= {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "kuberl_export.json",
    }
    step1 = kuberl("export", str(out), "--step", "1", "--out", str(tmp_path / "hf1"))  # interval 2: only step 2 is kept
    assert step1.returncode == 1 and "--step 1: no complete checkpoint of that step" in step1.stderr


def tfevents_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """Scalars of TensorBoard event files (TFRecord framing: length, crc, Event proto, crc)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, dict[int, float]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                out.setdefault(value.tag, {})[event.step] = value.simple_value
    return out


def test_eval_and_tensorboard(netns, tmp_path: Path) -> None:
    """spec.data.eval: greedy answers to a held-out split every interval and at the end, scored by the
    job's reward, as eval_reward_mean in metrics.jsonl, TensorBoard (same scalars) and the PNG."""
    job = write_job(tmp_path / "job.yaml", spec__trainer__steps=3, spec__data__eval={"interval": 2, "maxPrompts": 6})
    proc = kuberl("run", str(job), "--backend", "local", "--no-progress", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    assert ["eval_reward_mean" in r for r in rows] == [False, True, True]  # interval 2, and the last step
    assert 0.0 <= rows[1]["eval_reward_mean"] <= 1.0 and rows[1]["time_eval_s"] > 0
    assert "eval_reward_mean=" in proc.stdout
    tb = tfevents_scalars(tmp_path / "out" / "tensorboard")
    for row in rows:
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                assert tb[key][row["step"]] == pytest.approx(value, rel=1e-6), key
    assert (tmp_path / "out" / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"


def write_hub_cache(cache: Path, repo_id: str) -> Path:
    """A small model and tokenizer under the Hugging Face hub cache layout (models--org--name/...)."""
    from kuberl.spec.model import ModelSource
    from kuberl.training.models import char_tokenizer, load_causal_lm

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / revision
    load_causal_lm(ModelSource(builtin="tiny")).save_pretrained(snap)
    char_tokenizer().save_pretrained(snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    return snap


def test_hub_id_loads_from_the_local_cache_offline(netns, tmp_path: Path) -> None:
    write_hub_cache(tmp_path / "hub", "kuberl-test/tiny-char")
    job = write_job(tmp_path / "job.yaml", spec__model={"hub": "kuberl-test/tiny-char"}, spec__trainer__steps=1)
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    for cmd in (
        ["validate", str(job)],
        ["run", str(job), "--backend", "local", "--no-progress", "--out", str(tmp_path / "out")],
    ):
        proc = kuberl(*cmd, env=env)
        assert proc.returncode == 0, proc.stderr
    assert read_jsonl(tmp_path / "out" / "metrics.jsonl")[0]["step"] == 1
    missing = write_job(tmp_path / "missing.yaml", spec__model={"hub": "kuberl-test/not-cached"})
    proc = kuberl("validate", str(missing), env=env)
    assert proc.returncode == 1 and proc.stderr.startswith("error: spec.model.hub: cannot load the tokenizer")


def test_unknown_characters_are_warned_once_with_the_count(netns, tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps({"prompt": f"café {i} é", "answer": "a"}) + "\n" for i in range(4))
    )
    job = write_job(
        tmp_path / "job.yaml",
        spec__data={"files": [str(tmp_path / "p.jsonl")], "batchSize": 4},
        spec__trainer={"steps": 1, "miniBatchSize": 4, "microBatchSize": 4},
    )
    proc = kuberl("run", str(job), "--backend", "local", "--no-progress", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "does not know" in line]
    assert warnings == [
        "warning: the prompts hold 8 characters that the built-in tokenizer does not know ('é' x8); "
        "they become <unk> (it covers printable ASCII, newline and tab)"
    ]
