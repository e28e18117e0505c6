"""The driver pod's reporter sidecar (kuberl.metrics.reporter): the driver writes its documents to files and holds no
token; the relay patches each new one into the ConfigMap over real HTTP and reads the replicas back, and on
SIGTERM (the kubelet stops it after the driver) sends the last one before it exits."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kuberl.metrics.progress import ProgressFiles, progress_of
from kuberl.metrics.record import RoleStep, StepRecord
from kuberl.metrics.reporter import Relay
from kuberl.spec.contract import ProgressDocument, ReplicasDocument

from .test_progress import reporter, scripted  # noqa: F401  (the fixture)

KUBERL = [sys.executable, "-c", "import sys; from kuberl.cli import main; sys.exit(main())"]


def doc(step: int, phase: str = "Running") -> ProgressDocument:
    return progress_of(StepRecord(step=step, rollout_tokens_per_s=10.0, roles={"critic": RoleStep(restarts=0)}), 9,
                       phase)


def patched(server) -> list[dict]:
    return [json.loads(s["body"]["data"]["progress"]) for s in server.seen]


def test_the_driver_writes_whole_documents_and_reads_the_replicas_it_was_given(tmp_path: Path) -> None:
    files = ProgressFiles(tmp_path)
    assert files.desired_replicas() is None  # before the reporter's first read
    assert files.report(doc(3))
    assert json.loads((tmp_path / "progress.json").read_text())["step"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]  # no part file left
    (tmp_path / "replicas.json").write_text('{"roles": {"ref": 2}}')
    assert files.desired_replicas() == ReplicasDocument(roles={"ref": 2})
    assert not ProgressFiles(tmp_path / "gone").report(doc(4))  # a folder that is gone: a warning, not a crash


def test_each_new_document_is_patched_once_and_the_replicas_follow_it(scripted, tmp_path: Path) -> None:  # noqa: F811
    server = scripted()
    server.replicas = '{"roles": {"reward": 3}}'
    files, relay = ProgressFiles(tmp_path), Relay(ProgressFiles(tmp_path), reporter(server.url), idle_s=3600)
    assert relay.once() is False and server.seen == [] and server.gets == 1  # nothing yet; the replicas read
    files.report(doc(1))
    relay.once()
    relay.once()  # the same document: not sent again, the replicas not read again
    assert [d["step"] for d in patched(server)] == [1] and server.gets == 2
    assert files.desired_replicas() == ReplicasDocument(roles={"reward": 3})
    files.report(doc(9, "Succeeded"))
    assert relay.once() is True and [d["phase"] for d in patched(server)] == ["Running", "Succeeded"]


def test_what_the_driver_writes_is_bounded_before_it_is_sent(scripted, tmp_path: Path) -> None:  # noqa: F811
    """User code in the driver can write anything to the file: the relay sends what ProgressDocument.parse keeps."""
    server = scripted()
    bad = json.loads(doc(2).to_json()) | {"tokensPerSec": math.inf, "step": 2**80, "hosts": ["x" * 300]}
    (tmp_path / "progress.json").write_text(json.dumps(bad))
    Relay(ProgressFiles(tmp_path), reporter(server.url)).once()
    sent = patched(server)[0]
    assert "step" not in sent and "tokensPerSec" not in sent and sent["phase"] == "Running", sent
    for junk in ("x" * (300 * 1024), "[1, 2]", "{"):  # no document: nothing sent, the last good one stands
        (tmp_path / "progress.json").write_text(junk)
        Relay(ProgressFiles(tmp_path), reporter(server.url)).once()
    assert len(server.seen) == 1


def test_stopped_it_sends_the_last_document_first(scripted, tmp_path: Path) -> None:  # noqa: F811
    server, stop = scripted(), threading.Event()
    relay = Relay(ProgressFiles(tmp_path), reporter(server.url))
    thread = threading.Thread(target=relay.run, args=(stop, 60.0))  # it would not look again for a minute
    thread.start()
    ProgressFiles(tmp_path).report(doc(9, "Failed"))
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and [d["phase"] for d in patched(server)] == ["Failed"]


def test_the_sidecar_command_relays_until_sigterm_then_flushes(scripted, tmp_path: Path) -> None:  # noqa: F811
    """`kuberl report-progress` as the kubelet runs it: the token from its ServiceAccount folder, and SIGTERM once
    the driver has exited: the driver's final document reaches the ConfigMap, and the exit code is 0."""
    server = scripted()
    sa, folder = tmp_path / "sa", tmp_path / "progress"
    sa.mkdir()
    folder.mkdir()
    (sa / "token").write_text("sidecar-token")
    env = {**os.environ, "KUBERL_PROGRESS_CONFIGMAP": "job-progress", "KUBERL_NAMESPACE": "ns1",
           "KUBERL_API_URL": server.url, "KUBERL_SA_DIR": str(sa)}
    proc = subprocess.Popen([*KUBERL, "report-progress", "--dir", str(folder), "--poll", "0.1"],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        ProgressFiles(folder).report(doc(1))
        deadline = time.monotonic() + 60
        while not server.seen and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert server.seen and server.seen[0]["auth"] == "Bearer sidecar-token", proc.poll()
        ProgressFiles(folder).report(doc(9, "Succeeded"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.stderr.read()
    finally:
        proc.kill()
    assert patched(server)[-1]["phase"] == "Succeeded"


def test_the_sidecar_refuses_to_start_without_its_configmap(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERL_")}
    run = subprocess.run([*KUBERL, "report-progress", "--dir", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stderr.count("\n") == 1 and "KUBERL_PROGRESS_CONFIGMAP" in run.stderr
