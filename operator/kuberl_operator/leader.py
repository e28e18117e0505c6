"""Leader election on a coordination.k8s.io/v1 Lease: one operator replica acts, the others wait to take over.

A candidate takes the Lease when it is absent, released (no holder), or unchanged for a whole duration as this
process's own monotonic clock measures: the longer of its own ``--lease-seconds`` and the Lease's
``leaseDurationSeconds`` (so a replica with a shorter setting, mid-rollout, cannot cut a longer Lease short). A
peer's clock, in ``renewTime``, never counts, so clock skew between nodes cannot hand the Lease over early. Every
write carries the resourceVersion read, so of two candidates only one wins (the other gets 409 and looks again).

The leader renews every third of the duration. Its deadline is two thirds of a duration after the last renewal
that succeeded, counted from when that request was *sent*; every request's timeout ends by the deadline, and on it
(or on any error in the renewer itself) the process exits at once (code 1, as client-go's leaders do): a peer may
take the Lease only a whole duration after it last changed, so the old leader has stopped a third of a duration
(at least 2 s) before. Its pod restarts as a candidate. On a clean stop (SIGTERM, a rollout) the leader releases
the Lease, so a peer takes over within one retry period.

Takeover after a leader dies: at most ``duration + 2 x retry`` seconds and a request's time, then kopf's start
(its first watch lists). Not fenced: a leader frozen (SIGSTOP, a long GC pause) past its deadline may act for a
moment when it thaws, before its renewer exits the process.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
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
        """The leader's pace of renewals."""
        return self.duration_s / 3

    @property
    def give_up_after_s(self) -> float:
        """No renewal for this long: the leader exits, a third of a duration before a peer may take over."""
        return self.duration_s * 2 / 3

    @property
    def retry_every_s(self) -> float:
        """A candidate's pace of looks at the Lease."""
        return max(self.duration_s / 7.5, 0.5)

    @property
    def path(self) -> str:
        """The Leases of the namespace (API path)."""
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
    return (spec.get("holderIdentity") or "", spec.get("renewTime") or "",
            (lease.get("metadata") or {}).get("resourceVersion", ""))


class Observer:
    """When this process last saw the Lease change (monotonic seconds), and whether its holder may be replaced."""

    def __init__(self) -> None:
        self.record: tuple[str, str, str] | None = None
        self.seen_at = 0.0
        self.lease_s = 0  # the Lease's own leaseDurationSeconds, as last read

    def see(self, lease: Mapping[str, Any] | None, now: float) -> None:
        """Note the Lease as read at ``now``; the wait restarts only when its record changed."""
        record = record_of(lease)
        self.lease_s = int(((lease or {}).get("spec") or {}).get("leaseDurationSeconds") or 0)
        if record != self.record:
            self.record, self.seen_at = record, now

    @property
    def holder(self) -> str:
        """The holder last read ("" when absent or released)."""
        return (self.record or ("", "", ""))[0]

    def may_take(self, terms: Terms, now: float) -> bool:
        """Absent, released, ours, or unchanged for the longer of both durations, on our own clock."""
        return (not self.holder or self.holder == terms.identity
                or now - self.seen_at >= max(terms.duration_s, self.lease_s))


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


class Leases(Protocol):
    """Reads and writes of one Lease; each request ends within ``timeout`` seconds."""

    terms: Terms

    def get(self, timeout: float) -> tuple[int, dict[str, Any] | None]: ...

    def write(self, body: Mapping[str, Any], exists: bool, timeout: float) -> int: ...


class LeaseApi:
    """get / create / replace of one Lease on the API server."""

    def __init__(self, terms: Terms) -> None:
        self.terms = terms

    def get(self, timeout: float) -> tuple[int, dict[str, Any] | None]:
        """(status code, the Lease or an error Status)."""
        return sync_client.request("GET", f"{self.terms.path}/{self.terms.name}", timeout=timeout)

    def write(self, body: Mapping[str, Any], exists: bool, timeout: float) -> int:
        """Create or replace; the status code (409: another candidate wrote first)."""
        if exists:
            return sync_client.request("PUT", f"{self.terms.path}/{self.terms.name}", body, timeout=timeout)[0]
        return sync_client.request("POST", self.terms.path, body, timeout=timeout)[0]


class LeaseError(OSError):
    """The API server answered a Lease request with an error (``code``: 401 or 403 mean this replica never can)."""

    def __init__(self, code: int, what: str) -> None:
        super().__init__(f"{what} answered {code}")
        self.code = code


def try_take(api: Leases, observer: Observer, timeout: float, now: Callable[[], float] = time.monotonic) -> bool:
    """One attempt to become or stay the holder (a read, then maybe a write, each within ``timeout``): True if
    this process holds the Lease after it."""
    terms = api.terms
    code, lease = api.get(timeout)
    if code not in (200, 404):
        raise LeaseError(code, f"reading Lease {terms.namespace}/{terms.name}")
    lease = lease if code == 200 else None
    observer.see(lease, now())
    if not observer.may_take(terms, now()):
        return False
    written = api.write(lease_body(terms, lease, datetime.now(UTC), terms.identity), lease is not None, timeout)
    if written in (200, 201):
        return True
    if written in (404, 409):  # deleted or written meanwhile: look again next time
        return False
    raise LeaseError(written, f"writing Lease {terms.namespace}/{terms.name}")


class Standby:
    """While a candidate waits: its liveness endpoint answers 200 ("standby"), so the kubelet keeps it. Closed by
    the operator's startup handler, just before kopf's own health server takes the port."""

    def __init__(self, url: str | None) -> None:
        self.server: ThreadingHTTPServer | None = None
        if url:
            parts = urlsplit(url)
            host = parts.hostname or "localhost"
            server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
            self.server = server_class((host, parts.port or 80), _StandbyHandler)
            threading.Thread(target=self.server.serve_forever, name="standby-health", daemon=True).start()

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class _StandbyHandler(BaseHTTPRequestHandler):
    """200 to any GET: the process is alive (the Lease is not its to report)."""

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

    def __init__(self, terms: Terms, api: Leases | None = None, on_lost: Callable[[], None] | None = None) -> None:
        self.terms, self.api, self.observer = terms, api or LeaseApi(terms), Observer()
        self.on_lost = on_lost or lost
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def acquire(self, liveness: str | None) -> Standby:
        """Block until this process holds the Lease, serving the liveness endpoint meanwhile; the Standby server is
        returned still serving (the caller closes it when kopf's health server is about to start). A replica refused
        the Lease (401, 403: its RBAC) for a whole duration exits: it never could lead."""
        standby = Standby(liveness)
        waited, refused_since = False, None
        while True:
            try:
                if try_take(self.api, self.observer, self.terms.retry_every_s * 2):
                    break
                refused_since = None
            except LeaseError as exc:
                refused_since = refused_since or time.monotonic()
                if exc.code in (401, 403) and time.monotonic() - refused_since >= self.terms.duration_s:
                    standby.close()
                    raise SystemExit(f"error: {exc}: this replica may not use its Lease (check the chart's Role "
                                     f"{self.terms.name}-leader in {self.terms.namespace})") from None
                log.warning("Lease %s/%s: %s", self.terms.namespace, self.terms.name, exc)
            except OSError as exc:  # unreachable: keep waiting
                log.warning("Lease %s/%s: %s", self.terms.namespace, self.terms.name, exc)
            if not waited and self.observer.holder:
                log.info("standby: Lease %s/%s is held by %s; waiting to take over", self.terms.namespace,
                         self.terms.name, self.observer.holder)
                waited = True
            time.sleep(self.terms.retry_every_s)
        log.info("leader: %s holds Lease %s/%s", self.terms.identity, self.terms.namespace, self.terms.name)
        self.thread = threading.Thread(target=self._hold, args=(time.monotonic(),), name="lease-renewer", daemon=True)
        self.thread.start()
        return standby

    def _hold(self, renewed: float) -> None:
        """Renew until released; on the deadline, a peer holding the Lease, or any error here: ``on_lost``."""
        try:
            while True:
                deadline = renewed + self.terms.give_up_after_s
                if self.stopped.wait(max(min(self.terms.renew_every_s, deadline - time.monotonic()), 0)):
                    return
                sent = time.monotonic()
                if sent >= deadline:
                    break
                try:  # a read and a write, both by the deadline
                    if try_take(self.api, self.observer, (deadline - sent) / 2):
                        renewed = sent
                        continue
                except OSError as exc:
                    log.warning("Lease %s/%s not renewed: %s", self.terms.namespace, self.terms.name, exc)
                    continue
                if self.observer.holder not in ("", self.terms.identity):
                    break
        except BaseException:  # noqa: BLE001 -- whatever broke the renewer, the process must not lead on without it
            log.exception("leader: the Lease renewer failed")
        if not self.stopped.is_set():
            self.on_lost()

    def release(self) -> None:
        """Stop renewing and hand the Lease back (only if still ours), so a peer takes over without waiting."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
        try:
            timeout = self.terms.retry_every_s * 2
            code, lease = self.api.get(timeout)
            if code == 200 and lease and (lease.get("spec") or {}).get("holderIdentity") == self.terms.identity:
                self.api.write(lease_body(self.terms, lease, datetime.now(UTC), None), True, timeout)
        except OSError as exc:
            log.warning("Lease %s/%s not released: %s", self.terms.namespace, self.terms.name, exc)


def lost() -> None:
    """Leadership lost: stop acting at once (a peer takes the Lease a third of a duration later). One line straight
    to stderr: the logging handlers' locks could block the exit."""
    sys.stderr.write("error: leader: the Lease was not renewed in time; exiting so that another replica leads\n")
    sys.stderr.flush()
    os._exit(1)
