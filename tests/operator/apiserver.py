"""A Kubernetes API server for tests: kmock 0.8's emulator with the semantics kopf and the operator need.

kmock stores objects and streams watch events; this subclass adds what a real API server does and
the operator depends on:

- create stamps ``uid``, ``creationTimestamp``, ``generation`` and ``resourceVersion``, fills
  ``generateName``, drops ``status`` of resources with a status subresource, and answers 201;
- PATCH understands JSON-patch (kopf's patches start with a ``test`` on ``resourceVersion``: a
  failed test is 422) and merge-patch (a ``metadata.resourceVersion`` in it is a precondition: 409);
  the status subresource changes only ``status`` and the main resource never does; every change
  bumps ``resourceVersion``, a spec change bumps ``generation``;
- delete honours finalizers (``deletionTimestamp`` first, removal once they are gone);
- list and watch filter by namespace and ``labelSelector``, lists carry ``kind`` and a real
  ``resourceVersion``, and a watch replays only objects newer than the one it starts from;
- core discovery answers ``groupVersion: v1``;
- every write passes an admission ``validator``; a rejected write is answered 422 and recorded in
  ``rejections`` so that tests can assert that the operator never wrote an invalid object;
- kmock's request log is cut to the current request: its routing re-scans the whole log on every
  request, which over a test session turns milliseconds into hundreds of them.

There is no garbage collection, as in kmock: the operator must delete what it owns itself.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import secrets
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import enums, parsing, rendering

Validator = Callable[[dict[str, Any]], list[str]]

VERBS = {"create", "delete", "get", "list", "patch", "watch"}
RESOURCES: dict[str, kmock.ResourceInfo] = {
    "v1/namespaces": kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs=VERBS),
    "v1/pods": kmock.ResourceInfo(kind="Pod", namespaced=True, verbs=VERBS, subresources={"status"}),
    "v1/configmaps": kmock.ResourceInfo(kind="ConfigMap", namespaced=True, verbs=VERBS),
    "v1/secrets": kmock.ResourceInfo(kind="Secret", namespaced=True, verbs=VERBS),
    "v1/serviceaccounts": kmock.ResourceInfo(kind="ServiceAccount", namespaced=True, verbs=VERBS),
    "v1/events": kmock.ResourceInfo(kind="Event", namespaced=True, verbs=VERBS),
    "batch/v1/jobs": kmock.ResourceInfo(kind="Job", namespaced=True, verbs=VERBS, subresources={"status"}),
    "rbac.authorization.k8s.io/v1/roles": kmock.ResourceInfo(kind="Role", namespaced=True, verbs=VERBS),
    "rbac.authorization.k8s.io/v1/rolebindings": kmock.ResourceInfo(kind="RoleBinding", namespaced=True, verbs=VERBS),
    "ray.io/v1/rayclusters": kmock.ResourceInfo(kind="RayCluster", namespaced=True, verbs=VERBS, subresources={"status"}),
    "resource.k8s.io/v1/resourceclaimtemplates": kmock.ResourceInfo(kind="ResourceClaimTemplate", namespaced=True, verbs=VERBS),
    "kuberl.io/v1alpha1/rltrainingjobs": kmock.ResourceInfo(
        kind="RLTrainingJob", namespaced=True, verbs=VERBS, subresources={"status"}, shortnames={"rltj"}
    ),
}


_kmock_parse_path = parsing.parse_path


def parse_path(path: str) -> parsing.ParsedPath:
    """kmock 0.8 reads ``/api/v1/namespaces[/NAME]`` as a namespace with no resource; fix that."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and (len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize"))):
        return parsing.ParsedPath(group="", version="v1", plural="namespaces",
                                  name=parts[3] if len(parts) > 3 else None,
                                  subresource=parts[4] if len(parts) > 4 else None)
    return _kmock_parse_path(path)


parsing.parse_path = parse_path


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def parse_selector(text: str | None) -> list[tuple[str, str, str | None]]:
    """``a=b,c!=d,e,!f`` -> [(op, key, value)] with op in = != exists !exists."""
    terms: list[tuple[str, str, str | None]] = []
    for term in filter(None, (t.strip() for t in (text or "").split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append(("!=", key.strip(), value.strip()))
        elif "=" in term:
            key, value = term.split("=", 1)
            terms.append(("=", key.strip(), value.strip().lstrip("=")))
        elif term.startswith("!"):
            terms.append(("!exists", term[1:].strip(), None))
        else:
            terms.append(("exists", term, None))
    return terms


def selector_matches(terms: list[tuple[str, str, str | None]], labels: Mapping[str, str]) -> bool:
    for op, key, value in terms:
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!exists" and key in labels:
            return False
    return True


def rv_of(obj: Mapping[str, Any]) -> int:
    return int(obj.get("metadata", {}).get("resourceVersion") or 0)


def _error(status: int, reason: str, message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=status, reason=reason, message=message, details={})


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with real write semantics, selectors, discovery fixes and admission."""

    validator: Validator | None = None
    rejections: list[dict[str, Any]] = attrs.field(factory=list)
    _revision: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, info in RESOURCES.items():
            self.resources[key] = info

    # -- writes -------------------------------------------------------------------------------

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        del self._requests[:-1]  # kmock matches each request against all past ones: keep it O(1)
        writes = (enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE)
        if request.resource is None or request.action not in writes:
            return await kmock.RawHandler._handle(self, request)  # discovery, list, watch, get
        try:
            async with self._lock:
                status, body, event = self._write(request)
                if event is not None:
                    await self._buses[request.resource].put(event)
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)
        return aiohttp.web.json_response(body, status=status)

    def _write(self, request: rendering.Request) -> tuple[int, dict[str, Any], dict[str, Any] | None]:
        info = self._info(request.resource)
        if request.action == enums.action.CREATE:
            return self._create(request, info)
        if request.name is None:
            raise _error(405, "MethodNotAllowed", "collection writes are not supported")
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            raise _error(404, "NotFound", f"{info.kind} {request.name!r} not found")
        if request.action == enums.action.UPDATE:
            return self._patch(request, info, key)
        return self._delete(request, key)

    def _create(self, request: rendering.Request, info: kmock.ResourceInfo) -> tuple[int, dict, dict]:
        if not isinstance(request.data, dict):
            raise _error(400, "BadRequest", "the body must be a JSON object")
        obj = copy.deepcopy(request.data)
        group, version = request.resource.group, request.resource.version
        api_version = f"{group}/{version}" if group else version
        if obj.setdefault("apiVersion", api_version) != api_version or obj.setdefault("kind", info.kind) != info.kind:
            raise _error(400, "BadRequest", f"expected {api_version} {info.kind}, got {obj['apiVersion']} {obj['kind']}")
        meta = obj.setdefault("metadata", {})
        if info.namespaced:
            if not request.namespace:
                raise _error(400, "BadRequest", "a namespaced object needs a namespace in the URL")
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)
        if not meta.get("name"):
            raise _error(422, "Invalid", "metadata.name or metadata.generateName is required")
        key = (request.resource, meta.get("namespace"), meta["name"])
        if key in self.objects and not self.objects[key].deleted:
            raise _error(409, "AlreadyExists", f"{info.kind} {meta['name']!r} already exists")
        if "status" in info.subresources:
            obj.pop("status", None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), generation=1,
                    resourceVersion=self._next_rv())
        self._admit(request, obj)
        if key in self.objects:
            self.objects[key].create(obj)
        else:
            self.objects[key] = obj
        return 201, obj, {"type": "ADDED", "object": obj}

    def _patch(self, request: rendering.Request, info: kmock.ResourceInfo, key: tuple) -> tuple[int, dict, dict | None]:
        old = copy.deepcopy(self.objects[key].raw)
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype == "application/json-patch+json":
            try:
                new = jsonpatch.apply_patch(old, request.data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise _error(422, "Invalid", f"the JSON patch does not apply: {exc}") from None
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            wanted = (request.data or {}).get("metadata", {}).get("resourceVersion")
            if wanted and wanted != old["metadata"].get("resourceVersion"):
                raise _error(409, "Conflict", "the object has been modified; please apply your changes to the latest version")
            new = merge_patch(old, request.data)
        else:
            raise _error(415, "UnsupportedMediaType", f"unsupported patch type {ctype!r}")
        if request.subresource == "status":
            new = {**old, "status": new.get("status")} if new.get("status") is not None else {k: v for k, v in old.items() if k != "status"}
        elif request.subresource:
            raise _error(404, "NotFound", f"no subresource {request.subresource!r}")
        elif "status" in info.subresources:
            new = {k: v for k, v in new.items() if k != "status"} | ({"status": old["status"]} if "status" in old else {})
        for field in ("uid", "creationTimestamp", "name", "namespace", "generation", "resourceVersion"):
            if field in old["metadata"]:
                new.setdefault("metadata", {})[field] = old["metadata"][field]
        if old["metadata"].get("deletionTimestamp"):
            new["metadata"]["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
        if new == old:
            return 200, old, None
        if {k: v for k, v in new.items() if k not in ("metadata", "status")} != {k: v for k, v in old.items() if k not in ("metadata", "status")}:
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = self._next_rv()
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            self.objects[key].history.append(new)
            self.objects[key].delete()
            return 200, new, {"type": "DELETED", "object": new}
        self._admit(request, new)
        self.objects[key].history.append(new)
        return 200, new, {"type": "MODIFIED", "object": new}

    def _delete(self, request: rendering.Request, key: tuple) -> tuple[int, dict, dict | None]:
        obj = copy.deepcopy(self.objects[key].raw)
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return 200, obj, None
            meta.update(deletionTimestamp=now_iso(), deletionGracePeriodSeconds=0, resourceVersion=self._next_rv())
            self.objects[key].history.append(obj)
            return 200, obj, {"type": "MODIFIED", "object": obj}
        meta["resourceVersion"] = self._next_rv()
        self.objects[key].history.append(obj)
        self.objects[key].delete()
        return 200, obj, {"type": "DELETED", "object": obj}

    def _admit(self, request: rendering.Request, obj: dict[str, Any]) -> None:
        problems = self.validator(obj) if self.validator is not None else []
        if problems:
            self.rejections.append({
                "verb": request.method.value, "path": request.url.path, "kind": obj.get("kind"),
                "name": obj.get("metadata", {}).get("name"), "agent": request.headers.get("User-Agent"),
                "problems": problems,
            })
            raise _error(422, "Invalid", "; ".join(problems))

    def _next_rv(self) -> str:
        self._revision += 1
        return str(self._revision)

    def _info(self, resource: Any) -> kmock.ResourceInfo:
        if resource not in self.resources:
            raise _error(404, "NotFound", f"the server could not find the requested resource {resource}")
        return self.resources[resource]

    # -- reads --------------------------------------------------------------------------------

    def _select(self, request: rendering.Request) -> list[dict[str, Any]]:
        terms = parse_selector(request.params.get("labelSelector"))
        return [
            obj.raw for (resource, namespace, _), obj in self.objects.items()
            if resource == request.resource and not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
            and selector_matches(terms, obj.raw.get("metadata", {}).get("labels") or {})
        ]

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        info = self._info(request.resource)
        group, version = request.resource.group, request.resource.version
        return {
            "apiVersion": f"{group}/{version}" if group else version,
            "kind": f"{info.kind}List",
            "metadata": {"resourceVersion": str(self._revision)},
            "items": self._select(request),
        }

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers now: the stream is open even if nothing happens
        self._info(request.resource)
        since = int(request.params.get("resourceVersion") or 0)
        terms = parse_selector(request.params.get("labelSelector"))
        bus = self._buses[request.resource]
        marker = await bus.mark()  # before the snapshot, so that nothing falls between the two
        try:
            replayed: dict[str, int] = {}
            for obj in self._select(request):
                if rv_of(obj) > since:
                    replayed[obj["metadata"]["uid"]] = rv_of(obj)
                    yield {"type": "ADDED", "object": obj}
            async for event in bus.stream(since=marker):
                obj = event["object"]
                meta = obj.get("metadata", {})
                if rv_of(obj) <= max(since, replayed.get(meta.get("uid"), 0)):
                    continue
                if request.namespace is not None and meta.get("namespace") != request.namespace:
                    continue
                if selector_matches(terms, meta.get("labels") or {}):
                    yield event
        finally:
            await bus.unmark(marker)

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        group, version = request.resource.group, request.resource.version
        served = [r for r in self.resources if r.group == group and r.version == version]
        if not served:
            raise _error(404, "NotFound", f"{group}/{version} is not served")
        return {
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [
                {
                    "name": f"{r.plural}/{sub}" if sub else r.plural,
                    "kind": info.kind,
                    "singularName": info.kind.lower(),
                    "shortNames": sorted(info.shortnames),
                    "categories": sorted(info.categories),
                    "verbs": sorted(info.verbs),
                    "namespaced": bool(info.namespaced),
                }
                for r in served
                for info in [self.resources[r]]
                for sub in ["", *sorted(info.subresources)]
            ],
        }


class ServerThread:
    """Serves an ApiServer on 127.0.0.1 from a background thread with its own event loop.

    Tests are plain synchronous functions; the server keeps serving the operator process while a
    test sleeps or polls. ``call`` runs a function inside the server's loop for safe inspection.
    """

    def __init__(self, validator: Validator | None = None) -> None:
        self.validator = validator
        self.url = ""
        self.server: ApiServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="apiserver", daemon=True)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with ApiServer(validator=self.validator) as server, kmock.Server(server, host="127.0.0.1") as srv:
            self.server, self.url = server, str(srv.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def start(self, timeout: float = 10) -> "ServerThread":
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the test API server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def call(self, fn: Callable[[ApiServer], Any]) -> Any:
        """Run ``fn(server)`` in the server's event loop and return its result."""
        async def run() -> Any:
            return fn(self.server)
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)
