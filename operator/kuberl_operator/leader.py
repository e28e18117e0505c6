"""Leader election on a coordination.k8s.io/v1 Lease: one operator replica acts, the others wait to take over.

A candidate takes the Lease when it is absent, released (no holder), or unchanged for a whole
``leaseDurationSeconds`` as this process's own monotonic clock measures: a peer's clock, in ``renewTime``, never
counts, so clock skew between nodes cannot hand the Lease over early. Every write carries the resourceVersion read,
so of two candidates only one wins (the other gets 409 and looks again).

The leader renews every third of the duration. If no renewal has succeeded for two thirds of it, the process exits
at once (code 1, like client-go's leaders): a peer may take the Lease only after a whole duration without a change,
so the old leader has stopped acting a third of a duration before. Its pod restarts as a candidate. On a clean stop
(SIGTERM, a rollout) the leader releases the Lease, so a peer takes over within one retry period.

Takeover after a leader dies: at most ``duration + retry`` seconds, then kopf's start (its first watch lists).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from kuberl.version import version

from . import sync_client
from .config import DEFAULT_LEASE_SECONDS

log = logging.getLogger("kuberl_operator.leader")
VERSION_ANNOTATION = "kuberl.io/operator-version"


@dataclass(frozen=True)
class Terms:
    """Which Lease, who this process is, and its timing (seconds)."""

    namespace: str
    name: str
    identity: str
    duration_s: int = DEFAULT_LEASE_SECONDS

    @property
    def renew_every_s(self) -> float:
        return self.duration_s / 3

    @property
    def give_up_after_s(self) -> float:
        """No renewal for this long: the leader exits, a third of a duration before a peer may take over."""
        return self.duration_s * 2 / 3

    @property
    def retry_every_s(self) -> float:
        return max(self.duration_s / 7.5, 0.5)

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"


def identity() -> str:
    """This process's holder name: the pod's name (its hostname in a pod) and a random suffix (a restarted
    container in the same pod is another candidate)."""
    return f"{socket.gethostname()}_{os.urandom(3).hex()}"


def micro_time(at: datetime | None = None) -> str:
    """A MicroTime, as Lease's acquireTime and renewTime are written."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_of(lease: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """What must change for a holder to count as alive: holder, renewTime and resourceVersion."""
    if not lease:
        return ("", "", "")
    spec = lease.get("spec") or {}
    return (spec.get("holderIdentity") or "", spec.get("renewTime") or "", lease["metadata"].get("resourceVersion", ""))


class Observer:
    """When this process last saw the Lease change (monotonic seconds), and whether its holder may be replaced."""

    def __init__(self) -> None:
        self.record: tuple[str, str, str] | None = None
        self.seen_at = 0.0

    def see(self, lease: Mapping[str, Any] | None, now: float) -> None:
        record = record_of(lease)
        if record != self.record:
            self.record, self.seen_at = record, now

    @property
    def holder(self) -> str:
        return (self.record or ("", "", ""))[0]

    def may_take(self, terms: Terms, now: float) -> bool:
        """Absent, released, ours, or unchanged for a whole duration of our own clock."""
        return not self.holder or self.holder == terms.identity or now - self.seen_at >= terms.duration_s


def lease_body(terms: Terms, lease: Mapping[str, Any] | None, now: datetime, holder: str | None) -> dict[str, Any]:
    """The Lease to write: ``holder`` renewing or taking it (acquireTime and transitions move on a change of
    holder), or None releasing it. ``lease`` is the one read (its resourceVersion guards the write)."""
    old = dict((lease or {}).get("spec") or {})
    spec: dict[str, Any] = {**old, "leaseDurationSeconds": terms.duration_s, "renewTime": micro_time(now)}
    if holder is None:
        spec.update(holderIdentity=None, leaseDurationSeconds=1)
    elif old.get("holderIdentity") != holder:
        spec.update(holderIdentity=holder, acquireTime=micro_time(now),
                    leaseTransitions=int(old.get("leaseTransitions") or 0) + (1 if lease else 0))
    meta: dict[str, Any] = {"name": terms.name, "namespace": terms.namespace,
                            "annotations": {VERSION_ANNOTATION: version()},
                            "labels": {"app.kubernetes.io/name": "kuberl", "app.kubernetes.io/component": "operator"}}
    if lease:
        meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


class LeaseApi:
    """get / create / replace of one Lease."""

    def __init__(self, terms: Terms):
        self.terms = terms

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        return sync_client.request(method, path, body, timeout=max(self.terms.retry_every_s, 2))

    def get(self) -> tuple[int, dict[str, Any] | None]:
        return self._call("GET", f"{self.terms.path}/{self.terms.name}")

    def write(self, body: Mapping[str, Any], exists: bool) -> int:
        """Create or replace; the status code (409: another candidate wrote first)."""
        if exists:
            return self._call("PUT", f"{self.terms.path}/{self.terms.name}", body)[0]
        return self._call("POST", self.terms.path, body)[0]


def try_take(api: LeaseApi, observer: Observer, now: Callable[[], float] = time.monotonic) -> bool:
    """One attempt to become or stay the holder: True if this process holds the Lease after it."""
    terms = api.terms
    code, lease = api.get()
    if code not in (200, 404):
        raise OSError(f"reading Lease {terms.namespace}/{terms.name} answered {code}")
    lease = lease if code == 200 else None
    observer.see(lease, now())
    if not observer.may_take(terms, now()):
        return False
    written = api.write(lease_body(terms, lease, datetime.now(UTC), terms.identity), exists=lease is not None)
    if written in (200, 201):
        return True
    if written in (404, 409):  # deleted or written meanwhile: look again next time
        return False
    raise OSError(f"writing Lease {terms.namespace}/{terms.name} answered {written}")


class Standby:
    """While a candidate waits: its liveness endpoint answers 200 ("standby"), so the kubelet keeps it."""

    def __init__(self, url: str | None):
        self.server: ThreadingHTTPServer | None = None
        if url:
            parts = urlsplit(url)
            self.server = ThreadingHTTPServer((parts.hostname or "127.0.0.1", parts.port or 80), _StandbyHandler)
            threading.Thread(target=self.server.serve_forever, name="standby-health", daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class _StandbyHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b'{"leader": false}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


class Elector:
    """Wait for the Lease, hold it from a thread, and release it on a clean stop."""

    def __init__(self, terms: Terms, on_lost: Callable[[], None] | None = None):
        self.terms, self.api, self.observer = terms, LeaseApi(terms), Observer()
        self.on_lost = on_lost or lost
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def acquire(self, liveness: str | None) -> None:
        """Block until this process holds the Lease, serving the liveness endpoint meanwhile."""
        standby = Standby(liveness)
        waited = False
        try:
            while not self._attempt():
                if not waited:
                    log.info("standby: Lease %s/%s is held by %s; waiting to take over", self.terms.namespace,
                             self.terms.name, self.observer.holder)
                    waited = True
                time.sleep(self.terms.retry_every_s)
        finally:
            standby.close()
        log.info("leader: %s holds Lease %s/%s", self.terms.identity, self.terms.namespace, self.terms.name)
        self.thread = threading.Thread(target=self._hold, name="lease-renewer", daemon=True)
        self.thread.start()

    def _attempt(self) -> bool:
        try:
            return try_take(self.api, self.observer)
        except (OSError, ValueError, ssl.SSLError) as exc:
            log.warning("Lease %s/%s: %s", self.terms.namespace, self.terms.name, exc)
            return False

    def _hold(self) -> None:
        renewed = time.monotonic()
        while not self.stopped.wait(self.terms.renew_every_s):
            if self._attempt():
                renewed = time.monotonic()
            elif self.observer.holder not in ("", self.terms.identity) or (
                    time.monotonic() - renewed >= self.terms.give_up_after_s):
                self.on_lost()
                return

    def release(self) -> None:
        """Stop renewing and hand the Lease back (only if still ours), so a peer takes over without waiting."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
        try:
            code, lease = self.api.get()
            if code == 200 and lease and (lease.get("spec") or {}).get("holderIdentity") == self.terms.identity:
                self.api.write(lease_body(self.terms, lease, datetime.now(UTC), None), exists=True)
        except (OSError, ValueError, ssl.SSLError) as exc:
            log.warning("Lease %s/%s not released: %s", self.terms.namespace, self.terms.name, exc)


def lost() -> None:
    """Leadership lost: stop acting at once (a peer takes the Lease a third of a duration later)."""
    log.error("leader: the Lease could not be renewed in time; exiting so that another replica takes over")
    logging.shutdown()
    os._exit(1)
