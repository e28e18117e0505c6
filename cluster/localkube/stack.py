"""Start and stop the whole local control plane in one state folder.

Order: certificates; etcd; kube-apiserver; controller-manager, scheduler and kwok; KubeRay's CRDs
(server-side apply, then Established); the KubeRay operator; the nodes. Every listener binds
127.0.0.1 on a port free at start (recorded in ``cluster.json``), so two clusters, or a cluster
inside a loopback-only network namespace, never collide. A component that does not come up is
named, with the end of its log and the fix.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import api as kapi
from . import kueue, node, pins, pki, procs
from .nodes import NodeSpec, node_object

HERE = Path(__file__).resolve().parent
SERVICE_CIDR = node.SERVICE_CIDR  # routed on the real node only (kube-proxy); kwok pods have no traffic
POD_CIDR = "127.64.0.0/16"  # the pod IPs kwok hands out stay in the loopback range
ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_STAGES = HERE / "kwok-stages.yaml"
AUDIT_POLICY = HERE / "audit-policy.yaml"


class StartError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as rsp:
            return rsp.status == 200
    except (OSError, urllib.error.URLError):
        return False


@dataclass
class Cluster:
    """One local cluster. ``start()`` brings it up; ``stop()`` ends every process it started."""

    state: Path
    cache: Path  # the build cache folder (bin/, crds/)
    tie_to_parent: bool = False
    log: Callable[[str], None] = print
    real_node: bool = False  # a real kubelet with containerd beside the kwok nodes (node.py)
    images: list[Path] = field(default_factory=list)  # OCI tars loaded into the real node's containerd
    ports: dict[str, int] = field(default_factory=dict)
    procs: list[procs.Proc] = field(default_factory=list)

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def audit_log(self) -> Path:
        return self.state / "audit.log"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    def admin(self, namespace: str = "default") -> kapi.Api:
        return kapi.Api(
            self.server, self.pki / "ca.crt", namespace, cert=(self.pki / "admin.crt", self.pki / "admin.key")
        )

    def bin(self, name: str) -> str:
        return str(self.cache / "bin" / name)

    def _start(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
    ) -> procs.Proc:
        proc = procs.start(name, argv, self.state / "logs", env, self.tie_to_parent, prefix)
        self.procs.append(proc)
        procs.save(self.state / "procs.json", self.procs)
        return proc

    def _wait(self, proc: procs.Proc, ready: Callable[[], bool], timeout: float, fix: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if not proc.alive() or time.monotonic() > deadline:
                why = "exited" if not proc.alive() else f"was not ready within {timeout:.0f}s"
                raise StartError(f"{proc.name} {why}; last lines of {proc.log}:\n{proc.tail()}\nfix: {fix}")
            time.sleep(0.1)

    def _kubeconfig(self, client: str) -> Path:
        path = self.state / f"{client}.kubeconfig"
        path.write_text(pki.kubeconfig(self.server, self.pki, client))
        path.chmod(0o600)
        return path

    def start(self, nodes: Iterable[NodeSpec] = ()) -> Cluster:
        t0 = time.monotonic()
        for sub in ("logs", "etcd", "run"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        pki.ensure(self.pki)
        self.ports = {
            n: free_port()
            for n in (
                "etcd",
                "etcd-peer",
                "apiserver",
                "controller-manager",
                "scheduler",
                "kuberay-metrics",
                "kuberay-probe",
            )
        }
        (self.state / "cluster.json").write_text(json.dumps({"ports": self.ports}, indent=1))
        self.phases: dict[str, float] = {}  # seconds each step of the start took
        steps = (
            ("etcd", self._etcd),
            ("kube-apiserver", self._apiserver),
            ("controllers+kwok", self._controllers),
            ("kuberay", self._kuberay),
            ("nodes", lambda: self.add_nodes(nodes)),
            *((("real node", lambda: node.start(self, self.images)),) if self.real_node else ()),
        )
        try:
            for name, step in steps:
                t = time.monotonic()
                step()
                self.phases[name] = round(time.monotonic() - t, 2)
        except node.NodeError as exc:
            self.stop()
            raise StartError(str(exc)) from None
        except BaseException:
            self.stop()
            raise
        self.kubeconfig.write_text(pki.kubeconfig(self.server, self.pki, "admin"))
        self.kubeconfig.chmod(0o600)
        self.started_in = time.monotonic() - t0
        self.log(
            f"cluster up in {self.started_in:.1f}s ({', '.join(f'{k} {v}s' for k, v in self.phases.items())}): "
            f"{self.server}"
        )
        return self

    def _etcd(self) -> None:
        client, peer = f"http://127.0.0.1:{self.ports['etcd']}", f"http://127.0.0.1:{self.ports['etcd-peer']}"
        proc = self._start(
            "etcd",
            [
                self.bin("etcd"),
                "--name=local",
                f"--data-dir={self.state / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=local={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=2147483648",
            ],
        )
        self._wait(
            proc,
            lambda: http_ok(f"{client}/health"),
            30,
            f"is the etcd data folder from another version? remove {self.state / 'etcd'}",
        )

    def _apiserver(self) -> None:
        p = self.pki
        proc = self._start(
            "kube-apiserver",
            [
                self.bin("kube-apiserver"),
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports['apiserver']}",
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--endpoint-reconciler-type=none",  # 127.0.0.1 is no Endpoints address (node.py sets the relay's)
                f"--kubelet-client-certificate={p / 'admin.crt'}",  # logs and exec on the real node
                f"--kubelet-client-key={p / 'admin.key'}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--audit-policy-file={AUDIT_POLICY}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=0",
                "--profiling=false",
                f"--cert-dir={self.state / 'run'}",
            ],
        )
        admin = ssl.create_default_context(cafile=str(p / "ca.crt"))
        admin.load_cert_chain(str(p / "admin.crt"), str(p / "admin.key"))
        self._wait(
            proc, lambda: http_ok(f"{self.server}/readyz", admin), 90, "see the log: a port in use, or etcd gone"
        )

    def _controllers(self) -> None:
        p = self.pki
        common = ["--bind-address=127.0.0.1", "--leader-elect=false"]
        cm = self._kubeconfig("controller-manager")
        manager = self._start(
            "kube-controller-manager",
            [
                self.bin("kube-controller-manager"),
                *common,
                f"--secure-port={self.ports['controller-manager']}",
                f"--kubeconfig={cm}",
                f"--authentication-kubeconfig={cm}",
                f"--authorization-kubeconfig={cm}",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}",
                f"--cert-dir={self.state / 'run' / 'controller-manager'}",
                "--use-service-account-credentials=true",
            ],
        )  # each controller its own RBAC identity
        sched = self._kubeconfig("scheduler")
        scheduler = self._start(
            "kube-scheduler",
            [
                self.bin("kube-scheduler"),
                *common,
                f"--secure-port={self.ports['scheduler']}",
                f"--kubeconfig={sched}",
                f"--authentication-kubeconfig={sched}",
                f"--authorization-kubeconfig={sched}",
                f"--cert-dir={self.state / 'run' / 'scheduler'}",
            ],
        )
        admin = self._kubeconfig("admin")
        kwok = self._start(
            "kwok",
            [
                self.bin("kwok"),
                f"--kubeconfig={admin}",
                f"--config={KWOK_STAGES}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",  # not the real node
                f"--cidr={POD_CIDR}",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",
            ],
        )
        insecure = ssl._create_unverified_context()  # their serving certificates are self-signed, made at start
        for proc, port in ((manager, "controller-manager"), (scheduler, "scheduler")):
            self._wait(
                proc,
                lambda port=port: http_ok(f"https://127.0.0.1:{self.ports[port]}/healthz", insecure),
                60,
                "see the log",
            )
        time.sleep(0.5)  # kwok has no health endpoint without a server; its nodes turning Ready is the proof
        if not kwok.alive():
            raise StartError(f"kwok exited; last lines of {kwok.log}:\n{kwok.tail()}\nfix: see the log")

    def _kuberay(self) -> None:
        admin = self.admin()
        for crd in sorted((self.cache / "crds").glob("*.yaml")):
            group, plural = crd.stem.split("_", 1)  # ray.io_rayclusters.yaml
            admin.apply(kapi.CRDS, f"{plural}.{group}", crd.read_text(), namespace=None)
        for crd in sorted((self.cache / "crds").glob("*.yaml")):
            group, plural = crd.stem.split("_", 1)
            wait_established(admin, f"{plural}.{group}")
        proc = self._start(
            "ray-operator",
            [
                self.bin("ray-operator"),
                f"--metrics-addr=127.0.0.1:{self.ports['kuberay-metrics']}",
                f"--health-probe-bind-address=127.0.0.1:{self.ports['kuberay-probe']}",
                "--enable-leader-election=false",
                "--log-stdout-encoder=console",
            ],
            env={"KUBECONFIG": str(self._kubeconfig("admin"))},
        )
        self._wait(proc, lambda: http_ok(f"http://127.0.0.1:{self.ports['kuberay-probe']}/readyz"), 60, "see the log")

    def start_kueue(self, pods_ready: tuple[str, str] | None = None) -> float:
        """Start the pinned Kueue (localkube.kueue) beside the running stack: its CRDs, its manager, its webhooks.
        Seconds it took. `stop_kueue` takes it away again, webhooks first (they would refuse RayClusters without it).
        ``pods_ready``: waitForPodsReady's (timeout, recoveryTimeout)."""
        t = time.monotonic()
        admin = self.admin()
        config = pins.kueue_config(self.cache)
        for name in kueue.install_crds(admin, config / "crds"):
            wait_established(admin, name)
        if admin.get(kapi.NAMESPACES, kueue.NAMESPACE, namespace=None) is None:
            admin.create(kapi.NAMESPACES, {"metadata": {"name": kueue.NAMESPACE}}, namespace=None)
        self.ports.update({"kueue-webhook": free_port(), "kueue-probe": free_port()})
        certs = self.state / "kueue-certs"
        kueue.serving_cert(self.pki, certs)
        conf = self.state / "kueue-config.yaml"
        conf.write_text(yaml.safe_dump(kueue.configuration(self.ports["kueue-webhook"], self.ports["kueue-probe"],
                                                           certs, pods_ready)))
        proc = self._start("kueue", [self.bin(pins.own_name(pins.KUEUE)), f"--config={conf}",
                                     "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=info"],
                           env={"KUBECONFIG": str(self._kubeconfig("admin"))},
                           prefix=kueue.etc_overlay(self.state / "kueue-etc", certs))
        self._wait(proc, lambda: http_ok(f"http://127.0.0.1:{self.ports['kueue-probe']}/readyz"), 90, "see the log")
        ca = pki.b64(self.pki / "ca.crt")
        for conf_obj in kueue.webhooks((config / "webhooks.yaml").read_text(), self.ports["kueue-webhook"], ca):
            resource = (kapi.MUTATING_WEBHOOKS if conf_obj["kind"] == "MutatingWebhookConfiguration"
                        else kapi.VALIDATING_WEBHOOKS)
            admin.apply(resource, conf_obj["metadata"]["name"], conf_obj, namespace=None)
        return time.monotonic() - t

    def stop_kueue(self, timeout: float = 60) -> None:
        """Take Kueue away as if it had never been there: its webhook configurations first (they would refuse
        RayClusters without it), then its CRDs with every object of them while its manager still clears their
        finalizers (what is left after half the ``timeout`` loses its finalizers), then the manager."""
        admin = self.admin()
        for resource in (kapi.MUTATING_WEBHOOKS, kapi.VALIDATING_WEBHOOKS):
            for conf in admin.list(resource, namespace=None):
                if conf["metadata"]["name"].startswith("kueue-"):
                    admin.delete(resource, conf["metadata"]["name"], namespace=None)
        crds = [c for c in admin.list(kapi.CRDS, namespace=None) if c["spec"]["group"] == kueue.GROUP]
        for crd in crds:
            admin.delete(kapi.CRDS, crd["metadata"]["name"], namespace=None)
        deadline, cleared = time.monotonic() + timeout, False
        while left := [c for c in crds if admin.get(kapi.CRDS, c["metadata"]["name"], namespace=None) is not None]:
            if not cleared and time.monotonic() > deadline - timeout / 2:
                for crd in left:
                    kueue.clear_finalizers(admin, crd)
                cleared = True
            if time.monotonic() > deadline:
                raise StartError(f"Kueue's CRDs were not gone within {timeout:.0f}s after their deletion")
            time.sleep(0.2)
        for proc in [p for p in self.procs if p.name == "kueue"]:
            proc.stop()
            self.procs.remove(proc)
        admin.delete(kapi.NAMESPACES, kueue.NAMESPACE, namespace=None)

    def restart(self, *components: str, down_s: float = 0.0) -> None:
        """The control plane blinks: `halt` the named components, leave them down `down_s` seconds, `resume` them."""
        self.halt(*components)
        time.sleep(down_s)
        self.resume(*components)

    def _starts(self, components: tuple[str, ...]) -> dict[str, Callable[[], Any]]:
        """The start of each restartable component, in start order; an unknown name is refused."""
        starts = {"etcd": self._etcd, "kube-apiserver": self._apiserver, "ray-operator": self._kuberay,
                  "kubelet": lambda: node.start_kubelet(self)}
        if unknown := set(components) - set(starts):
            raise ValueError(f"cannot restart {', '.join(sorted(unknown))}: only {', '.join(starts)}")
        return {name: start for name, start in starts.items() if name in components}

    def halt(self, *components: str) -> None:
        """Stop the named processes (of etcd, kube-apiserver, ray-operator, the real node's kubelet) and forget them.
        Their state (etcd's data folder, the ports, the kubelet's root and its containers) is kept: every client of
        the API server sees its connections break; a node without its kubelet keeps its containers running and
        goes NotReady once its lease runs out."""
        self._starts(components)
        for proc in [p for p in self.procs if p.name in components]:
            proc.stop()
            self.procs.remove(proc)

    def resume(self, *components: str) -> None:
        """Start the named components again, in start order, each waited for as at the start."""
        for start in self._starts(components).values():
            start()

    def add_nodes(self, nodes: Iterable[NodeSpec], timeout: float = 30) -> list[dict[str, Any]]:
        """Create kwok nodes and wait until each is Ready."""
        admin = self.admin()
        made = [self._node(admin, n) for n in nodes]
        deadline = time.monotonic() + timeout
        for made_node in made:
            name = made_node["metadata"]["name"]
            while not node_ready(admin.get(kapi.NODES, name, namespace=None)):
                if time.monotonic() > deadline:
                    kwok = next(p for p in self.procs if p.name == "kwok")
                    raise StartError(
                        f"node {name} did not become Ready in {timeout}s (kwok manages it); kwok log:\n{kwok.tail()}"
                    )
                time.sleep(0.1)
        return made

    @staticmethod
    def _node(admin: kapi.Api, spec: NodeSpec) -> dict[str, Any]:
        """Create the node; one kept from an earlier start of the same state folder is reused."""
        try:
            return admin.create(kapi.NODES, node_object(spec), namespace=None)
        except kapi.ApiError as exc:
            if exc.status != 409:
                raise
            return admin.get(kapi.NODES, spec.name, namespace=None)

    def memory(self) -> dict[str, float]:
        """Resident memory of each component, MiB."""
        return {p.name: round(p.rss_mib(), 1) for p in self.procs}

    def stop(self) -> None:
        node.teardown(self.state)
        procs.stop_all(self.procs)
        self.procs = []
        (self.state / "procs.json").unlink(missing_ok=True)

    def wipe(self) -> None:
        """Remove the state folder (etcd data, logs, certificates)."""
        shutil.rmtree(self.state, ignore_errors=True)


def node_ready(node: dict[str, Any] | None) -> bool:
    conds = ((node or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def wait_established(admin: kapi.Api, name: str, timeout: float = 60) -> None:
    """A CRD is usable only once Established (a real API server takes seconds for a large one)."""
    deadline = time.monotonic() + timeout
    while True:
        crd = admin.get(kapi.CRDS, name, namespace=None) or {}
        conds = (crd.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
            return
        if time.monotonic() > deadline:
            raise StartError(f"CRD {name} not Established within {timeout}s: {conds}")
        time.sleep(0.2)
