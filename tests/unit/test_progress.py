"""The driver's progress reports: real HTTP PATCHes to a server on 127.0.0.1, in the operator's format, through
transient failures (5xx, 429 with Retry-After, refused connections), with the token re-read per request."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from kuberl.metrics.progress import ProgressReporter, api_url, progress_of, retry_after_s
from kuberl.metrics.record import RoleStep, StepRecord
from kuberl.spec.contract import ProgressDocument


class ScriptedServer:
    """A real HTTP server that answers PATCHes with the scripted statuses, then 200, and GETs with a ConfigMap
    whose `data.replicas` is ``replicas``; it records each request."""

    def __init__(self, statuses: tuple[int, ...] = (), retry_after: str | None = None, host: str = "127.0.0.1",
                 port: int = 0):
        self.statuses, self.seen, self.gets, self.replicas = list(statuses), [], 0, '{"roles": {}}'
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.gets += 1
                body = json.dumps({"data": {"replicas": outer.replicas}}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PATCH(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.seen.append({"t": time.monotonic(), "path": self.path, "type": self.headers["Content-Type"],
                                   "auth": self.headers.get("Authorization"), "body": json.loads(body)})
                status = outer.statuses.pop(0) if outer.statuses else 200
                self.send_response(status)
                if status == 429 and retry_after:
                    self.send_header("Retry-After", retry_after)
                if status == 307:  # elsewhere on this same server: a follower would PATCH it with the token
                    self.send_header("Location", "/stolen")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *a):
                pass

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server_class = type("Server", (HTTPServer,), {"address_family": family})
        self.server = server_class((host, port), Handler)
        self.url = api_url(host, str(self.server.server_address[1])).replace("https://", "http://")
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted(netns):
    servers = []

    def start(*statuses: int, **kw) -> ScriptedServer:
        servers.append(ScriptedServer(statuses, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def reporter(url: str, **kw) -> ProgressReporter:
    return ProgressReporter(url, "ns1", "job-progress", **{"backoff_s": 0.05, "max_wait_s": 0.5, **kw})


def test_report_patches_the_progress_configmap(scripted):
    server = scripted()
    rep = ProgressReporter(server.url, "ns1", "job-progress", token="t0k")
    rec = StepRecord(step=7, rollout_tokens_per_s=1234.56,
                     roles={"critic": RoleStep(restarts=1), "actor": RoleStep(restarts=0)})
    assert rep.report(progress_of(rec, 60))
    seen = server.seen[0]
    assert seen["path"] == "/api/v1/namespaces/ns1/configmaps/job-progress"
    assert seen["type"] == "application/merge-patch+json" and seen["auth"] == "Bearer t0k"
    doc = json.loads(seen["body"]["data"]["progress"])
    assert doc == {"step": 7, "totalSteps": 60, "tokensPerSec": 1234.6, "phase": "Running", "message": "",
                   "roles": {"critic": {"restarts": 1}, "actor": {"restarts": 0}}}


def test_final_report_survives_5xx_and_429(scripted, capsys):
    """503, 429, 500, 502 and then 200: the final report (phase Failed, with the reason the operator puts in
    the Failed condition) gets through; a per-step report facing the same answers gives up after two tries."""
    server = scripted(503, 429, 500, 502, retry_after="1")
    final = progress_of(StepRecord(step=3), 60, "Failed", "critic restarts spent", "ReachedMaxRestarts")
    assert reporter(server.url).report(final)
    assert len(server.seen) == 5
    gaps = [b["t"] - a["t"] for a, b in zip(server.seen, server.seen[1:])]
    assert 0.45 <= gaps[1] < 1.5, gaps  # after the 429: its Retry-After (1 s), bounded by max_wait_s (0.5 s)
    assert gaps[2] < gaps[3] < 0.45, gaps  # exponential backoff otherwise: 0.2 s, then 0.4 s
    assert json.loads(server.seen[-1]["body"]["data"]["progress"])["reason"] == "ReachedMaxRestarts"
    assert capsys.readouterr().err == ""

    server.statuses = [503, 429, 500, 502]
    assert reporter(server.url).report(progress_of(StepRecord(step=4), 60)) is False
    assert len(server.seen) == 5 + 2
    assert "failed after 2 attempt(s): HTTP Error 429" in capsys.readouterr().err


def test_retry_after_is_honoured_within_its_bound(scripted):
    server = scripted(429, retry_after="1")
    assert reporter(server.url, max_wait_s=5.0).report(ProgressDocument(phase="Succeeded"))
    gap = server.seen[1]["t"] - server.seen[0]["t"]
    assert 0.95 <= gap < 3.0, gap


def test_refusals_are_not_retried(scripted, capsys):
    server = scripted(403)
    assert reporter(server.url).report(ProgressDocument(phase="Failed")) is False
    assert len(server.seen) == 1
    assert "failed after 1 attempt(s): HTTP Error 403" in capsys.readouterr().err


def test_a_redirect_is_not_followed_with_the_token(scripted, capsys):
    server = scripted(307)
    assert reporter(server.url, token="t0k3n").report(ProgressDocument(phase="Failed")) is False
    assert [r["path"] for r in server.seen] == ["/api/v1/namespaces/ns1/configmaps/job-progress"]


def test_the_token_never_goes_over_plain_http_but_to_loopback(capsys):
    rep = reporter("http://10.0.0.1:80", token="t0k3n", timeout_s=1)
    assert rep.report(ProgressDocument(phase="Failed")) is False
    assert "is not https" in capsys.readouterr().err


def test_final_report_waits_for_an_api_server_that_comes_back(netns):
    """Connection refused at first (the API server restarting): the final report retries until it listens."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    servers: list[ScriptedServer] = []
    threading.Timer(0.4, lambda: servers.append(ScriptedServer(port=port))).start()
    try:
        assert reporter(f"http://127.0.0.1:{port}", max_wait_s=0.2).report(ProgressDocument(phase="Succeeded"))
    finally:
        time.sleep(0.5)
        for s in servers:
            s.close()
    assert len(servers[0].seen) == 1


def test_unreachable_api_is_not_fatal(netns, capsys):
    rep = ProgressReporter("http://127.0.0.1:9", "ns", "cm", timeout_s=1, backoff_s=0.01)
    assert rep.report(ProgressDocument(step=1)) is False
    assert "progress report to cm failed after 2 attempt(s)" in capsys.readouterr().err


def test_token_is_read_for_every_request(scripted, tmp_path: Path):
    """Projected service-account tokens rotate: each report carries the token file's content of that moment."""
    server = scripted()
    token = tmp_path / "token"
    token.write_text("first\n")
    rep = reporter(server.url, token_file=str(token))
    assert rep.report(ProgressDocument(step=1))
    token.write_text("second\n")
    assert rep.report(ProgressDocument(step=2))
    token.unlink()
    assert rep.report(ProgressDocument(step=3))
    assert [s["auth"] for s in server.seen] == ["Bearer first", "Bearer second", None]


def test_from_env_reads_the_service_account_folder(monkeypatch, tmp_path: Path):
    (tmp_path / "token").write_text("tok")
    monkeypatch.setenv("KUBERL_PROGRESS_CONFIGMAP", "j-progress")
    monkeypatch.setenv("KUBERL_NAMESPACE", "team")
    monkeypatch.setenv("KUBERL_SA_DIR", str(tmp_path))
    monkeypatch.delenv("KUBERL_API_URL", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    rep = ProgressReporter.from_env()
    assert rep.api_url == "https://[fd00:10:96::1]:443" and rep.namespace == "team"
    assert rep.token_file == str(tmp_path / "token") and rep.ca_file is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert ProgressReporter.from_env().api_url == "https://10.96.0.1:443"


def test_report_over_ipv6_loopback(scripted):
    """The bracketed URL works for real: a server on [::1] (where the namespace has IPv6 loopback)."""
    try:
        server = scripted(host="::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback in this network namespace: {exc}")
    assert server.url.startswith("http://[::1]:")
    assert reporter(server.url).report(ProgressDocument(step=1))
    assert len(server.seen) == 1


def test_retry_after_forms():
    assert retry_after_s("3") == 3.0 and retry_after_s(None) is None and retry_after_s("soon") is None
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0


def test_from_env_is_none_outside_a_cluster(monkeypatch):
    monkeypatch.delenv("KUBERL_PROGRESS_CONFIGMAP", raising=False)
    assert ProgressReporter.from_env() is None
