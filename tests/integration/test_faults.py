"""Per-role failure recovery on CPU with real Ray: a role's worker process is SIGKILLed (or hangs) mid-step;
only that role's WorkerGroup is recreated, its state restored, and the interrupted phase replayed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kuberl.controller.driver import Driver, Fault, JobFailed
from kuberl.controller.proxies import ActorProxy
from kuberl.metrics import read_jsonl
from kuberl.metrics.record import Reason
from kuberl.resilience import checkpoint
from kuberl.spec.contract import PROGRESS_FILE, Env, ProgressDocument
from kuberl.workers.groups import LinkBroken, RayWorkerGroup, WorkerFailure

from .conftest import REPO, load_example
from .probes import PROBED, Probes

ROLES = ("actor", "critic", "ref", "reward")


STEP_CALLS = {"actor": ("generate", "update", "sync_weights"), "critic": ("compute_values", "update"),
              "ref": ("compute_ref_logprobs",), "reward": ("compute_scores",)}  # once per step each


class CountingGroup(RayWorkerGroup):
    """A RayWorkerGroup (with the test probes on trained roles) that counts how often it is (re)created
    and how often each step call is sent to it (a replay is a second send)."""

    starts: dict[str, int] = {}
    sent: dict[tuple[str, str], int] = {}

    def __init__(self, role, spec, **kw):
        super().__init__(role, spec, worker_cls=PROBED.get(role), **kw)

    def launch(self) -> None:
        CountingGroup.starts[self.role] = CountingGroup.starts.get(self.role, 0) + 1
        super().launch()

    def submit(self, fn, args=(), kwargs=None, fault=None):
        key = (self.role, fn.__name__)
        CountingGroup.sent[key] = CountingGroup.sent.get(key, 0) + 1
        return super().submit(fn, args, kwargs, fault)


class ProbingDriver(Driver):
    """Records, right after each restart, whether the actor's rollout engine holds the restored weights."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.roles.on_restart.append(self.probe)

    def probe(self, rec) -> None:
        group = self.groups[rec.role]
        trained, actor = rec.role in ("actor", "critic"), rec.role == "actor"
        self.after_restart = {"digest": group.call(Probes.weights_digest) if trained else None,
                              "rollout_match": group.call(Probes.rollout_weights_match) if actor else None}


def from_snapshot(step: int) -> tuple[str, str]:
    """Where a trained role killed after its update of `step` comes back from: its snapshot of that step, or,
    when the kill came before that snapshot's background copy was whole (a loaded machine), the one before it
    and that update run again (test_a_role_dying_before_its_snapshot_is_whole_runs_its_update_again)."""
    return f"snapshot step {step}", f"snapshot step {step - 1}, then its update of step {step} again"


def spec_for(**overrides):
    base = {"trainer.steps": 8, "trainer.checkpoint.interval": 2}
    base.update(overrides)
    return load_example("quickstart.yaml", **base).spec


def identities(driver: Driver) -> dict[str, list[tuple[int, str]]]:
    return {role: [(i["pid"], i["actor_id"]) for i in g.identities()] for role, g in driver.groups.items()}


def run_observed(driver: Driver) -> tuple[dict, list[dict], dict]:
    """Start, run to the end and shut down; returns (identities before, records, identities after)."""
    driver.start()
    try:
        before = identities(driver)
        records = driver.run()
        return before, records, identities(driver)
    finally:
        driver.shutdown()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("role", ROLES)
def test_killed_role_recovers_alone(ray_session, tmp_path, role, asynchronous):
    """The kill lands in an overlapped phase: critic, ref, reward in values | ref | reward; the actor, in
    async mode, in its update, beside the critic's update and the next step's rollout on the same actor."""
    spec = spec_for(**{"rollout.asynchronous": asynchronous})
    CountingGroup.starts, CountingGroup.sent = {}, {}
    digests: dict[int, float] = {}

    def on_step(rec):
        if role in ("actor", "critic"):
            digests[rec.step] = driver.groups[role].call(Probes.weights_digest)

    driver = ProbingDriver(spec, f"kill-{role}", tmp_path, lambda r: CountingGroup(r, spec, timeout_s=120),
                           faults=[Fault(role, 3)], progress=False, on_step=on_step)
    before, records, after = run_observed(driver)
    assert driver.step == 8 and [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, 9))
    for other in ROLES:
        if other != role:
            assert after[other] == before[other], f"{other} was disturbed by {role}'s failure"
            assert CountingGroup.starts[other] == 1
    assert after[role][0][0] != before[role][0][0] and after[role][0][1] != before[role][0][1]
    assert CountingGroup.starts[role] == 2  # recreated exactly once
    (rec,) = driver.history[role].recoveries
    assert rec.step == 3 and "died" in rec.detail
    if role == "actor" and asynchronous:  # the update was killed; the next step's rollout may be sent by then, and
        # whichever of the two is waited for first notices (a loaded machine): both are recorded
        assert "update_actor" in rec.in_flight and set(rec.in_flight) <= {"update_actor", "rollout"}
        assert rec.phase in rec.in_flight
    # the calls in flight to other roles ran once; only the failed role's interrupted calls were sent again
    for other, calls in STEP_CALLS.items():
        extra = {c: CountingGroup.sent[other, c] - 8 for c in calls}
        if other != role:
            assert set(extra.values()) == {0}, (other, extra)
        else:
            assert set(extra.values()) <= {0, 1} and sum(extra.values()) >= 1, extra
    if role in ("actor", "critic"):
        assert rec.restored_from in from_snapshot(2)  # its own snapshot of the last completed step
        assert driver.after_restart["digest"] == pytest.approx(digests[2], rel=1e-12)
    else:
        assert rec.restored_from == "model path"
    if role == "actor":
        assert driver.after_restart["rollout_match"] is True
    last = records[-1].flat()
    assert last[f"restarts_{role}"] == 1 and all(last[f"restarts_{o}"] == 0 for o in ROLES if o != role)
    at3 = records[2].flat()
    assert at3[f"recovery_{role}_total_s"] == pytest.approx(
        at3[f"recovery_{role}_detect_s"] + at3[f"recovery_{role}_ready_s"] + at3[f"recovery_{role}_replay_s"])
    assert at3[f"steps_lost_{role}"] == 0  # the checkpoint at step 2 is the last completed step
    print(f"recovery {role}: detect={rec.detect_s:.2f}s ready={rec.ready_s:.2f}s replay={rec.replay_s:.2f}s")


def test_hung_worker_counts_as_failed(ray_session, tmp_path):
    spec = spec_for(**{"resilience.callTimeoutSeconds": 5, "trainer.steps": 4})
    driver = Driver(spec, "hang", tmp_path, lambda r: RayWorkerGroup(r, spec, timeout_s=5),
                    faults=[Fault("ref", 2, "hang")], progress=False)
    driver.start()
    try:
        t0 = time.perf_counter()
        driver.run()
        elapsed = time.perf_counter() - t0
    finally:
        driver.shutdown()
    (rec,) = driver.history["ref"].recoveries
    assert driver.step == 4 and "hung" in rec.detail and 5 <= rec.detect_s < 10
    assert elapsed < 60


def test_a_stopped_worker_is_named_stopped_by_its_node_and_recovers_alone(ray_session, tmp_path):
    """A worker SIGSTOPped in its call cannot dump its stacks; a task on its node reads its state (T), and the
    recovery says so; only the stopped role restarts."""
    spec = spec_for(**{"resilience.callTimeoutSeconds": 5, "trainer.steps": 3})
    driver = Driver(spec, "stop", tmp_path, lambda r: CountingGroup(r, spec, timeout_s=5),
                    faults=[Fault("ref", 2, "stop")], progress=False)
    CountingGroup.starts.clear()
    driver.start()
    try:
        driver.run()
    finally:
        driver.shutdown()
    (rec,) = driver.history["ref"].recoveries
    assert driver.step == 3 and rec.reason.value == "WorkerHung", rec
    assert rec.diagnosis.startswith("role ref rank 0 stopped: its process ") and "T (stopped)" in rec.diagnosis, rec
    assert rec.summary().startswith("WorkerHung at step 2 (ref): role ref rank 0 stopped")
    assert CountingGroup.starts == {"actor": 1, "critic": 1, "ref": 2, "reward": 1}


def test_a_worker_stopped_during_a_control_call_is_hung_after_the_floor_not_the_ceiling(ray_session, tmp_path):
    """Control calls (ping, memory peak, stack dump) are bounded by their slowest call like any other: a rank
    SIGSTOPped while the step's end awaits its memory peak is hung after 30 s, not after callTimeoutSeconds (the
    chaos test once waited 432 s for it)."""
    from kuberl.workers import Worker

    group = RayWorkerGroup("reward", spec_for(), timeout_s=600)
    group.start()
    pid = group.where[0]["pid"]
    try:
        group.call(Worker.memory)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(WorkerFailure) as failed:
            group.call(Worker.memory)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
        group.shutdown()
    assert failed.value.reason == Reason.WORKER_HUNG and "stopped" in failed.value.diagnosis, failed.value
    assert 30 <= elapsed < 60, elapsed  # 30 s, then up to 15 s for the stack dump and the look from its node


class AnswerLosingGroup(CountingGroup):
    """A CountingGroup whose n-th collect of the calls named in `losses` ((role, method, n) -> what) waits for the
    real result and then loses it: "link" raises LinkBroken, as RayWorkerGroup does for Ray's ActorUnavailableError
    (a live rank), "died" a WorkerFailure as for a rank that died right after answering. Either way the call ran
    and the driver cannot know it, the worst case for sending it again. A trained role's state as that call left
    it is kept in `states` ((role, n) -> per-rank sha256)."""

    losses: dict[tuple[str, str, int], str] = {}
    collected: dict[tuple[str, str], int] = {}
    states: dict[tuple[str, int], list[str]] = {}

    def collect(self, call):
        out = super().collect(call)
        key = (self.role, call.name.rsplit(".", 1)[-1])
        n = AnswerLosingGroup.collected[key] = AnswerLosingGroup.collected.get(key, 0) + 1
        what = AnswerLosingGroup.losses.get((*key, n))
        if what is not None and self.role in PROBED:
            AnswerLosingGroup.states[self.role, n] = self.call(Probes.state_digest)
        if what == "link":
            raise LinkBroken(self.role, f"unreachable: the connection broke during {key[1]} (test)")
        if what == "died":
            raise WorkerFailure(self.role, Reason.WORKER_DIED, f"worker died after {key[1]} ran (test)")
        return out


def test_a_call_whose_answer_was_lost_is_never_applied_twice(ray_session, tmp_path):
    """The ref's log-probs of step 2 and the critic's update of step 2 lose their link after running: both are sent
    again to the same ranks, and neither role restarts; the update sent again returns its first answer and leaves
    the state as it was. The critic dies right after its update of step 3: it restarts from that update's own
    snapshot (or the one before, when the copy was not yet whole) and the update sent again is applied once."""
    spec = spec_for(**{"trainer.steps": 4})
    CountingGroup.starts, CountingGroup.sent = {}, {}
    AnswerLosingGroup.losses = {("ref", "compute_ref_logprobs", 2): "link", ("critic", "update", 2): "link",
                                ("critic", "update", 4): "died"}  # step 3's update: step 2's was collected twice
    AnswerLosingGroup.collected, AnswerLosingGroup.states = {}, {}
    after: dict[int, list[str]] = {}
    driver = Driver(spec, "lost-answers", tmp_path, lambda r: AnswerLosingGroup(r, spec, timeout_s=120),
                    progress=False,
                    on_step=lambda rec: after.setdefault(rec.step, driver.groups["critic"].call(Probes.state_digest)))
    driver.start()
    try:
        driver.run()
    finally:
        driver.shutdown()
    assert driver.step == 4
    assert driver.history["ref"].recoveries == [] and CountingGroup.starts["ref"] == 1
    assert CountingGroup.sent["ref", "compute_ref_logprobs"] == 5  # 4 steps, step 2's sent twice
    assert after[2] == AnswerLosingGroup.states["critic", 2]  # sent twice, applied once
    (rec,) = driver.history["critic"].recoveries
    assert (rec.reason.value, rec.step, rec.phase, rec.steps_lost) == ("WorkerDied", 3, "update_critic", 0)
    assert rec.restored_from in ("snapshot step 3", "snapshot step 2") and CountingGroup.starts["critic"] == 2
    assert CountingGroup.sent["critic", "update"] == 6  # steps 2 and 3 each sent twice
    assert after[3] == AnswerLosingGroup.states["critic", 4]  # restored and sent again, applied once
    assert all(driver.history[r].recoveries == [] for r in ("actor", "reward"))


def test_an_update_sent_again_while_the_first_still_runs_waits_for_it_and_applies_nothing(netns):
    """The actor of the one-step-off rollout runs two calls at once (`RayWorkerGroup.concurrency`): an update sent
    again while the first still runs (its link broke, not the update) waits for it, then answers what it answered.
    Two threads call the same worker at once; its state is the one a single update leaves, byte for byte."""
    import threading

    from kuberl.workers import ActorWorker
    from kuberl.workers.groups import LocalWorkerGroup

    from .test_offload import OVERRIDES, train_batch

    spec = spec_for(**OVERRIDES)
    keys = ("input_ids", "attention_mask", "responses", "response_mask", "old_logprobs", "advantages")
    groups = [LocalWorkerGroup("actor", spec, "cpu", worker_cls=PROBED["actor"]) for _ in range(2)]
    for g in groups:
        g.start()
    try:
        batch = train_batch(spec, ActorProxy(groups[0])).select(*keys)
        once = groups[1].call(ActorWorker.update, batch, 0)
        answers: list[dict] = []
        twice = [threading.Thread(target=lambda: answers.append(groups[0].worker.execute(ActorWorker.update,
                                                                                         (batch, 0), {})))
                 for _ in range(2)]
        for t in twice:
            t.start()
        for t in twice:
            t.join()
        assert answers[0] == answers[1] == once
        assert groups[0].call(Probes.state_digest) == groups[1].call(Probes.state_digest)
    finally:
        for g in groups:
            g.shutdown()


@pytest.mark.parametrize("role, fault_step, final_ckpt", [("critic", 5, 3), ("reward", 4, 3)])
def test_restart_budget_exhausted_fails_with_role_and_reason(ray_session, tmp_path, role, fault_step, final_ckpt):
    """maxRestarts=0: the first failure ends the job with an error naming the role, keeping the last checkpoint.
    The critic fails at step 5, after step 3's checkpoint is committed (at the end of step 4): a kill during
    its write is the kill-in-save tests' case."""
    spec = spec_for(**{f"roles.{role}.maxRestarts": 0, "trainer.checkpoint.interval": 3})
    driver = Driver(spec, "budget", tmp_path, lambda r: RayWorkerGroup(r, spec, timeout_s=120),
                    faults=[Fault(role, fault_step)], progress=False)
    driver.start()
    try:
        with pytest.raises(JobFailed) as info:
            driver.run()
    finally:
        driver.shutdown()
    msg = str(info.value)
    assert f"role {role}" in msg and "maxRestarts=0" in msg and f"spec.roles.{role}.maxRestarts" in msg
    assert "died" in msg
    assert checkpoint.latest(tmp_path / "checkpoints") == final_ckpt
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, fault_step))


def test_killed_driver_resumes_from_last_checkpoint(netns, tmp_path):
    """SIGKILL the whole `kuberl run`; the same command resumes, losing at most one checkpoint interval, and says
    how many steps it lost in its log and in the progress document the operator copies into status."""
    out, interval = tmp_path / "run", 5
    cmd = [sys.executable, "-m", "kuberl.cli", "run", "examples/quickstart.yaml", "--out", str(out), "--steps", "30",
           "--backend", "local", "--no-progress"]
    job = tmp_path / "job.yaml"
    quickstart = (REPO / "examples" / "quickstart.yaml").read_text()
    job.write_text(quickstart.replace("checkpoint: {interval: 2}", f"checkpoint: {{interval: {interval}}}"))
    cmd[4] = str(job)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_jsonl(out / "metrics.jsonl")) < 12:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(read_jsonl(out / "metrics.jsonl"))
    assert 12 <= done_before < 30
    resumed_from = checkpoint.latest(out / "checkpoints")
    assert done_before - resumed_from <= interval
    reports = tmp_path / "progress"  # the folder a driver pod shares with its reporter
    reports.mkdir()
    rerun = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                           env={**os.environ, Env.PROGRESS_DIR: str(reports)})
    assert rerun.returncode == 0, rerun.stderr
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == list(range(1, 31))
    assert f"step {resumed_from + 1}/30" in rerun.stdout
    lost = done_before - resumed_from
    doc = ProgressDocument.parse((reports / PROGRESS_FILE).read_text())
    assert (doc.step, doc.phase, doc.resumed_from, doc.steps_lost) == (30, "Succeeded", resumed_from, lost), doc
    if lost:
        assert f"{lost} steps lost, trained again" in rerun.stdout


def test_killed_driver_leaves_no_ray_process_behind(netns, tmp_path):
    """SIGKILL only the `kuberl run` process: its watchdog ends every process it started, Ray's agents
    included, within seconds (Ray alone leaves DashboardAgent and RuntimeEnvAgent for about a minute)."""
    from kuberl.resilience import reaper

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "kuberl.cli", "run", "examples/quickstart.yaml", "--out", str(out),
                             "--steps", "30", "--no-progress"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not read_jsonl(out / "metrics.jsonl"):
            time.sleep(0.2)
        tree = {pid: reaper.start_time(pid) for pid in reaper.descendants(proc.pid, reaper.parents())}
        names = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") for pid in tree}
        for agent in ("DashboardAgent", "RuntimeEnvAgent"):
            assert any(agent in n for n in names.values()), names
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        t0 = time.time()
        while time.time() - t0 < 15 and any(running(pid, t) for pid, t in tree.items()):
            time.sleep(0.2)
        left = [names[pid] for pid, t in tree.items() if running(pid, t)]
        assert not left, f"still running {time.time() - t0:.0f}s after the driver was killed: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_driver_whose_raylet_dies_exits_6_rather_than_wait(netns, tmp_path):
    """`kuberl run`'s own raylet SIGKILLed mid-run (as Ray ends a node it declared dead): the driver exits 6
    (RAY_LOST, which its Job retries without counting) within seconds, saying so, instead of waiting forever on a
    Ray that is gone (kuberl.resilience.ownlink)."""
    from kuberl.resilience import reaper
    from kuberl.spec.contract import ExitCode

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "kuberl.cli", "run", "examples/quickstart.yaml", "--out", str(out),
                             "--steps", "500", "--no-progress"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not read_jsonl(out / "metrics.jsonl"):
            time.sleep(0.2)
        tree = reaper.descendants(proc.pid, reaper.parents())
        (raylet,) = [pid for pid in tree if comm(pid) == "raylet"]
        os.kill(raylet, signal.SIGKILL)
        t0 = time.time()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == ExitCode.RAY_LOST, err[-3000:]
    assert "Ray node is gone" in err and time.time() - t0 < 30, err[-3000:]


def comm(pid: int) -> str:
    """The process's command name, "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def running(pid: int, born: str | None) -> bool:
    """Whether `pid` is still the process that started at `born` and not a zombie."""
    from kuberl.resilience import reaper

    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return reaper.start_time(pid) == born and state != "Z"


def test_fault_flag_and_spec_list_agree(netns):
    from kuberl.run import UsageError, apply_overrides, parse_fault

    job = apply_overrides(load_example("quickstart.yaml"), 8, ["critic:3", "actor:5:hang"])
    assert [(f.role, f.step) for f in job.spec.resilience.faults] == [("critic", 3), ("actor", 5)]
    assert parse_fault("ref:2:hang") == ("ref", 2, "hang")
    with pytest.raises(UsageError):
        parse_fault("critic")


def test_raising_reward_function_fails_the_job_with_the_error_not_a_restart_loop(netns, tmp_path):
    """A bug in user code is deterministic: the job stops with the role and the exception, exit 3."""
    (tmp_path / "badreward.py").write_text("def score(prompt, response, answer):\n    return 1 / 0\n")
    job = tmp_path / "job.yaml"
    quickstart = (REPO / "examples" / "quickstart.yaml").read_text()
    job.write_text(quickstart.replace("kuberl.rewards.builtin:repeat_letter", "badreward:score"))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "kuberl.cli", "run", str(job), "--out", str(tmp_path / "out"),
                           "--steps", "3", "--no-progress"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 3, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: job failed: role reward raised ")]
    assert "badreward:score raised ZeroDivisionError: division by zero" in line
    assert f"{tmp_path / 'badreward.py'}:2" in line
    assert "Traceback" not in proc.stderr.split("error: job failed")[-1]


def test_killing_one_rank_of_a_two_rank_role_restarts_that_role(ray_session, tmp_path):
    """The fault hits the critic's last rank while rank 0 is in the same FSDP forward: the role restarts
    as a gang (a peer's collective error is not mistaken for a bug in the role's code)."""
    spec = spec_for(**{"roles.critic.replicas": 2, "trainer.microBatchSize": 8})
    driver = Driver(spec, "two-ranks", tmp_path, lambda r: RayWorkerGroup(r, spec, timeout_s=120),
                    faults=[Fault("critic", 3)], progress=False)
    before, records, after = run_observed(driver)
    assert driver.step == 8 and records[-1].flat()["restarts_critic"] == 1
    assert len(after["critic"]) == 2 and not set(after["critic"]) & set(before["critic"])
    assert all(after[r] == before[r] for r in ("actor", "ref", "reward"))
    (rec,) = driver.history["critic"].recoveries
    assert rec.restored_from in from_snapshot(2)


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_restarted_trained_role_loses_no_step_between_checkpoints(ray_session, tmp_path, role):
    """Killed in step 4 with the last checkpoint at step 2: the role comes back from its snapshot of
    step 3 (the weights it had then, exactly), so it loses no completed step (steps_lost = 0)."""
    spec = spec_for(**{"trainer.steps": 5})
    digests: dict[int, float] = {}
    driver = ProbingDriver(spec, "lost", tmp_path, lambda r: CountingGroup(r, spec, timeout_s=120),
                           faults=[Fault(role, 4)], progress=False,
                           on_step=lambda rec: digests.__setitem__(rec.step, driver.groups[role].call(
                               Probes.weights_digest)))
    run_observed(driver)
    (rec,) = driver.history[role].recoveries
    assert rec.step == 4 and rec.restored_from in from_snapshot(3) and rec.steps_lost == 0
    assert driver.after_restart["digest"] == pytest.approx(digests[3], rel=1e-12)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[3][f"steps_lost_{role}"] == 0 and [r["step"] for r in rows] == [1, 2, 3, 4, 5]


def run_digested(spec, out: Path, faults: list[Fault]) -> tuple[Driver, dict[int, dict[str, list[str]]]]:
    """Run the job to its end under `out` with `faults`; returns the driver and, by step, the actor's and the
    critic's state digests (parameters and AdamW moments) as each step ended."""
    digests: dict[int, dict[str, list[str]]] = {}
    driver = Driver(spec, out.name, out, lambda r: CountingGroup(r, spec, timeout_s=120), faults=faults,
                    progress=False, on_step=lambda rec: digests.__setitem__(rec.step, {
                        role: driver.roles.proxy(role).call(Probes.state_digest) for role in ("actor", "critic")}))
    run_observed(driver)
    return driver, digests


def test_a_role_dying_before_its_snapshot_is_whole_runs_its_update_again(ray_session, tmp_path):
    """The actor's update of step 3 and the critic's of step 4 return, but their snapshot copies never finish
    and each role dies at its next call: each comes back from its snapshot of the step before, runs the update
    again from the batch the driver kept, and from then on holds, bit for bit, the state of a run without
    faults (parameters and AdamW moments, every step): no step lost."""
    spec = spec_for(**{"trainer.steps": 5})

    _, clean = run_digested(spec, tmp_path / "clean", [])
    driver, faulted = run_digested(spec, tmp_path / "doomed", [Fault("actor", 3, phase="snapshot"),
                                                               Fault("critic", 4, phase="snapshot")])
    assert faulted == clean
    for role, step in (("actor", 3), ("critic", 4)):
        (rec,) = driver.history[role].recoveries
        assert rec.restored_from == f"snapshot step {step - 1}, then its update of step {step} again"
        assert rec.steps_lost == 0
    rows = read_jsonl(tmp_path / "doomed" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert (rows[2]["steps_lost_actor"], rows[3]["steps_lost_critic"]) == (0, 0)  # the records of those steps
    # the critic died in step 4's checkpoint phase: that checkpoint holds its update of step 4 (run again)
    doomed, clean = (checkpoint_digest(checkpoint.step_dir(tmp_path / run / "checkpoints", 4) / "critic")
                     for run in ("doomed", "clean"))
    assert doomed == pytest.approx(clean, rel=1e-12)


def test_a_role_dying_while_a_checkpoint_reads_its_snapshot_runs_every_update_since_again(ray_session, tmp_path):
    """The actor's checkpoint of step 3 is written 30 s late (a disk slower than the steps), from its snapshot slot
    of step 3: the snapshots of steps 4 to 6 go to the other slot, each over the last, none waiting for the write,
    and the actor dies before its snapshot of step 6 is whole. It comes back from its snapshot of step 3, runs
    updates 4 to 6 again from the batches the driver kept, and from then on holds, bit for bit, the state of a
    run without faults; the late checkpoint, its actor part lost with the process, is never marked complete."""
    spec = spec_for(**{"trainer.steps": 7, "trainer.checkpoint.interval": 3})

    _, clean = run_digested(spec, tmp_path / "clean", [])
    driver, faulted = run_digested(spec, tmp_path / "slow", [Fault("actor", 3, mode="slow", phase="checkpoint"),
                                                             Fault("actor", 6, phase="snapshot")])
    assert faulted == clean
    (rec,) = driver.history["actor"].recoveries
    assert rec.restored_from == "snapshot step 3, then its updates of steps 4-6 again" and rec.steps_lost == 0
    assert not driver.history["critic"].recoveries
    rows = read_jsonl(tmp_path / "slow" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 8)) and rows[5]["steps_lost_actor"] == 0
    assert checkpoint.complete_steps(tmp_path / "slow" / "checkpoints") == [6, 7]


def checkpoint_digest(folder) -> float:
    """weights_digest of a DCP checkpoint folder's model, read offline (no process group)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = folder.parent / f"{folder.name}.pt"
    dcp_to_torch_save(folder, flat)
    state = torch.load(flat, weights_only=False)
    return float(sum(v.double().abs().sum() for v in state["model"].values()))


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_kill_during_checkpoint_save_keeps_the_checkpoint_whole(ray_session, tmp_path, role):
    """The role is SIGKILLed in its save of step 4's checkpoint: it comes back from its snapshot of step
    4, the save is replayed, and step_4 holds step 4's weights; the recovery is recorded with its true
    phase and step, losing nothing."""
    spec = spec_for(**{"trainer.steps": 6, "trainer.checkpoint.keep": 5})
    digests: dict[int, float] = {}
    driver = Driver(spec, f"save-{role}", tmp_path, lambda r: CountingGroup(r, spec, timeout_s=120),
                    faults=[Fault(role, 4, phase="checkpoint")], progress=False,
                    on_step=lambda rec: digests.__setitem__(rec.step, driver.groups[role].call(Probes.weights_digest)))
    run_observed(driver)
    (rec,) = driver.history[role].recoveries
    assert (rec.step, rec.phase, rec.steps_lost) == (4, "checkpoint", 0) and rec.restored_from in from_snapshot(4)
    root = tmp_path / "checkpoints"
    assert checkpoint.complete_steps(root) == [2, 4, 6]
    assert checkpoint.read_state(root, 4)["step"] == 4
    assert checkpoint_digest(checkpoint.step_dir(root, 4) / role) == pytest.approx(digests[4], rel=1e-12)
    (at4,) = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["step"] == 4]
    assert at4[f"steps_lost_{role}"] == 0
    assert [(r["role"], r["step"], r["phase"]) for r in at4["recoveries"]] == [(role, 4, "checkpoint")]


def test_kill_during_save_without_snapshot_runs_the_updates_since_the_checkpoint_again(ray_session, tmp_path):
    """Without a snapshot the critic comes back from step 2's checkpoint while step 4's is being saved, and runs
    its updates of steps 3 and 4 again from the batches the driver kept: it loses nothing, and step 4's checkpoint
    is saved (holding step 4's critic) and marked complete."""
    spec = spec_for(**{"trainer.steps": 5, "trainer.checkpoint.keep": 5})
    driver = Driver(spec, "void", tmp_path, lambda r: CountingGroup(r, spec, timeout_s=120),
                    faults=[Fault("critic", 4, phase="checkpoint")], progress=False)
    driver.roles.snapshot_root = None  # as on per-pod storage that the new ranks cannot see
    run_observed(driver)
    (rec,) = driver.history["critic"].recoveries
    assert (rec.step, rec.phase, rec.restored_from, rec.steps_lost) == (
        4, "checkpoint", "checkpoint step 2, then its updates of steps 3-4 again", 0)
    assert checkpoint.complete_steps(tmp_path / "checkpoints") == [2, 4, 5]


def test_kill_during_save_further_back_than_the_kept_updates_voids_that_checkpoint(ray_session, tmp_path, capfd):
    """Without a snapshot or an earlier checkpoint the critic comes back from the model path while step 10's
    checkpoint is being saved, 10 updates back, more than the driver keeps (8): step 10's checkpoint would hold
    the untrained critic, so it is removed, never marked complete, and the recovery says the 10 steps it lost."""
    spec = spec_for(**{"trainer.steps": 11, "trainer.checkpoint.interval": 10, "trainer.checkpoint.keep": 5})
    driver = Driver(spec, "void", tmp_path, lambda r: CountingGroup(r, spec, timeout_s=120),
                    faults=[Fault("critic", 10, phase="checkpoint")], progress=False)
    driver.roles.snapshot_root = None  # as on per-pod storage that the new ranks cannot see
    run_observed(driver)
    (rec,) = driver.history["critic"].recoveries
    assert (rec.step, rec.phase, rec.restored_from, rec.steps_lost) == (10, "checkpoint", "model path", 10)
    root = tmp_path / "checkpoints"
    assert checkpoint.complete_steps(root) == [11] and not checkpoint.step_dir(root, 10).exists()
    assert "checkpoint of step 10 not saved: critic holds step 0" in capfd.readouterr().out
    (at10,) = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["step"] == 10]
    assert at10["steps_lost_critic"] == 10
