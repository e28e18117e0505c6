"""The driver's progress reports: a real HTTP PATCH to a server on 127.0.0.1, in the operator's format."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from kuberl.progress import ProgressReporter, progress_of


def test_report_patches_the_progress_configmap(netns):
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_PATCH(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.path, self.headers["Content-Type"], self.headers.get("Authorization"), json.loads(body)))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rep = ProgressReporter(f"http://127.0.0.1:{server.server_address[1]}", "ns1", "job-progress", token="t0k")
        rec = {"step": 7, "rollout_tokens_per_s": 1234.56, "restarts_critic": 1, "restarts_actor": 0}
        assert rep.report(progress_of(rec, 60))
    finally:
        server.shutdown()
        server.server_close()
    path, ctype, auth, body = seen[0]
    assert path == "/api/v1/namespaces/ns1/configmaps/job-progress" and ctype == "application/merge-patch+json"
    assert auth == "Bearer t0k"
    doc = json.loads(body["data"]["progress"])
    assert doc == {"step": 7, "totalSteps": 60, "tokensPerSec": 1234.6, "phase": "Running", "message": "",
                   "roles": {"critic": {"restarts": 1}, "actor": {"restarts": 0}}}


def test_unreachable_api_is_not_fatal(netns, capsys):
    rep = ProgressReporter("http://127.0.0.1:9", "ns", "cm", timeout_s=1)
    assert rep.report({"step": 1}) is False
    assert "progress report to cm failed" in capsys.readouterr().err


def test_from_env_is_none_outside_a_cluster(monkeypatch):
    monkeypatch.delenv("KUBERL_PROGRESS_CONFIGMAP", raising=False)
    assert ProgressReporter.from_env() is None
