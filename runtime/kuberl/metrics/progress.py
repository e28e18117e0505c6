"""Report the driver's progress to the operator through ConfigMap `<job>-progress` (in-cluster only), and read
from the same ConfigMap the replicas the operator asks for (`data.replicas`, kuberl.resilience.resize).

The operator mirrors `data.progress` into the RLTrainingJob status (step, tokens/s, per-role restarts). User code
runs in the driver (the reward module, estimators), so the driver holds no API token: it writes each document to
a file (`ProgressFiles`, in the folder Env.PROGRESS_DIR) and reads the replicas from another, and the pod's
reporter sidecar (kuberl.metrics.reporter), the one container with the ServiceAccount token, relays them with
`ProgressReporter`: plain HTTPS from the standard library, so the runtime image needs no Kubernetes client, and
the driver's Role allows only get/patch on that one ConfigMap. The transport does
what the client's in-cluster configuration would: an IPv6-safe URL, the token re-read for each request
(projected tokens rotate), and bounded retries with backoff on connection errors, 5xx and 429 (honouring
Retry-After up to a bound). The final report, whose reason the operator relies on, is retried longer than
a per-step one. A report that still fails is logged in one line, never fatal.
"""

from __future__ import annotations

import email.utils
import json
import math
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kuberl import logs
from kuberl.metrics.record import StepRecord
from kuberl.spec.contract import (
    MESSAGE_MAX,
    PROGRESS_FILE,
    PROGRESS_KEY,
    REPLICAS_FILE,
    REPLICAS_KEY,
    Env,
    ProgressDocument,
    ReplicasDocument,
    RoleProgress,
)

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # the pod's mount, unless Env.SA_DIR says otherwise
FINAL_PHASES = ("Succeeded", "Failed")
log = logs.get("progress")


def api_url(host: str, port: str) -> str:
    """The API server's URL from KUBERNETES_SERVICE_HOST/PORT; an IPv6 address goes in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"https://{host}:{port}"


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date); None if absent or unreadable."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is refused (an HTTPError), never followed: the request carries the driver's token."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


def plain_http_refused(url: str) -> bool:
    """Whether the token would go out unencrypted: http:// to anything but this machine's loopback."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme != "https" and not (parts.scheme == "http" and parts.hostname in ("127.0.0.1", "::1",
                                                                                           "localhost"))


@dataclass
class ProgressReporter:
    api_url: str  # e.g. https://10.0.0.1:443 or https://[fd00::1]:443
    namespace: str
    configmap: str
    token: str | None = None  # a fixed token; token_file wins when both are given
    ca_file: str | None = None
    timeout_s: float = 5.0  # per attempt
    token_file: str | None = None  # read before every request (no Authorization header while it is missing)
    step_attempts: int = 2  # a per-step report: the next step reports again soon
    final_attempts: int = 8  # the final report (phase Succeeded/Failed): 0.5+1+2+4+8+10+10 s of waiting
    backoff_s: float = 0.5  # the first wait; doubled after each failed attempt
    max_wait_s: float = 10.0  # no wait is longer, Retry-After included

    @classmethod
    def from_env(cls) -> ProgressReporter | None:
        """In the driver pod's reporter sidecar the operator sets Env.PROGRESS_CONFIGMAP and Env.NAMESPACE and
        mounts the token; else None."""
        name = os.environ.get(Env.PROGRESS_CONFIGMAP)
        if not name:
            return None
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        url = os.environ.get(Env.API_URL) or (api_url(host, port) if host else None)
        if url is None:
            return None
        sa_dir = os.environ.get(Env.SA_DIR, SA_DIR)
        token, ca = os.path.join(sa_dir, "token"), os.path.join(sa_dir, "ca.crt")
        return cls(url, os.environ.get(Env.NAMESPACE, "default"), name,
                   ca_file=ca if os.path.exists(ca) else None, token_file=token)

    def _bearer(self) -> str | None:
        if self.token_file:
            try:
                with open(self.token_file) as f:
                    return f.read().strip() or None
            except OSError:
                return None
        return self.token

    def _request(self, method: str, body: bytes | None = None) -> bytes:
        """One request on the ConfigMap (PATCH with a body, GET without); raises urllib's errors (HTTPError
        for an answer other than 2xx)."""
        url = f"{self.api_url}/api/v1/namespaces/{self.namespace}/configmaps/{self.configmap}"
        headers = {"Content-Type": "application/merge-patch+json"} if body is not None else {}
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        token = self._bearer()
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        if plain_http_refused(self.api_url):
            raise urllib.error.URLError(f"{self.api_url} is not https: the ServiceAccount token is never sent in "
                                        f"the clear")
        tls = [urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=self.ca_file))
               ] if self.api_url.startswith("https") else []
        with urllib.request.build_opener(_NoRedirects(), *tls).open(req, timeout=self.timeout_s) as resp:
            return resp.read()

    def _patch(self, body: bytes) -> None:
        self._request("PATCH", body)

    def desired_replicas(self) -> ReplicasDocument | None:
        """The operator's `data.replicas` (one GET, the Role's `get` on this ConfigMap); None when it cannot
        be read now (logged in one line: the driver keeps its sizes and asks again before the next step)."""
        try:
            data = json.loads(self._request("GET")).get("data") or {}
        except (OSError, ValueError) as exc:
            log.warning(f"reading the replicas asked for from {self.configmap} failed: {exc}")
            return None
        return ReplicasDocument.parse(data.get(REPLICAS_KEY))

    def report(self, progress: ProgressDocument, final: bool | None = None) -> bool:
        """Merge-patch `data.progress`, retrying transient failures; returns False (and logs one line) when
        every attempt failed or the API refused for good (a 4xx other than 429). `final` defaults to
        whether the document's phase is Succeeded or Failed."""
        final = progress.phase in FINAL_PHASES if final is None else final
        attempts = self.final_attempts if final else self.step_attempts
        body = json.dumps({"data": {PROGRESS_KEY: progress.to_json()}}).encode()
        for attempt in range(1, attempts + 1):
            try:
                self._patch(body)
                return True
            except OSError as exc:  # HTTPError; connection refused or reset, DNS, timeouts, TLS
                error = exc
                if isinstance(exc, urllib.error.HTTPError) and exc.code != 429 and exc.code < 500:
                    break  # refused (RBAC, a missing ConfigMap): asking again changes nothing
            if attempt < attempts:
                time.sleep(self._wait_s(error, attempt))
        log.warning(f"progress report to {self.configmap} failed after {attempt} attempt(s): {error}")
        return False

    def _wait_s(self, error: OSError, attempt: int) -> float:
        """Seconds before the next attempt: the server's Retry-After, else exponential backoff; both capped."""
        asked = retry_after_s(error.headers.get("Retry-After")) if isinstance(error, urllib.error.HTTPError) else None
        return min(self.max_wait_s, asked if asked is not None else self.backoff_s * 2 ** (attempt - 1))


@dataclass
class ProgressFiles:
    """The driver's side of the reporter sidecar: documents as files in a folder the two containers share."""

    folder: Path

    @classmethod
    def from_env(cls) -> ProgressFiles | None:
        """In a driver pod the operator sets Env.PROGRESS_DIR; else (a local run) None."""
        folder = os.environ.get(Env.PROGRESS_DIR)
        return cls(Path(folder)) if folder else None

    def report(self, progress: ProgressDocument) -> bool:
        """Replace the progress file in one step (the reporter never reads half a document)."""
        part = self.folder / f".{PROGRESS_FILE}.part"
        try:
            part.write_text(progress.to_json())
            os.replace(part, self.folder / PROGRESS_FILE)
        except OSError as exc:
            log.warning(f"writing the progress report to {self.folder} failed: {exc}")
            return False
        return True

    def desired_replicas(self) -> ReplicasDocument | None:
        """The operator's `data.replicas` as the reporter last read it; None before its first read."""
        try:
            return ReplicasDocument.parse((self.folder / REPLICAS_FILE).read_text())
        except OSError:
            return None


def progress_of(rec: StepRecord | None, total_steps: int, phase: str = "Running", message: str = "",
                reason: str | None = None, worst_links: dict[str, str | None] | None = None,
                resumed: tuple[int, int] | None = None) -> ProgressDocument:
    """The progress document after step record `rec` (None: no step done yet); `worst_links` add links
    known without a step (a placement refused at start); `resumed`: the checkpoint step this driver resumed
    from and the steps lost past it (`Driver.resumed`). The operator reads it with ProgressDocument.parse."""
    steps = rec.roles if rec is not None else {}
    roles = {role: RoleProgress(restarts=rs.restarts, worst_link=rs.worst_link,
                                last_failure=rs.last_failure[:MESSAGE_MAX] if rs.last_failure else None,
                                standby_ready=rs.standby_ready, replicas=rs.replicas, hosts=rs.hosts)
             for role, rs in steps.items()}
    for role, link in (worst_links or {}).items():
        if link:
            known = roles[role].model_dump() if role in roles else {}
            roles[role] = RoleProgress(**{**known, "worst_link": link})
    rate = rec.rollout_tokens_per_s if rec is not None and math.isfinite(rec.rollout_tokens_per_s or 0.0) else None
    return ProgressDocument(step=rec.step if rec else 0, total_steps=total_steps,
                            tokens_per_sec=round(rate or 0.0, 1), phase=phase, message=message[:MESSAGE_MAX],
                            reason=str(reason) if reason else None, roles=roles,
                            resumed_from=resumed[0] if resumed else None, steps_lost=resumed[1] if resumed else None,
                            step_seconds=finite(rec.step_s) if rec else None, metrics=step_metrics(rec) or None)


REPORTED = {"rewardMean": "reward_mean", "rewardStd": "reward_std", "responseLengthMean": "response_length_mean"}


def finite(value: float | None) -> float | None:
    """``value`` to 4 decimals, or None when missing, NaN or infinite (the report carries finite figures only)."""
    return round(value, 4) if value is not None and math.isfinite(value) else None


def step_metrics(rec: StepRecord | None) -> dict[str, float]:
    """The figures of a step the operator shows in status.trainerStatus.metrics (REPORTED), the finite ones."""
    found = {name: finite(getattr(rec, field)) for name, field in REPORTED.items()} if rec is not None else {}
    return {name: value for name, value in found.items() if value is not None}
