"""What the operator asks of the API server, counted by verb and resource as the audit log would name them.

The operator's own client (`kube.Kube`) carries the trace config made here; kopf's requests (watches, lists, its
patches and Events) all pass through `kopf._cogs.clients.api.request`, which `count_kopf_requests` wraps (kopf is
pinned in the lock files; a kopf without that function fails the operator's start, not silently). Every request is
counted once, when its response headers arrive: a watch counts when it starts, which makes the `watch` verb's
count the watch (re)starts.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
from yarl import URL

Record = Callable[[str, str, int], None]  # (verb, resource, status code)


def classify(method: str, url: URL | str) -> tuple[str, str]:
    """(verb, resource) of a request, as Kubernetes' audit log names them: GET of a collection is `list`, or `watch`
    with ?watch=true; a subresource is `resource/sub`. Paths outside /api and /apis (discovery, /version) are
    `get` of the path's first segment."""
    url = URL(str(url))
    parts = [p for p in url.path.split("/") if p]
    method = method.upper()
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return "get", (parts[0] if parts else "/")
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        rest = rest[2:]  # namespaced: /namespaces/<ns>/<plural>[/<name>[/<sub>]]
    if not rest:
        return "get", "discovery"
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    collection = len(rest) == 1
    if method == "GET":
        if collection:
            return ("watch" if url.query.get("watch") in ("true", "1") else "list"), resource
        return "get", resource
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method)
    if method == "DELETE":
        verb = "deletecollection" if collection else "delete"
    return verb or method.lower(), resource


def count_kopf_requests(record: Record) -> None:
    """Count every request kopf sends (once per process: a second call does not count twice)."""
    from kopf._cogs.clients import api

    original = api.request
    if getattr(original, "counted", False):
        return

    async def counted(method: str, url: str, **kwargs: Any) -> aiohttp.ClientResponse:
        try:
            response = await original(method, url, **kwargs)
        except Exception as exc:  # kopf raises its APIError subclasses for 4xx and 5xx answers
            record(*classify(method, url), int(getattr(exc, "status", 0) or 0))
            raise
        record(*classify(method, response.url), response.status)
        return response

    counted.counted = True  # type: ignore[attr-defined]
    api.request = counted


def trace_config(record: Record) -> aiohttp.TraceConfig:
    """An aiohttp trace config that calls `record(verb, resource, status)` once per response."""
    async def on_end(_session: aiohttp.ClientSession, _ctx: SimpleNamespace, params: Any) -> None:
        verb, resource = classify(params.method, params.url)
        record(verb, resource, params.response.status)

    config = aiohttp.TraceConfig()
    config.on_request_end.append(on_end)
    return config
