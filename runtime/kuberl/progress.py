"""Report the driver's progress to the operator by patching ConfigMap `<job>-progress` (in-cluster only).

The operator mirrors `data.progress` into the RLTrainingJob status (step, tokens/s, per-role restarts).
Plain HTTPS with the pod's service-account token: the runtime needs no Kubernetes client, and the
driver's Role allows only get/patch on that one ConfigMap. A failed report is logged, never fatal.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SA_DIR_ENV = "KUBERL_SA_DIR"  # where the token and ca.crt are; the pod's mount unless set (a driver run outside a pod)


@dataclass
class ProgressReporter:
    api_url: str  # e.g. https://10.0.0.1:443
    namespace: str
    configmap: str
    token: Optional[str] = None
    ca_file: Optional[str] = None
    timeout_s: float = 5.0

    @classmethod
    def from_env(cls) -> Optional["ProgressReporter"]:
        """In a driver pod the operator sets KUBERL_PROGRESS_CONFIGMAP and KUBERL_NAMESPACE; else None."""
        name = os.environ.get("KUBERL_PROGRESS_CONFIGMAP")
        if not name:
            return None
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        url = os.environ.get("KUBERL_API_URL") or (f"https://{host}:{port}" if host else None)
        if url is None:
            return None
        sa_dir = os.environ.get(SA_DIR_ENV, SA_DIR)
        token_path = os.path.join(sa_dir, "token")
        token = open(token_path).read().strip() if os.path.exists(token_path) else None
        ca = os.path.join(sa_dir, "ca.crt")
        return cls(url, os.environ.get("KUBERL_NAMESPACE", "default"), name, token, ca if os.path.exists(ca) else None)

    def report(self, progress: dict[str, Any]) -> bool:
        """Merge-patch `data.progress`; returns False (and logs one line) when the API refuses."""
        body = json.dumps({"data": {"progress": json.dumps(progress)}}).encode()
        req = urllib.request.Request(f"{self.api_url}/api/v1/namespaces/{self.namespace}/configmaps/{self.configmap}",
                                     data=body, method="PATCH", headers={"Content-Type": "application/merge-patch+json"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        ctx = ssl.create_default_context(cafile=self.ca_file) if self.api_url.startswith("https") else None
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=ctx):
                return True
        except OSError as exc:  # URLError, HTTPError, timeouts
            print(f"warning: progress report to {self.configmap} failed: {exc}", file=sys.stderr)
            return False


def progress_of(rec: dict[str, Any], total_steps: int, phase: str = "Running", message: str = "",
                reason: str = "", worst_links: Optional[dict[str, Optional[str]]] = None) -> dict[str, Any]:
    """The progress document for one step record (see kuberl_operator.progress for the reader)."""
    roles: dict[str, dict[str, Any]] = {k[len("restarts_"):]: {"restarts": v} for k, v in rec.items() if k.startswith("restarts_")}
    for role, link in {**{k[len("worst_link_"):]: v for k, v in rec.items() if k.startswith("worst_link_")}, **(worst_links or {})}.items():
        if link:
            roles.setdefault(role, {})["worstLink"] = link
    doc = {"step": rec.get("step", 0), "totalSteps": total_steps, "tokensPerSec": round(rec.get("rollout_tokens_per_s", 0.0), 1),
           "phase": phase, "message": message, "roles": roles}
    if reason:
        doc["reason"] = reason
    return doc
