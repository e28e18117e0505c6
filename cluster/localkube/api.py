"""A small synchronous Kubernetes client (what `kubectl` does for a person), standard library only.

Resources are strings like ``v1/pods`` or ``ray.io/v1/rayclusters``; ``namespace=None`` addresses
cluster-scoped ones. TLS with the cluster's CA, and a client certificate or a bearer token.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

PODS = "v1/pods"
NODES = "v1/nodes"
CONFIGMAPS = "v1/configmaps"
SECRETS = "v1/secrets"
SERVICEACCOUNTS = "v1/serviceaccounts"
SERVICES = "v1/services"
EVENTS = "v1/events"
NAMESPACES = "v1/namespaces"
JOBS = "batch/v1/jobs"
ROLES = "rbac.authorization.k8s.io/v1/roles"
ROLEBINDINGS = "rbac.authorization.k8s.io/v1/rolebindings"
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
RAYCLUSTERS = "ray.io/v1/rayclusters"
RESOURCECLAIMTEMPLATES = "resource.k8s.io/v1/resourceclaimtemplates"
NETWORKPOLICIES = "networking.k8s.io/v1/networkpolicies"
RLTJ = "kuberl.io/v1alpha1/rltrainingjobs"
CLUSTERROLES = "rbac.authorization.k8s.io/v1/clusterroles"
CLUSTERROLEBINDINGS = "rbac.authorization.k8s.io/v1/clusterrolebindings"
ENDPOINTS = "v1/endpoints"
ENDPOINTSLICES = "discovery.k8s.io/v1/endpointslices"
STORAGECLASSES = "storage.k8s.io/v1/storageclasses"
DEVICECLASSES = "resource.k8s.io/v1/deviceclasses"
RESOURCESLICES = "resource.k8s.io/v1/resourceslices"
PERSISTENTVOLUMES = "v1/persistentvolumes"
MUTATING_WEBHOOKS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING_WEBHOOKS = "admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
CLUSTERQUEUES = "kueue.x-k8s.io/v1beta2/clusterqueues"
LOCALQUEUES = "kueue.x-k8s.io/v1beta2/localqueues"
RESOURCEFLAVORS = "kueue.x-k8s.io/v1beta2/resourceflavors"
WORKLOADS = "kueue.x-k8s.io/v1beta2/workloads"
CLUSTER_SCOPED = {NODES, NAMESPACES, CRDS, CLUSTERROLES, CLUSTERROLEBINDINGS, STORAGECLASSES, PERSISTENTVOLUMES,
                  MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS, CLUSTERQUEUES, RESOURCEFLAVORS,
                  DEVICECLASSES, RESOURCESLICES}


class ApiError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:800]}")
        self.status, self.body = status, body

    @property
    def message(self) -> str:
        try:
            return json.loads(self.body).get("message", self.body)
        except ValueError:
            return self.body


class Api:
    """get/list/create/patch/apply/delete against one API server, in one default namespace."""

    def __init__(
        self,
        server: str,
        ca_file: Path,
        namespace: str = "default",
        cert: tuple[Path, Path] | None = None,
        token: str | None = None,
        timeout: float = 30,
    ):
        self.server, self.namespace, self.timeout = server.rstrip("/"), namespace, timeout
        self.ssl = ssl.create_default_context(cafile=str(ca_file))
        if cert is not None:
            self.ssl.load_cert_chain(str(cert[0]), str(cert[1]))
        self.headers = {"User-Agent": "kuberl-localkube"} | ({"Authorization": f"Bearer {token}"} if token else {})

    def in_namespace(self, namespace: str) -> Api:
        """The same credentials, another default namespace."""
        other = object.__new__(Api)
        other.__dict__.update(self.__dict__, namespace=namespace)
        return other

    def url(
        self,
        resource: str,
        name: str | None = None,
        namespace: str | None = "",
        sub: str | None = None,
        query: dict[str, str] | None = None,
    ) -> str:
        *gv, plural = resource.split("/")
        base = "/api/v1" if gv == ["v1"] else f"/apis/{'/'.join(gv)}"
        ns = None if resource in CLUSTER_SCOPED else (self.namespace if namespace == "" else namespace)
        path = f"{base}/namespaces/{ns}/{plural}" if ns else f"{base}/{plural}"
        path += (f"/{name}" if name else "") + (f"/{sub}" if sub else "")
        return self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")

    def request(self, method: str, url: str, body: Any = None, ctype: str = "application/json") -> Any:
        data = None if body is None else body.encode() if isinstance(body, str) else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={**self.headers, "Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.ssl) as rsp:
                raw = rsp.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace")) from None
        try:
            return json.loads(raw or b"null")
        except ValueError:
            return raw.decode(errors="replace")

    def raw(self, path: str) -> Any:
        return self.request("GET", self.server + path)

    def get(
        self, resource: str, name: str, namespace: str | None = "", sub: str | None = None
    ) -> dict[str, Any] | None:
        try:
            return self.request("GET", self.url(resource, name, namespace, sub))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self, resource: str, selector: str | None = None, namespace: str | None = "", fields: str | None = None
    ) -> list[dict[str, Any]]:
        query = {k: v for k, v in (("labelSelector", selector), ("fieldSelector", fields)) if v}
        return self.request("GET", self.url(resource, namespace=namespace, query=query))["items"]

    def create(
        self,
        resource: str,
        body: dict[str, Any],
        namespace: str | None = "",
        sub: str | None = None,
        name: str | None = None,
        strict: bool = False,
    ) -> dict[str, Any]:
        query = {"fieldValidation": "Strict"} if strict else None
        return self.request("POST", self.url(resource, name, namespace, sub, query), body)

    def patch(
        self, resource: str, name: str, body: dict[str, Any], sub: str | None = None, namespace: str | None = ""
    ) -> dict[str, Any]:
        return self.request("PATCH", self.url(resource, name, namespace, sub), body, "application/merge-patch+json")

    def apply(
        self,
        resource: str,
        name: str,
        body: str | dict[str, Any],
        manager: str = "localkube",
        namespace: str | None = "",
    ) -> dict[str, Any]:
        """Server-side apply (a large CRD would not fit client-side apply's annotation)."""
        query = {"fieldManager": manager, "force": "true", "fieldValidation": "Strict"}
        return self.request(
            "PATCH", self.url(resource, name, namespace, query=query), body, "application/apply-patch+yaml"
        )

    def token(self, namespace: str, service_account: str, seconds: int = 4 * 3600) -> str:
        """A ServiceAccount's token (TokenRequest), as the kubelet would mount it into the account's pods."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        return self.create(SERVICEACCOUNTS, body, namespace=namespace, name=service_account, sub="token")["status"][
            "token"
        ]

    def delete(
        self, resource: str, name: str, namespace: str | None = "", body: dict | None = None
    ) -> dict[str, Any] | None:
        try:
            return self.request("DELETE", self.url(resource, name, namespace), body)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
