"""Debian's `prometheus`, run by the tests: on 127.0.0.1, with its own config and data directory.

The scrape configs come from the chart's own PodMonitor/ServiceMonitor, translated the way
prometheus-operator does for a pod or endpoint it discovers: the target labels it adds (namespace,
pod, container, job = <namespace>/<monitor>, podTargetLabels), then the monitor's own relabelings
and honorLabels. Without a cluster, a static target stands in for Kubernetes service discovery, carrying the
``__meta_kubernetes_*`` labels discovery would give the pod, so the monitor's relabelings run for real; with one
(tests/e2e), the ``*_discovery`` configs read what Kubernetes discovery would find in the real cluster's pods
and Endpoints (Debian's build has no Kubernetes discovery: a file the test keeps current stands in), kept by
the monitor's selectors the way prometheus-operator configures it.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A port free on 127.0.0.1 now (the caller binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> str:
    with NO_PROXY.open(url, timeout=timeout) as resp:
        return resp.read().decode()


def missing_binaries() -> str | None:
    """Why Prometheus tests cannot run here, or None."""
    absent = [b for b in ("prometheus", "promtool") if shutil.which(b) is None]
    if absent:
        return f"{' and '.join(absent)} not installed: `make prometheus` installs Debian's package"
    return None


def label_name(key: str) -> str:
    """A Kubernetes label key as a Prometheus label name (what discovery does to it)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def discovery_labels(prefix: str, labels: dict[str, str]) -> dict[str, str]:
    """Kubernetes labels as discovery's meta labels, e.g. __meta_kubernetes_pod_label_kuberl_io_job."""
    return {prefix + label_name(key): value for key, value in labels.items()}


def _snake(key: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def relabel_configs(relabelings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """prometheus-operator RelabelConfig (camelCase) -> Prometheus relabel_config (snake_case)."""
    out = []
    for r in relabelings:
        rc = {_snake(k): v for k, v in r.items()}
        if "action" in rc:
            rc["action"] = rc["action"].lower()
        out.append(rc)
    return out


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels; matchExpressions with In, NotIn, Exists, DoesNotExist) matches."""
    ops = {"In": lambda k, vs: labels.get(k) in vs, "NotIn": lambda k, vs: labels.get(k) not in vs,
           "Exists": lambda k, vs: k in labels, "DoesNotExist": lambda k, vs: k not in labels}
    return (all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
            and all(ops[e["operator"]](e["key"], e.get("values", [])) for e in selector.get("matchExpressions", [])))


def scrape_config(job: str, ep: dict[str, Any], address: str, meta: dict[str, str],
                  generated: list[dict[str, Any]]) -> dict[str, Any]:
    """A Prometheus scrape config for one monitor endpoint: prometheus-operator's ``generated``
    relabelings, then the endpoint's own; one static target carrying discovery's ``meta`` labels."""
    return {
        "job_name": job,
        "honor_labels": bool(ep.get("honorLabels", False)),
        "metrics_path": ep.get("path", "/metrics"),
        "scrape_interval": ep["interval"],
        "scrape_timeout": ep["scrapeTimeout"],
        "static_configs": [{"targets": [address], "labels": meta}],
        "relabel_configs": generated + relabel_configs(ep.get("relabelings", [])),
    }


@dataclass(frozen=True)
class Pod:
    """What Kubernetes discovery would say about one pod's container (a static target here)."""

    namespace: str
    name: str
    container: str
    address: str  # host:port the test process listens on
    labels: dict[str, str]

    def meta(self) -> dict[str, str]:
        return {"__meta_kubernetes_namespace": self.namespace, "__meta_kubernetes_pod_name": self.name,
                "__meta_kubernetes_pod_container_name": self.container, "__meta_kubernetes_pod_container_init": "false",
                **discovery_labels("__meta_kubernetes_pod_label_", self.labels)}


def pod_generated(monitor: dict[str, Any], endpoint: int) -> list[dict[str, Any]]:
    """The target labels prometheus-operator gives a pod that endpoint ``endpoint`` of ``monitor`` scrapes."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    ep = spec["podMetricsEndpoints"][endpoint]
    return [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{ns}/{name}"},
        *({"source_labels": ["__meta_kubernetes_pod_label_" + label_name(label)], "target_label": label_name(label)}
          for label in spec.get("podTargetLabels", [])),
        {"target_label": "endpoint", "replacement": ep.get("port", str(endpoint))},
    ]


def pod_monitor_scrape(monitor: dict[str, Any], endpoint: int, pod: Pod) -> dict[str, Any]:
    """One scrape config for endpoint ``endpoint`` of a rendered PodMonitor, aimed at ``pod``."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    assert selects(spec["selector"], pod.labels), f"PodMonitor {name} does not select the pod {pod.labels}"
    return scrape_config(f"podMonitor/{ns}/{name}/{endpoint}", spec["podMetricsEndpoints"][endpoint], pod.address,
                         pod.meta(), pod_generated(monitor, endpoint))


def selector_keeps(prefix: str, selector: dict[str, Any]) -> list[dict[str, Any]]:
    """A label selector as prometheus-operator's relabelings on discovery's labels (``prefix``:
    ``__meta_kubernetes_pod_`` or ``__meta_kubernetes_service_``): what it keeps of what discovery finds."""
    def pair(key: str) -> list[str]:
        return [f"{prefix}label_{label_name(key)}", f"{prefix}labelpresent_{label_name(key)}"]

    out = [{"action": "keep", "source_labels": pair(k), "regex": f"({v});true"}
           for k, v in selector.get("matchLabels", {}).items()]
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], "|".join(e.get("values", []))
        if op in ("Exists", "DoesNotExist"):
            out.append({"action": "keep" if op == "Exists" else "drop",
                        "source_labels": [f"{prefix}labelpresent_{label_name(key)}"], "regex": "true"})
        else:
            out.append({"action": "keep" if op == "In" else "drop", "source_labels": pair(key),
                        "regex": f"({values});true"})
    return out


def pod_monitor_discovery(monitor: dict[str, Any], endpoint: int, targets: Path) -> dict[str, Any]:
    """Endpoint ``endpoint`` of a rendered PodMonitor as prometheus-operator configures it for pod discovery,
    kept by the monitor's selectors, its port (when it names one) and the pod's phase, then the labels of
    :func:`pod_generated` and the endpoint's own relabelings. Debian's Prometheus is built without Kubernetes
    discovery: what it would find is read from ``targets``, a file of :func:`pod_targets` kept current."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    ep = spec["podMetricsEndpoints"][endpoint]
    keeps = [*selector_keeps("__meta_kubernetes_pod_", spec["selector"]), *namespace_keeps(spec),
             *([{"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                 "regex": ep["port"]}] if ep.get("port") else []),
             {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}]
    config = scrape_config(f"podMonitor/{ns}/{name}/{endpoint}", ep, "", {}, keeps + pod_generated(monitor, endpoint))
    return file_discovery(config, targets)


def namespace_keeps(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A monitor's namespaceSelector (matchNames; `any` or none: every namespace, as discovery is configured)."""
    names = spec.get("namespaceSelector", {}).get("matchNames")
    keep = {"action": "keep", "source_labels": ["__meta_kubernetes_namespace"], "regex": "|".join(names or [])}
    return [keep] if names else []


def file_discovery(config: dict[str, Any], targets: Path) -> dict[str, Any]:
    out = {k: v for k, v in config.items() if k != "static_configs"}
    return {**out, "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}


def pod_meta(pod: dict[str, Any]) -> dict[str, str]:
    """Kubernetes discovery's labels of one pod (the pod role's, container aside)."""
    meta, labels = pod["metadata"], pod["metadata"].get("labels", {})
    return {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_ip": pod["status"].get("podIP", ""),
            "__meta_kubernetes_pod_phase": pod["status"].get("phase", ""),
            "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
            **discovery_labels("__meta_kubernetes_pod_label_", labels),
            **{f"__meta_kubernetes_pod_labelpresent_{label_name(k)}": "true" for k in labels}}


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What pod discovery finds in these pods (file_sd groups): a target per declared port of each container
    (init containers too), a port-free one for a container without ports; pods without an IP yet, none."""
    out = []
    for pod in pods:
        ip = pod["status"].get("podIP")
        if not ip:
            continue
        for init, key in ((False, "containers"), (True, "initContainers")):
            for c in pod["spec"].get(key) or []:
                base = {**pod_meta(pod), "__meta_kubernetes_pod_container_name": c["name"],
                        "__meta_kubernetes_pod_container_init": str(init).lower()}
                ports = c.get("ports") or []
                out += [{"targets": [ip], "labels": base}] if not ports else [
                    {"targets": [f"{ip}:{p['containerPort']}"],
                     "labels": {**base, "__meta_kubernetes_pod_container_port_name": p.get("name", ""),
                                "__meta_kubernetes_pod_container_port_number": str(p["containerPort"])}}
                    for p in ports]
    return out


def endpoint_targets(services: list[dict[str, Any]], endpoints: list[dict[str, Any]],
                     pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What endpoints discovery finds (file_sd groups): a target per ready address and port of each Service's
    Endpoints, with the Service's labels and its pod's (and, where the port is a container's, the container)."""
    by_name = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    svc = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in services}
    out = []
    for ep in endpoints:
        key = (ep["metadata"]["namespace"], ep["metadata"]["name"])
        if key not in svc:
            continue
        labels = svc[key]["metadata"].get("labels", {})
        service = {"__meta_kubernetes_namespace": key[0], "__meta_kubernetes_service_name": key[1],
                   **discovery_labels("__meta_kubernetes_service_label_", labels),
                   **{f"__meta_kubernetes_service_labelpresent_{label_name(k)}": "true" for k in labels}}
        for subset in ep.get("subsets") or []:
            for address in subset.get("addresses") or []:
                ref = address.get("targetRef") or {}
                pod = by_name.get((key[0], ref.get("name", "")))
                for port in subset.get("ports") or []:
                    container = next((c["name"] for c in (pod or {}).get("spec", {}).get("containers", [])
                                      for cp in c.get("ports") or [] if cp["containerPort"] == port["port"]), None)
                    out.append({"targets": [f"{address['ip']}:{port['port']}"], "labels": {
                        **(pod_meta(pod) if pod else {}), **service,
                        "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                        "__meta_kubernetes_endpoint_ready": "true",
                        **({"__meta_kubernetes_pod_container_name": container} if container else {})}})
    return out


@dataclass(frozen=True)
class Endpoint:
    """A Service's endpoint as Kubernetes discovery (role endpoints) would report it: a static target here."""

    service: dict[str, Any]  # the rendered Service
    pod: Pod  # the pod behind it
    port_name: str

    def meta(self) -> dict[str, str]:
        return {**self.pod.meta(), "__meta_kubernetes_service_name": self.service["metadata"]["name"],
                "__meta_kubernetes_endpoint_port_name": self.port_name,
                **discovery_labels("__meta_kubernetes_service_label_", self.service["metadata"].get("labels", {}))}


def service_generated(monitor: dict[str, Any], endpoint: int) -> list[dict[str, Any]]:
    """The target labels prometheus-operator gives an endpoint that ``monitor``'s endpoint ``endpoint`` scrapes."""
    return [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
        {"target_label": "endpoint", "replacement": monitor["spec"]["endpoints"][endpoint]["port"]},
    ]


def service_monitor_scrape(monitor: dict[str, Any], endpoint: int, target: Endpoint) -> dict[str, Any]:
    """One scrape config for endpoint ``endpoint`` of a rendered ServiceMonitor, aimed at ``target``."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    ep = spec["endpoints"][endpoint]
    service_labels = target.service["metadata"].get("labels", {})
    assert selects(spec["selector"], service_labels), f"ServiceMonitor {name} does not select {service_labels}"
    assert target.service["metadata"]["namespace"] in spec.get("namespaceSelector", {}).get("matchNames", [ns])
    assert ep["port"] == target.port_name, f"ServiceMonitor {name} scrapes port {ep['port']}, not {target.port_name}"
    return scrape_config(f"serviceMonitor/{ns}/{name}/{endpoint}", ep, target.pod.address, target.meta(),
                         service_generated(monitor, endpoint))


def service_monitor_discovery(monitor: dict[str, Any], endpoint: int, targets: Path) -> dict[str, Any]:
    """Endpoint ``endpoint`` of a rendered ServiceMonitor as prometheus-operator configures it for endpoints
    discovery in the monitor's namespaces, kept by its selector and port, then :func:`service_generated`;
    what discovery would find is read from ``targets`` (:func:`endpoint_targets`)."""
    ns, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    spec = monitor["spec"]
    ep = spec["endpoints"][endpoint]
    keeps = [*selector_keeps("__meta_kubernetes_service_", spec["selector"]),
             *namespace_keeps({"namespaceSelector": {"matchNames": [ns]}, **spec}),
             {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": ep["port"]}]
    config = scrape_config(f"serviceMonitor/{ns}/{name}/{endpoint}", ep, "", {},
                           keeps + service_generated(monitor, endpoint))
    return file_discovery(config, targets)


class Prometheus:
    """A prometheus process on 127.0.0.1 with a config written here; stop() ends it."""

    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]], rule_files: list[Path] = (),
                 interval: str = "1s"):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                  "scrape_configs": scrape_configs, "rule_files": [str(p) for p in rule_files]}
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
             "--storage.tsdb.retention.time=1d", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready(60.0)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.logs()}")
            try:
                http_get(f"{self.url}/-/ready", timeout=1.0)
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready in {timeout:.0f}s: {self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        return (self.workdir / "prometheus.log").read_text()[-4000:]

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>; returns `data`, raises with Prometheus' error otherwise."""
        pairs = [(k, v) for k, vs in params.items() for v in (vs if isinstance(vs, list) else [vs])]
        query = urllib.parse.urlencode(pairs)
        try:
            body = json.loads(http_get(f"{self.url}/api/v1/{path}?{query}", timeout=30.0))
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read().decode())
        if body.get("status") != "success":
            raise ValueError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")
        return data["result"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        return self.api("query", **params)["result"]

    def wait_for(self, expr: str, timeout: float, what: str) -> list[dict[str, Any]]:
        """Poll an instant query until it returns something."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.5)
        raise TimeoutError(f"{what}: {expr!r} returned nothing in {timeout:.0f}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
