"""One blocking request to the Kubernetes API, with the credentials kopf would use (in-cluster first, then a
kubeconfig), logged in again per call (a service-account token rotates). For what runs outside kopf's loop: the
leader election (leader.py) and `kuberl validate --cluster` (cluster_check.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

import kopf

from .kube import login


def request(method: str, path: str, body: Mapping[str, Any] | None = None, timeout: float = 10,
            params: Mapping[str, str] | None = None) -> tuple[int, Any]:
    """(status code, decoded JSON body or None); an HTTP error is a code, not an exception (OSError: unreachable)."""
    conn = login(kopf.OperatorSettings())
    context = conn.as_ssl_context() if conn.server.startswith("https") else None
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    req = urllib.request.Request(conn.server.rstrip("/") + path + query, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={**conn.as_http_headers(), "Content-Type": "application/json",
                                          "User-Agent": "kuberl"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as rsp:
            return rsp.status, json.loads(rsp.read() or b"null")
    except urllib.error.HTTPError as exc:
        with exc:
            try:
                return exc.code, json.loads(exc.read() or b"null")
            except ValueError:
                return exc.code, None
