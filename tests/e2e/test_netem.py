"""The slow link of the chaos tests (tests/e2e/netem.py) between two network namespaces joined by a veth pair:
round trips take the delay while it runs and nothing extra after; every packet is accounted for."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from . import chaos

ECHO = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.251.0.2", 9999)); s.listen(); print("listening", flush=True)
c, _ = s.accept()
while data := c.recv(64):
    c.sendall(data)
"""
ROUND_TRIPS = """
import socket, statistics, sys, time
c = socket.create_connection(("10.251.0.2", 9999), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
seconds = []
for _ in range(int(sys.argv[1])):
    t = time.monotonic(); c.sendall(b"x"); c.recv(8); seconds.append(time.monotonic() - t)
print(statistics.median(seconds))
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def pair() -> Iterator[tuple[int, int]]:
    """Two network namespaces (held by `sleep`), 10.251.0.1 and .2 on the two ends of a veth pair."""
    if os.geteuid() != 0 or not shutil.which("iptables-legacy") or not shutil.which("nsenter"):
        pytest.skip("needs root, iptables-legacy and nsenter (`make node-deps`)")
    holders = [subprocess.Popen(["unshare", "-n", "sleep", "infinity"]) for _ in range(2)]
    try:
        time.sleep(0.2)
        a, b = (h.pid for h in holders)
        name = f"kn{os.getpid() % 100000}"
        ip("link", "add", f"{name}a", "netns", str(a), "type", "veth", "peer", "name", f"{name}b", "netns", str(b))
        for pid, end, addr in ((a, "a", "10.251.0.1/24"), (b, "b", "10.251.0.2/24")):
            chaos.in_netns(pid, "ip", "addr", "add", addr, "dev", f"{name}{end}")
            chaos.in_netns(pid, "ip", "link", "set", f"{name}{end}", "up")
            chaos.in_netns(pid, "ip", "link", "set", "lo", "up")
        yield a, b
    finally:
        for h in holders:
            h.kill()
            h.wait()


def round_trip_s(a: int, b: int, n: int = 10) -> float:
    """The median seconds of `n` one-byte TCP round trips from namespace `a` to an echo server in `b`."""
    server = subprocess.Popen(["nsenter", "-t", str(b), "-n", sys.executable, "-c", ECHO], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        out = subprocess.run(["nsenter", "-t", str(a), "-n", sys.executable, "-c", ROUND_TRIPS, str(n)],
                             check=True, capture_output=True, text=True, timeout=60)
        return float(out.stdout)
    finally:
        server.kill()
        server.wait()


def test_the_slow_link_delays_what_the_namespace_sends_and_leaves_no_rule(pair: tuple[int, int],
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    a, b = pair
    before = round_trip_s(a, b)
    with chaos.slow(a, delay_ms=200, loss=0):
        rules = chaos.in_netns(a, "iptables-legacy", "-S", "OUTPUT")
        during = round_trip_s(a, b)
    after = round_trip_s(a, b)
    assert "NFQUEUE" in rules and "--queue-bypass" in rules, rules
    assert before < 0.05 and 0.19 <= during < 0.3 and after < 0.05, (before, during, after)
    assert "NFQUEUE" not in chaos.in_netns(a, "iptables-legacy", "-S", "OUTPUT")
    counts = capsys.readouterr().out.rsplit("delayed ", 1)[1].split()
    assert int(counts[0]) > 10 and counts[2] == "0", counts  # the handshake, 10 requests, their ACKs; none dropped


def test_the_slow_link_drops_the_share_it_is_given(pair: tuple[int, int], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = pair
    with chaos.slow(a, delay_ms=1, loss=20):
        round_trip_s(a, b, n=30)  # TCP resends what is lost: slower, never broken
    counts = capsys.readouterr().out.rsplit("delayed ", 1)[1].split()
    delayed, dropped = int(counts[0]), int(counts[2])
    assert dropped >= 3 and 0.05 <= dropped / (delayed + dropped) <= 0.45, counts
