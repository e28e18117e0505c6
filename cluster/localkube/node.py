"""A real node beside the kwok ones: containerd, runc, the CNI bridge, kubelet, kube-proxy and CoreDNS; hostPath
volumes for checkpoint claims (volumes.py), a fake-GPU DRA driver (dra.py) and NetworkPolicy enforcement
(netpol.py).

Everything of the node lives in a network namespace of its own, held by one process (``netns``), so
pod traffic never leaves it: the namespace has its loopback, the pods' bridge (``10.88.0.0/24``)
and one veth link to the namespace the control plane runs in (``10.89.0.0/30``), and no other route.
The control plane keeps listening on 127.0.0.1 only; a relay (socat) on the link's host end,
``10.89.0.1:6443``, is the way in for the kubelet, kube-proxy, CoreDNS and the pods (the
``kubernetes`` Service's endpoint). The kubelet serves on the link's node end, where the API server
reaches it for logs and exec, and Prometheus (in the control plane's namespace) reaches the pods
through the link.

These machines mount cgroup v1, so the kubelet runs with ``failCgroupV1: false`` and the cgroupfs
driver (PID 1 is not systemd), every pod under one cgroup root of this node's own
(``/kuberl-<id>``). :func:`teardown` kills every container, the shims, the node's processes, unmounts
what containerd and the kubelet mounted under the state folder, and removes the cgroups: after it
no container, mount, network namespace or cgroup of the node is left (the namespace goes with its
last process). It reads only the state folder (``node.json``), so `make cluster-down` can call it.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import api as kapi
from . import dra, netpol, pins, pki, procs, volumes
from .images import load

if TYPE_CHECKING:
    from .stack import Cluster

POD_SUBNET = "10.88.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"  # the API server's --service-cluster-ip-range
POD_GATEWAY = "10.88.0.1"
LINK_PREFIX = 30  # the veth link: NODE_LINK_HOST/30 (control plane's side), NODE_LINK_NODE/30 (the node's)
RELAY_PORT = 6443  # the API server's relay on the link's host end
KUBELET_PORT = 10250
DNS_IP = pki.NODE_LINK_NODE  # CoreDNS listens on the node's link address: the pods' clusterDNS
PAUSE_IMAGE = "localhost/kuberl/pause:3.10"
CGROUP_BASE = Path("/sys/fs/cgroup")
NEEDS = ("runc", "nsenter", "unshare", "ip", "socat", "nft", "iptables")  # Debian: runc util-linux iproute2 ...
MNT_DETACH = 2
GAP_FILE = "network-policies.txt"  # why the node enforces no NetworkPolicy, when it does not


class NodeError(RuntimeError):
    pass


@dataclass
class NodeState:
    """What teardown needs, kept in ``<state>/node/node.json``."""

    id: str  # short id of this node: cgroup root and veth names
    dir: str  # <state>/node
    cgroup_root: str  # /kuberl-<id>
    containerd_sock: str
    veth_host: str
    netns_inode: int = 0  # the node's network namespace: every process still in it is ours to stop

    @classmethod
    def load(cls, state: Path) -> NodeState | None:
        path = state / "node" / "node.json"
        return cls(**json.loads(path.read_text())) if path.exists() else None


def missing_tools() -> list[str]:
    return [t for t in NEEDS if shutil.which(t) is None]


def node_id(state: Path) -> str:
    return hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:6]


def cgroup_dirs(root: str) -> list[Path]:
    """The node's cgroup root in each mounted v1 hierarchy (and the unified one, if it holds it)."""
    return [d / root.lstrip("/") for d in sorted(CGROUP_BASE.iterdir()) if d.is_dir() and not d.is_symlink()]


def kubelet_config(st: NodeState, cluster_pki: Path, dns: str) -> dict[str, Any]:
    """KubeletConfiguration for cgroup v1 with cgroupfs, x509 + webhook auth, everything under the state folder."""
    d = Path(st.dir)
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # these machines mount cgroup v1; kubelet refuses it unless told
        "cgroupDriver": "cgroupfs",  # PID 1 is not systemd
        "cgroupRoot": st.cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": f"unix://{st.containerd_sock}",
        "address": pki.NODE_LINK_NODE,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": pki.NODE_LINK_NODE,
        "healthzPort": 10248,
        "tlsCertFile": str(cluster_pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(cluster_pki / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(cluster_pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [dns],
        "clusterDomain": "cluster.local",
        "resolvConf": str(d / "resolv.conf"),
        "podLogsDir": str(d / "pod-logs"),
        "failSwapOn": False,
        "oomScoreAdj": 0,  # no CAP_SYS_RESOURCE here: a negative score cannot be set (containerd_config)
        "rotateCertificates": False,
        "serializeImagePulls": False,
        # Images are loaded, never pulled: keep them whatever the disk use, and evict only when really short.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%"},
        "evictionPressureTransitionPeriod": "30s",  # a short dip (an image build beside it) blocks pods briefly
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
    }


def containerd_config(st: NodeState, root: Path, cache_bin: Path) -> str:
    """containerd v2 config (version 3): CRI with runc (cgroupfs), CNI from the cache, every path ours.

    ``restrict_oom_score_adj``: these machines' root lacks CAP_SYS_RESOURCE, so no process may lower its
    oom_score_adj below its parent's (runc would fail every sandbox on the kubelet's -998); containerd then
    raises what the kubelet asks to at least its own score."""
    d = Path(st.dir)
    return f"""version = 3
root = "{root}"
state = "{d / "containerd" / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
  "io.containerd.nri.v1.nri"]

[grpc]
  address = "{st.containerd_sock}"

[ttrpc]
  address = "{st.containerd_sock}.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{shutil.which("runc")}"
        Root = "{d / "runc"}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cache_bin}"]
    conf_dir = "{d / "cni"}"

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
"""


def cni_config(st: NodeState) -> dict[str, Any]:
    """The pods' bridge (hairpin on, so a pod reaches itself through a Service), no masquerade: no way out."""
    return {
        "cniVersion": "1.0.0",
        "name": "kuberl",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "kuberl0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(Path(st.dir) / "cni-ipam"),
                },
            }
        ],
    }


def kube_proxy_config(kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": pki.NODE_NAME,
        "clusterCIDR": POD_SUBNET,
        "bindAddress": pki.NODE_LINK_NODE,
        "healthzBindAddress": f"{pki.NODE_LINK_NODE}:10256",
        "metricsBindAddress": f"{pki.NODE_LINK_NODE}:10249",
        "nodePortAddresses": [f"{pki.NODE_LINK_NODE}/32"],
        "conntrack": {"maxPerCore": 0, "min": 0},  # leave the kernel's global conntrack table alone
        "oomScoreAdj": 0,
    }


def corefile(kubeconfig: Path) -> str:
    """Cluster names only: there is no upstream to forward to (no route out)."""
    return f""".:53 {{
    bind {DNS_IP}
    errors
    ready {DNS_IP}:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} kuberl-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 10
}}
"""


COREDNS_RBAC = (
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "kuberl:coredns"},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "pods", "namespaces"], "verbs": ["list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "kuberl:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kuberl:coredns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kuberl:coredns"}],
    },
)


def kubernetes_endpoints() -> tuple[dict[str, Any], dict[str, Any]]:
    """The `kubernetes` Service's endpoint: the relay (the API server itself listens on 127.0.0.1 only)."""
    port = {"name": "https", "port": RELAY_PORT, "protocol": "TCP"}
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": [{"addresses": [{"ip": pki.NODE_LINK_HOST}], "ports": [port]}],
    }
    endpoint_slice = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "labels": {"kubernetes.io/service-name": "kubernetes", "endpointslice.kubernetes.io/managed-by": "kuberl"},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [pki.NODE_LINK_HOST], "conditions": {"ready": True}}],
        "ports": [port],
    }
    return endpoints, endpoint_slice


def run(*argv: str, netns_of: int | None = None) -> str:
    cmd = [*(procs.netns(netns_of) if netns_of is not None else ()), *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-300:]}")
    return proc.stdout


def link_up(holder: int, st: NodeState) -> None:
    """The veth link between the two namespaces; forwarding and bridge netfilter inside the node's."""
    veth_node = st.veth_host[:-1] + "n"
    if link_exists(st.veth_host) or _address_in_use(pki.NODE_LINK_HOST):
        raise NodeError(
            f"{pki.NODE_LINK_HOST} is already in use here: another real node runs in this network namespace "
            "(stop it with `make cluster-down`)"
        )
    run("ip", "link", "add", st.veth_host, "type", "veth", "peer", "name", veth_node, "netns", str(holder))
    run("ip", "addr", "add", f"{pki.NODE_LINK_HOST}/{LINK_PREFIX}", "dev", st.veth_host)
    run("ip", "link", "set", st.veth_host, "up")
    run("ip", "route", "add", POD_SUBNET, "via", pki.NODE_LINK_NODE)
    for argv in (
        ("ip", "link", "set", "lo", "up"),
        ("ip", "addr", "add", f"{pki.NODE_LINK_NODE}/{LINK_PREFIX}", "dev", veth_node),
        ("ip", "link", "set", veth_node, "up"),
        # A route for the Service range, so that what the node itself sends to a cluster IP is routed, then
        # DNATed by kube-proxy (pods route through the bridge's gateway, which needs none).
        ("ip", "route", "add", SERVICE_CIDR, "dev", veth_node),
        ("sysctl", "-qw", "net.ipv4.ip_forward=1"),
        ("sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"),
    ):
        run(*argv, netns_of=holder)


def link_exists(name: str) -> bool:
    """In this network namespace (sysfs shows the host's, whatever namespace one is in)."""
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def _address_in_use(ip: str) -> bool:
    return f" {ip}/" in run("ip", "-o", "addr")


def shared_root(cache: Path) -> Path | None:
    """containerd's root kept between clusters (images imported once), unless another containerd holds it
    (its metadata database is locked): then None, and this node uses a root of its own."""
    root = cache.parent / "node-containerd"
    db = root / "io.containerd.metadata.v1.bolt" / "meta.db"
    if db.exists():
        with open(db, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return None
            fcntl.flock(f, fcntl.LOCK_UN)
    return root


def node_procs_pids(st: NodeState) -> set[int]:
    """Every process in the node's cgroups (the containers), in its network namespace, and every shim of its
    containerd."""
    pids: set[int] = set()
    # Never the namespace this process runs in: once a node's namespace is gone, the kernel may give its inode to
    # a new one (a later test session's loopback namespace), whose processes are not the node's.
    netns = st.netns_inode if st.netns_inode != _netns_inode(os.getpid()) else 0
    for d in cgroup_dirs(st.cgroup_root):
        for procs_file in d.rglob("cgroup.procs") if d.is_dir() else ():
            try:
                pids.update(int(p) for p in procs_file.read_text().split())
            except OSError:
                pass
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline[0].endswith(b"containerd-shim-runc-v2") and st.containerd_sock.encode() in b" ".join(cmdline):
                pids.add(int(proc.name))
            elif netns and _netns_inode(int(proc.name)) == netns:
                pids.add(int(proc.name))
    return pids


def _netns_inode(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return 0


def kill_containers(st: NodeState, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (pids := node_procs_pids(st)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    if node_procs_pids(st):
        raise NodeError(f"processes still running in the node's cgroups {st.cgroup_root} after {timeout}s")


def unmount_under(*roots: Path) -> int:
    """Detach every mount below the given folders (deepest first); how many."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    prefixes = [str(r.resolve()) + "/" for r in roots]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point.startswith(p) for p in prefixes):
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        libc.umount2(point.encode(), MNT_DETACH)
    return len(points)


def remove_cgroups(st: NodeState) -> None:
    for d in cgroup_dirs(st.cgroup_root):
        if d.is_dir():
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                sub.rmdir()
            d.rmdir()


def teardown(state: Path, st: NodeState | None = None) -> None:
    """Stop the real node of ``state``: kubelet first (nothing restarts), then every container and shim, then
    the node's processes; unmount and remove what they left (mounts, cgroups). Safe to call twice. ``st``:
    the node's record when its state folder may be gone (a killed test session's temporary folder)."""
    st = st or NodeState.load(state)
    if st is None:
        return
    running = procs.load(state / "procs.json")
    for p in running:
        if p.name == "kubelet":
            p.stop()
    for p in reversed(running):
        if p.name in NODE_PROCS:
            p.stop()
    kill_containers(st)  # the containers, their shims, and anything else left in the node's namespace
    unmount_under(Path(st.dir))
    remove_cgroups(st)
    (Path(st.dir) / "node.json").unlink(missing_ok=True)


NODE_PROCS = ("netns", "relay", "containerd", "kubelet", "kube-proxy", "coredns", "fake-gpu", "network-policies")


def new_state(state: Path) -> NodeState:
    nid = node_id(state)
    d = state / "node"
    return NodeState(
        id=nid,
        dir=str(d),
        cgroup_root=f"/kuberl-{nid}",
        containerd_sock=str(d / "containerd" / "containerd.sock"),
        veth_host=f"kl{nid}h",
    )


def registry(cache: Path) -> Path:
    """One file per real node started from this cache, naming its state folder: a node whose starter was
    killed (a pytest session ended by a signal skips its teardown) is found and stopped by the next start."""
    return cache.parent / "nodes"


def sweep(cache: Path) -> list[Path]:
    """Tear down every registered node whose holder process is gone; the state folders swept."""
    swept = []
    for entry in sorted(registry(cache).glob("*.json")) if registry(cache).is_dir() else ():
        record = json.loads(entry.read_text())
        state = Path(record.pop("state"))
        holder = next((p for p in procs.load(state / "procs.json") if p.name == "netns"), None)
        if holder is not None and holder.alive():
            continue
        # The holder is gone, so is the namespace unless a process still holds it; its inode may name another
        # namespace by now: the node's processes are found by their cgroups, shims and recorded pids instead.
        teardown(state, NodeState(**{**record, "netns_inode": 0}))
        entry.unlink()
        swept.append(state)
    return swept


def prepare(st: NodeState) -> None:
    d = Path(st.dir)
    for sub in ("containerd", "cni", "cni-ipam", "kubelet", "pod-logs", "runc", "conf"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "resolv.conf").write_text("")  # pods of dnsPolicy Default get no host resolver: there is no way out
    for cg in cgroup_dirs(st.cgroup_root):
        cg.mkdir(exist_ok=True)
    (d / "node.json").write_text(json.dumps(asdict(st), indent=1))


def write_configs(st: NodeState, cluster_pki: Path, cache: Path, server: str) -> dict[str, Path]:
    """Every config file of the node; their paths by component."""
    conf = Path(st.dir) / "conf"
    kubeconfigs = {}
    for client in ("kubelet", "kube-proxy", "coredns", "fake-gpu"):
        path = conf / f"{client}.kubeconfig"
        path.write_text(pki.kubeconfig(server, cluster_pki, client))
        path.chmod(0o600)
        kubeconfigs[client] = path
    files = {
        "containerd": (
            conf / "containerd.toml",
            containerd_config(st, shared_root(cache) or Path(st.dir) / "containerd" / "root", cache / "bin"),
        ),
        "kubelet": (conf / "kubelet.json", json.dumps(kubelet_config(st, cluster_pki, DNS_IP), indent=1)),
        "kube-proxy": (conf / "kube-proxy.json", json.dumps(kube_proxy_config(kubeconfigs["kube-proxy"]), indent=1)),
        "coredns": (conf / "Corefile", corefile(kubeconfigs["coredns"])),
        "cni": (Path(st.dir) / "cni" / "10-kuberl.conflist", json.dumps(cni_config(st), indent=1)),
    }
    for path, text in files.values():
        path.write_text(text)
    return {**{k: v[0] for k, v in files.items()}, **{f"{k}.kubeconfig": v for k, v in kubeconfigs.items()}}


def apply_objects(admin: kapi.Api) -> None:
    """CoreDNS's and the DRA driver's rights, the driver's DeviceClass, and the `kubernetes` Service's endpoint (the
    relay)."""
    for resource, obj in zip((kapi.CLUSTERROLES, kapi.CLUSTERROLEBINDINGS) * 2, (*COREDNS_RBAC, *dra.rbac())):
        admin.apply(resource, obj["metadata"]["name"], json.dumps(obj), namespace=None)
    admin.apply(kapi.DEVICECLASSES, dra.DEVICE_CLASS, json.dumps(dra.device_class()), namespace=None)
    for resource, obj in zip((kapi.ENDPOINTS, kapi.ENDPOINTSLICES), kubernetes_endpoints()):
        admin.apply(resource, obj["metadata"]["name"], json.dumps(obj), namespace="default")


def _listening(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((ip, port)) == 0


def start(cluster: Cluster, images: list[Path], timeout: float = 90) -> NodeState:
    """Bring the real node up beside ``cluster``'s control plane; ``images`` (OCI tars) are loaded into containerd.

    Returns once the Node is Ready and CoreDNS answers. Fails with the component, its log's end and the fix.
    """
    if missing := missing_tools():
        raise NodeError(f"the real node needs {', '.join(missing)}: run `sh cluster/install-node-deps.sh` (apt-get)")
    if os.geteuid() != 0:
        raise NodeError("the real node needs root (containerd, runc, network namespaces, cgroups)")
    teardown(cluster.state)  # what an earlier, killed start of this state folder left
    sweep(cluster.cache)  # and what killed starts of other state folders left
    st = new_state(cluster.state)
    prepare(st)
    registry(cluster.cache).mkdir(exist_ok=True)
    record = registry(cluster.cache) / f"{st.id}.json"
    holder = cluster._start("netns", [shutil.which("sleep") or "sleep", "infinity"], prefix=("unshare", "-n", "--"))
    ours = os.readlink("/proc/self/ns/net")
    cluster._wait(holder, lambda: os.readlink(f"/proc/{holder.pid}/ns/net") != ours, 10, "unshare -n failed")
    st.netns_inode = _netns_inode(holder.pid)
    (Path(st.dir) / "node.json").write_text(json.dumps(asdict(st), indent=1))
    record.write_text(json.dumps({"state": str(cluster.state), **asdict(st)}))
    link_up(holder.pid, st)
    relay = cluster._start(
        "relay",
        [
            shutil.which("socat") or "socat",
            f"TCP-LISTEN:{RELAY_PORT},bind={pki.NODE_LINK_HOST},fork,reuseaddr",
            f"TCP:127.0.0.1:{cluster.ports['apiserver']}",
        ],
    )
    cluster._wait(relay, lambda: _listening(pki.NODE_LINK_HOST, RELAY_PORT), 10, "see the log")
    files = write_configs(st, cluster.pki, cluster.cache, f"https://{pki.NODE_LINK_HOST}:{RELAY_PORT}")
    apply_objects(cluster.admin())
    volumes.apply(cluster.admin(), Path(st.dir))
    inside = procs.netns(holder.pid)
    env = tool_path(cluster)
    containerd = cluster._start(
        "containerd", [cluster.bin("containerd"), "--config", str(files["containerd"])], env=env, prefix=inside
    )
    cluster._wait(containerd, lambda: Path(st.containerd_sock).exists(), 30, "see the log")
    for tar in images:
        load(tar, Path(st.containerd_sock))  # imports only what containerd lacks: the root is kept between runs
    start_kubelet(cluster, timeout)
    admin = cluster.admin()
    from .stack import http_ok  # (stack imports this module)

    proxy = cluster._start("kube-proxy", [cluster.bin("kube-proxy"), f"--config={files['kube-proxy']}"], prefix=inside)
    cluster._wait(proxy, lambda: http_ok(f"http://{pki.NODE_LINK_NODE}:10256/healthz"), 30, "see the log")
    dns = cluster._start("coredns", [cluster.bin("coredns"), "-conf", str(files["coredns"])], prefix=inside)
    cluster._wait(dns, lambda: http_ok(f"http://{DNS_IP}:8181/ready"), 30, "see the log")
    fake_gpu = cluster.bin(pins.own_name(pins.FAKE_GPU))
    if Path(fake_gpu).is_file():
        gpus = cluster._start("fake-gpu", dra.argv(fake_gpu, str(files["fake-gpu.kubeconfig"]), pki.NODE_NAME,
                                                   str(Path(st.dir) / "kubelet")), prefix=inside)
        cluster._wait(gpus, lambda: _published(admin), 30, "see the log")
    enforcer = cluster.bin(pins.own_name(pins.NETWORK_POLICIES))
    gap = Path(st.dir) / GAP_FILE
    gap.unlink(missing_ok=True)
    if not Path(enforcer).is_file():
        gap.write_text(f"NetworkPolicy is not enforced on this node: {enforcer} is not built (`make cluster-build`)")
    elif not queue_supported(holder.pid):
        gap.write_text(netpol.UNENFORCED)
    else:
        creds = netpol.credentials(admin, cluster.pki / "ca.crt", Path(st.dir) / "netpol")
        policies = cluster._start("network-policies", netpol.argv(enforcer, pki.NODE_NAME),
                                  env=netpol.env(pki.NODE_LINK_HOST, RELAY_PORT, creds),
                                  prefix=(*inside, *netpol.PREFIX))
        cluster._wait(policies, lambda: enforcing(holder.pid), 60, "see the log")
    return st


def queue_supported(holder: int) -> bool:
    """Whether the kernel runs the nftables queue expression (checked in the node's namespace, nothing applied)."""
    cmd = [*procs.netns(holder), "nft", "-c", "-f", "-"]
    return subprocess.run(cmd, input=netpol.QUEUE_CHECK, capture_output=True, text=True).returncode == 0


def enforcement_gap(state: Path) -> str | None:
    """Why the real node of the cluster in `state` enforces no NetworkPolicy; None when it does."""
    gap = state / "node" / GAP_FILE
    return gap.read_text() if gap.is_file() else None


def enforcing(holder: int) -> bool:
    """Whether kube-network-policies keeps its nftables table in the node's namespace (its caches are in sync)."""
    try:
        run("nft", "list", "table", *netpol.TABLE, netns_of=holder)
    except NodeError:
        return False
    return True


def tool_path(cluster: Cluster) -> dict[str, str]:
    """The node's processes find the cluster's tools (runc, the CNI plugins) first."""
    return {"PATH": f"{cluster.cache / 'bin'}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}


def start_kubelet(cluster: Cluster, timeout: float = 90) -> procs.Proc:
    """Start the real node's kubelet (in the node's network namespace, with the configs `start` wrote) and return
    once the Node is Ready: at the node's start, and again after a `Cluster.halt("kubelet")`."""
    st = NodeState.load(cluster.state)
    holder = next((p for p in cluster.procs if p.name == "netns"), None)
    if st is None or holder is None:
        raise NodeError(f"no real node in {cluster.state} to start a kubelet on")
    conf = Path(st.dir) / "conf"
    kubelet = cluster._start(
        "kubelet",
        [
            cluster.bin("kubelet"),
            f"--config={conf / 'kubelet.json'}",
            f"--kubeconfig={conf / 'kubelet.kubeconfig'}",
            f"--root-dir={Path(st.dir) / 'kubelet'}",
            f"--hostname-override={pki.NODE_NAME}",
            f"--node-ip={pki.NODE_LINK_NODE}",
            "--node-labels=type=real,kuberl.io/real-node=true",
        ],
        env=tool_path(cluster),
        prefix=procs.netns(holder.pid),
    )
    admin = cluster.admin()
    from .stack import node_ready  # (stack imports this module)

    cluster._wait(
        kubelet, lambda: node_ready(admin.get(kapi.NODES, pki.NODE_NAME, namespace=None)), timeout, "see the log"
    )
    return kubelet


def _published(admin: kapi.Api) -> bool:
    """The fake-GPU driver's ResourceSlice of the node is there."""
    slices = admin.list(kapi.RESOURCESLICES, namespace=None)
    return any(s["spec"].get("driver") == dra.DRIVER and s["spec"].get("nodeName") == pki.NODE_NAME for s in slices)
