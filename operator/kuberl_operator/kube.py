"""A minimal async Kubernetes client on aiohttp, using kopf's login (kubeconfig or service account).

kopf is not a client library; the operator needs only create, merge-patch and delete of a few kinds (it reads
from its watch-backed cache), so it carries this small client instead of a large generated one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        """The object's path; with ``namespace`` None, the kind's across the cluster (or a cluster-scoped kind's)."""
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        scope = f"{base}/namespaces/{namespace}" if namespace is not None else base
        return f"{scope}/{self.plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


PODS = Resource("", "v1", "pods")
NODES = Resource("", "v1", "nodes")
EVENTS = Resource("", "v1", "events")
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts")
JOBS = Resource("batch", "v1", "jobs")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings")
RAYCLUSTERS = Resource("ray.io", "v1", "rayclusters")
RESOURCECLAIMTEMPLATES = Resource("resource.k8s.io", "v1", "resourceclaimtemplates")
NETWORKPOLICIES = Resource("networking.k8s.io", "v1", "networkpolicies")
RLTRAININGJOBS = Resource("kuberl.io", "v1alpha1", "rltrainingjobs")

BY_KIND = {
    ("v1", "Event"): EVENTS, ("v1", "ConfigMap"): CONFIGMAPS, ("v1", "Secret"): SECRETS,
    ("v1", "ServiceAccount"): SERVICEACCOUNTS,
    ("batch/v1", "Job"): JOBS, ("rbac.authorization.k8s.io/v1", "Role"): ROLES,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ROLEBINDINGS, ("ray.io/v1", "RayCluster"): RAYCLUSTERS,
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): RESOURCECLAIMTEMPLATES,
    ("networking.k8s.io/v1", "NetworkPolicy"): NETWORKPOLICIES,
}


def resource_of(obj: Mapping[str, Any]) -> Resource:
    return BY_KIND[(obj["apiVersion"], obj["kind"])]


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def login(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """The same credentials kopf's built-in login finds: in-cluster first, then a kubeconfig."""
    conn = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    if conn is None:
        raise kopf.LoginError("no service account and no kubeconfig: cannot reach the Kubernetes API")
    return conn


class Kube:
    """create / patch / delete, raising ApiError on failures (delete: False on 404). Reads come from the
    watch-backed cache (cache.py), never from here."""

    def __init__(self, settings: kopf.OperatorSettings, user_agent: str = "kuberl-operator",
                 trace: aiohttp.TraceConfig | None = None):
        self.settings = settings
        self.user_agent = user_agent
        self.trace = trace  # counts every request (api_traffic.py)
        self.session: aiohttp.ClientSession | None = None

    async def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            conn = login(self.settings)
            ssl = conn.as_ssl_context() if conn.server.startswith("https") else False
            self.session = aiohttp.ClientSession(
                base_url=conn.server.rstrip("/") + "/",
                headers={**conn.as_http_headers(), "User-Agent": self.user_agent},
                connector=aiohttp.TCPConnector(ssl=ssl),
                timeout=aiohttp.ClientTimeout(total=30),
                trace_configs=[self.trace] if self.trace else None,
            )
        return self.session

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def _send(self, method: str, path: str, body: Any, ctype: str,
                    params: Mapping[str, str] | None) -> tuple[int, Any]:
        session = await self._session()
        async with session.request(method, path.lstrip("/"), json=body, params=params,
                                   headers={"Content-Type": ctype}) as rsp:
            text = await rsp.text()
            try:
                return rsp.status, json.loads(text) if text else None
            except ValueError:
                return rsp.status, {"reason": rsp.reason or "", "message": text[:200]}

    async def request(self, method: str, path: str, body: Any = None, ctype: str = "application/json",
                      params: Mapping[str, str] | None = None) -> Any:
        status, data = await self._send(method, path, body, ctype, params)
        if status == 401:  # a rotated service-account token: log in again, once
            await self.close()
            status, data = await self._send(method, path, body, ctype, params)
        if status >= 400:
            data = data if isinstance(data, dict) else {}
            raise ApiError(status, data.get("reason", ""), data.get("message", ""))
        return data

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return await self.request("POST", resource_of(obj).path(meta["namespace"]), dict(obj))

    async def list(self, res: Resource, namespace: str | None, **params: str) -> list[dict[str, Any]]:
        """The items of one LIST request (``params``: labelSelector, fieldSelector) in ``namespace``, or with None
        across the cluster (a cluster-scoped kind's: None)."""
        return (await self.request("GET", res.path(namespace), params=params) or {}).get("items") or []

    async def patch(self, res: Resource, namespace: str, name: str, patch: Mapping[str, Any],
                    sub: str | None = None) -> dict[str, Any]:
        """JSON merge patch; a metadata.resourceVersion in it makes the server refuse stale writes (409)."""
        return await self.request("PATCH", res.path(namespace, name, sub), dict(patch), "application/merge-patch+json")

    async def json_patch(self, res: Resource, namespace: str, name: str,
                         ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """JSON patch (RFC 6902): operations on paths, a ``test`` among them refusing a changed object (422)."""
        return await self.request("PATCH", res.path(namespace, name), list(ops), "application/json-patch+json")

    async def delete(self, res: Resource, namespace: str, name: str) -> bool:
        """Delete in the background (dependents go via garbage collection); False if already gone."""
        try:
            await self.request("DELETE", res.path(namespace, name), params={"propagationPolicy": "Background"})
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True
