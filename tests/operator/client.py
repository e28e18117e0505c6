"""A small synchronous Kubernetes client for tests (what `kubectl` does for a user)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

PODS = "v1/pods"
CONFIGMAPS = "v1/configmaps"
SECRETS = "v1/secrets"
SERVICEACCOUNTS = "v1/serviceaccounts"
EVENTS = "v1/events"
NAMESPACES = "v1/namespaces"
JOBS = "batch/v1/jobs"
ROLES = "rbac.authorization.k8s.io/v1/roles"
ROLEBINDINGS = "rbac.authorization.k8s.io/v1/rolebindings"
RAYCLUSTERS = "ray.io/v1/rayclusters"
RESOURCECLAIMTEMPLATES = "resource.k8s.io/v1/resourceclaimtemplates"
RLTJ = "kuberl.io/v1alpha1/rltrainingjobs"


class ApiError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


class Client:
    """get/list/create/patch/delete against an API server, by resource strings like ``v1/pods``."""

    def __init__(self, server: str, namespace: str):
        self.server = server.rstrip("/")
        self.namespace = namespace

    def url(self, resource: str, name: str | None = None, namespace: str | None = "", sub: str | None = None) -> str:
        *gv, plural = resource.split("/")
        base = "/api/v1" if gv == ["v1"] else f"/apis/{'/'.join(gv)}"
        ns = self.namespace if namespace == "" else namespace
        path = f"{base}/namespaces/{ns}/{plural}" if ns else f"{base}/{plural}"
        return self.server + path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    def request(self, method: str, url: str, body: Any = None, ctype: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": ctype, "User-Agent": "kuberl-tests"})
        try:
            with urllib.request.urlopen(req, timeout=10) as rsp:
                return json.loads(rsp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace")) from None

    def get(self, resource: str, name: str, namespace: str | None = "") -> dict[str, Any] | None:
        try:
            return self.request("GET", self.url(resource, name, namespace))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, resource: str, selector: str | None = None, namespace: str | None = "") -> list[dict[str, Any]]:
        query = "?" + urllib.parse.urlencode({"labelSelector": selector}) if selector else ""
        return self.request("GET", self.url(resource, namespace=namespace) + query)["items"]

    def create(self, resource: str, body: dict[str, Any], namespace: str | None = "") -> dict[str, Any]:
        return self.request("POST", self.url(resource, namespace=namespace), body)

    def patch(self, resource: str, name: str, body: dict[str, Any], sub: str | None = None) -> dict[str, Any]:
        return self.request("PATCH", self.url(resource, name, sub=sub), body, "application/merge-patch+json")

    def delete(self, resource: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("DELETE", self.url(resource, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
