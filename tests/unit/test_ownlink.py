"""The driver's own link (kuberl.resilience.ownlink): a driver cut off from the head waits rather than blame a role,
and a driver whose own Ray node is gone exits RAY_LOST (its Job retries it, uncounted) rather than wait forever."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kuberl.resilience import ownlink
from kuberl.spec.contract import ExitCode

pytestmark = pytest.mark.usefixtures("netns")  # servers on 127.0.0.1


def listener() -> tuple[socket.socket, str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def closed_address() -> str:
    s, address = listener()
    s.close()
    return address


def unix_listener(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.listen()
    return s


def test_the_gcs_answers_while_its_port_listens() -> None:
    s, address = listener()
    with s:
        assert ownlink.gcs_answers(address)
    assert not ownlink.gcs_answers(address, timeout_s=1)


def test_a_raylet_is_gone_once_its_socket_refuses_or_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "raylet"
    assert not ownlink.raylet_alive(str(path))
    s = unix_listener(path)
    assert ownlink.raylet_alive(str(path))
    s.close()  # the file stays, as a killed raylet's does
    assert path.exists() and not ownlink.raylet_alive(str(path))


def test_a_driver_that_reaches_the_head_does_not_wait(tmp_path: Path) -> None:
    s, address = listener()
    with s, unix_listener(tmp_path / "raylet"):
        assert ownlink.OwnLink(address, str(tmp_path / "raylet")).wait_if_cut_off() is None


def test_a_cut_off_driver_waits_for_the_link_and_says_how_long(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(ownlink, "CHECK_S", 0.1)
    address = closed_address()
    host, port = address.rsplit(":", 1)
    back: list[socket.socket] = []
    timer = threading.Timer(1.0, lambda: back.append(socket.create_server((host, int(port)))))
    with unix_listener(tmp_path / "raylet"):
        timer.start()
        waited = ownlink.OwnLink(address, str(tmp_path / "raylet")).wait_if_cut_off()
    timer.join()
    back[0].close()
    assert waited is not None and 0.9 <= waited < 5, waited
    out = capsys.readouterr().out
    assert "it is the one cut off, so no role is blamed" in out and "the link to the Ray head is back" in out


def run_link(code: str, tmp_path: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter with `ownlink` imported and `raylet` bound to a listening Unix socket."""
    prelude = ("import socket, time\nfrom kuberl.resilience import ownlink\nownlink.CHECK_S = 0.1\n"
               f"raylet = socket.socket(socket.AF_UNIX); raylet.bind({str(tmp_path / 'raylet')!r}); raylet.listen()\n")
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=timeout)


def test_a_cut_off_driver_whose_node_ended_exits_ray_lost(tmp_path: Path) -> None:
    done = run_link(f"raylet.close()\nownlink.OwnLink({closed_address()!r}, {str(tmp_path / 'raylet')!r})"
                    f".wait_if_cut_off()\nprint('went on')", tmp_path)
    assert done.returncode == ExitCode.RAY_LOST and "went on" not in done.stdout, done
    assert "this driver's Ray node ended while it was cut off from the head" in done.stderr, done.stderr


def test_a_driver_whose_node_the_head_declared_dead_exits_ray_lost_before_blaming_a_role(tmp_path: Path) -> None:
    """The chaos run's 90 s driver cut: the link came back, the raylet had not heard yet that its node was dead, and
    the driver restarted the actor into a job Ray had already ended (a placement group nobody removes)."""
    link = f"ownlink.OwnLink(address, {str(tmp_path / 'raylet')!r}, declared_dead=lambda: {{}})"
    head = "head = socket.create_server(('127.0.0.1', 0)); address = f'127.0.0.1:{head.getsockname()[1]}'\n"
    done = run_link(f"{head}{link.format('True')}.wait_if_cut_off()\nprint('went on')", tmp_path)
    assert done.returncode == ExitCode.RAY_LOST and "went on" not in done.stdout, done
    assert "this driver's Ray node is gone: the Ray head declared it dead, or restarted" in done.stderr, done.stderr
    (tmp_path / "raylet").unlink()
    done = run_link(f"{head}print({link.format('False')}.wait_if_cut_off())", tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "None", done


def test_the_watch_ends_a_driver_whose_raylet_is_gone_and_stop_ends_the_watch(tmp_path: Path) -> None:
    link = f"ownlink.OwnLink('127.0.0.1:1', {str(tmp_path / 'raylet')!r})"
    t0 = time.monotonic()
    done = run_link(f"{link}.watch(0.1)\ntime.sleep(0.5)\nraylet.close()\ntime.sleep(20)\nprint('went on')", tmp_path)
    assert done.returncode == ExitCode.RAY_LOST and "went on" not in done.stdout, done
    assert "its raylet no longer listens" in done.stderr and time.monotonic() - t0 < 15, done.stderr
    (tmp_path / "raylet").unlink()
    done = run_link(f"w = {link}\nw.watch(0.1)\nw.stopped.set()\ntime.sleep(0.3)\nraylet.close()\ntime.sleep(1)\n"
                    f"print('went on')", tmp_path)
    assert done.returncode == 0 and "went on" in done.stdout, done


def test_an_error_is_the_clusters_loss_only_while_the_drivers_raylet_goes(tmp_path: Path, monkeypatch) -> None:
    assert not ownlink.lost(wait_s=0)  # no Ray driver in this process (or its run is over)
    raylet = unix_listener(tmp_path / "raylet")
    monkeypatch.setattr(ownlink, "_current", ownlink.OwnLink("127.0.0.1:1", str(tmp_path / "raylet")))
    assert not ownlink.lost(wait_s=0.5)  # a bug: Ray's node is fine
    threading.Timer(0.5, raylet.close).start()
    assert ownlink.lost(wait_s=5)  # it ends soon after the error: the cluster went
    ownlink.stop()
    assert not ownlink.lost(wait_s=0) and ownlink.current() is None
