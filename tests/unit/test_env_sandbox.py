"""The sandbox for model-written Python (kuberl.envs.sandbox) and the code_tools environment's `python` tool: a
program that tries the network, forks without end, writes outside its folder, spins, takes memory or sleeps is
stopped and reported, and leaves no process behind. Real processes, namespaces and Landlock; skipped, with the
reason, where this kernel or user cannot confine code."""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path

import pytest

from kuberl.envs import EnvironmentImportError, code_tools, make_environment, sandbox
from kuberl.envs.code_tools import CodeToolEnvironment
from kuberl.spec.model import EnvironmentSpec

pytestmark = pytest.mark.netns  # a TCP server on 127.0.0.1; processes, namespaces


@pytest.fixture(scope="module", autouse=True)
def confinable() -> None:
    reason = sandbox.available()
    if reason is not None:
        pytest.skip(f"this machine cannot run the sandbox: {reason}")


def run(code: str, **limits) -> sandbox.SandboxResult:
    return sandbox.run_python(code, sandbox.SandboxLimits(**{"wall_s": 5.0, "cpu_s": 2, **limits}))


def sandboxed_processes() -> list[str]:
    """Command lines of processes still running the sandbox's bootstrap (none once a run returned)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"kuberl-sandbox-" in cmd:
            found.append(cmd.replace(b"\0", b" ").decode(errors="replace")[:120])
    return found


def test_a_program_runs_writes_in_its_folder_and_gives_its_output() -> None:
    r = run("open('note.txt', 'w').write('kept'); print(open('note.txt').read(), 6 * 7)")
    assert r.ok and r.stdout == "kept 42\n" and r.report() == "kept 42\n"


def test_it_sees_none_of_the_callers_environment_variables(monkeypatch) -> None:
    monkeypatch.setenv("KUBERL_TEST_SECRET", "s3cr3t")
    r = run("import os; print(sorted(os.environ))")
    assert r.ok and "KUBERL_TEST_SECRET" not in r.stdout and "s3cr3t" not in r.stdout


def test_the_network_is_out_of_reach() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    tcp_port, udp_port = server.getsockname()[1], udp.getsockname()[1]
    try:
        tcp = run(f"import socket; socket.create_connection(('127.0.0.1', {tcp_port}), timeout=2)")
        sent = run(f"import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', "
                   f"('127.0.0.1', {udp_port}))")
        with pytest.raises(TimeoutError):
            server.accept()
        with pytest.raises(TimeoutError):
            udp.recvfrom(16)
    finally:
        server.close()
        udp.close()
    assert tcp.status == "error" and ("PermissionError" in tcp.report() or "unreachable" in tcp.report()), tcp
    assert sent.status == "error" and "unreachable" in sent.report(), sent


def test_writes_outside_its_folder_are_refused() -> None:
    outside = Path("/tmp") / f"kuberl-escape-{uuid.uuid4().hex}"  # /tmp: anyone may write there, but not the code
    r = run(f"open({str(outside)!r}, 'w').write('x')")
    assert r.status == "error" and "PermissionError" in r.report() and not outside.exists()


def test_a_fork_bomb_is_stopped_and_leaves_no_process() -> None:
    r = run("import os\nwhile True:\n    os.fork()", wall_s=3.0)
    assert not r.ok and r.seconds < 10, r
    assert sandboxed_processes() == []


def test_a_process_the_program_leaves_behind_ends_with_it() -> None:
    r = run("import os, time\nif os.fork() == 0:\n    time.sleep(60)\nprint('parent done')")
    assert r.ok and r.stdout == "parent done\n" and r.seconds < 5 and sandboxed_processes() == []


@pytest.mark.parametrize("code, limits, status, words", [
    ("while True: pass", {"cpu_s": 1}, "cpu", "CPU time limit"),
    ("x = bytearray(2**31)", {"memory_bytes": 256 * 2**20}, "memory", "memory limit"),
    ("import time; time.sleep(60)", {"wall_s": 1.0}, "timeout", "wall-clock limit"),
    ("1 / 0", {}, "error", "ZeroDivisionError"),
])
def test_a_program_past_a_limit_is_stopped_and_says_which(code: str, limits: dict, status: str, words: str) -> None:
    r = run(code, **limits)
    assert r.status == status and words in r.report() and r.seconds < 10, r
    assert sandboxed_processes() == []


def call(env: CodeToolEnvironment, code: str) -> tuple[dict, dict]:
    text = '<tool_call>' + json.dumps({"name": "python", "arguments": {"code": code}}) + '</tool_call>'
    step = env.step(text)
    body = json.loads(step.observation.split("<tool_response>\n")[1].split("\n</tool_response>")[0])
    return body, step.info


def test_code_tools_runs_the_policys_program_and_reports_its_failures() -> None:
    env = make_environment(EnvironmentSpec(module="code_tools"))
    assert isinstance(env, CodeToolEnvironment) and "- python(code)" in env.instructions()
    assert call(env, "print(sum(range(10)))") == ({"name": "python", "result": "45\n"},
                                                 {"tool_calls": 1, "tool_errors": 0})
    body, info = call(env, "while True: pass")
    assert info["tool_errors"] == 1 and body["error"].startswith("CodeFailed: stopped: CPU time limit")


def test_code_tools_refuses_to_start_where_the_sandbox_cannot_run(monkeypatch) -> None:
    monkeypatch.setattr(code_tools, "_unavailable", lambda: "sandbox: no Landlock in this kernel")
    with pytest.raises(EnvironmentImportError) as err:
        make_environment(EnvironmentSpec(module="code_tools"))
    assert str(err.value).startswith("spec.environment.module: the built-in code_tools environment cannot start: ")
    assert "no Landlock" in str(err.value) and "\n" not in str(err.value)
