"""What is built, from which build module, and where the binaries are cached.

Each component is a build module under ``cluster/gomod/<module>`` whose go.mod pins the release
(and, for k8s.io/kubernetes and etcd, replaces the modules their own go.mod points at ./paths).
The cache key hashes the Go version and every build module's go.mod and go.sum, so a change of any
pin builds anew, and an unchanged set starts from the cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

GOMOD = Path(__file__).resolve().parents[1] / "gomod"
CACHE_ENV = "KUBERL_CLUSTER_CACHE"  # default ~/.cache/kuberl-cluster


@dataclass(frozen=True)
class Binary:
    name: str  # the file name under bin/
    module: str  # build module folder under cluster/gomod/
    package: str  # the Go package of the command
    tags: str = ""  # Go build tags
    static: bool = False  # CGO_ENABLED=0: a binary that runs inside containers or needs no libc


BINARIES = (
    Binary("etcd", "etcd", "go.etcd.io/etcd/server/v3"),
    Binary("kube-apiserver", "kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver"),
    Binary("kube-controller-manager", "kubernetes", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    Binary("kube-scheduler", "kubernetes", "k8s.io/kubernetes/cmd/kube-scheduler"),
    Binary("kubectl", "kubernetes", "k8s.io/kubernetes/cmd/kubectl"),  # the server's own version, for tests and you
    Binary("kwok", "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
    Binary("ray-operator", "kuberay", "github.com/ray-project/kuberay/ray-operator"),
    # The real node: kubelet and kube-proxy from the same release, containerd v2 (Debian bookworm's 1.6 is
    # end-of-life and older than kubelet's supported set), the CNI plugins, CoreDNS, and BuildKit for the images.
    Binary("kubelet", "kubernetes", "k8s.io/kubernetes/cmd/kubelet"),
    Binary("kube-proxy", "kubernetes", "k8s.io/kubernetes/cmd/kube-proxy"),
    Binary("containerd", "containerd", "github.com/containerd/containerd/v2/cmd/containerd", "no_btrfs no_devmapper"),
    Binary(
        "containerd-shim-runc-v2",
        "containerd",
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        static=True,
    ),
    Binary("ctr", "containerd", "github.com/containerd/containerd/v2/cmd/ctr", "no_btrfs no_devmapper"),
    *(
        Binary(name, "cni", f"github.com/containernetworking/plugins/plugins/{kind}/{name}", static=True)
        for kind, name in (("main", "bridge"), ("main", "loopback"), ("ipam", "host-local"))
    ),
    Binary("coredns", "coredns", "github.com/coredns/coredns", static=True),
    Binary("buildkitd", "buildkit", "github.com/moby/buildkit/cmd/buildkitd", "no_btrfs"),
    Binary("buildctl", "buildkit", "github.com/moby/buildkit/cmd/buildctl"),
)

# Kept out of the cache key, so that adding or changing one does not rebuild the pinned set: each binary's file name
# carries a hash of its build module's folder instead (own_name). Our fake-GPU DRA driver (its source in the build
# module), and SIG Network's NetworkPolicy enforcement for the real node (pinned like the rest, added after them).
FAKE_GPU = Binary("kuberl-fake-gpu", "fakegpu", "kuberl.io/cluster/fakegpu", static=True)
NETWORK_POLICIES = Binary("kube-network-policies", "netpol", "sigs.k8s.io/kube-network-policies/cmd", static=True)
KUEUE = Binary("kueue", "kueue", "sigs.k8s.io/kueue/cmd/kueue", static=True)  # started on demand (localkube.kueue)
OWN = (FAKE_GPU, NETWORK_POLICIES, KUEUE)

KUBERAY_MODULE = "github.com/ray-project/kuberay/ray-operator"  # its CRDs: config/crd/bases in the module
KUEUE_MODULE = "sigs.k8s.io/kueue"  # its CRDs and webhooks: config/components/{crd/bases,webhook} in the module


def ldflags(binary: Binary) -> str:
    """Version stamps that upstream's release builds set at link time (only the link step sees them).
    Without them kube-apiserver reports v0.0.0-master, which Helm's kubeVersion check refuses."""
    v = versions()
    if binary.module == "kubernetes":
        major, minor = v["kubernetes"].lstrip("v").split(".")[:2]
        stamps = {"gitVersion": v["kubernetes"], "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
        return " ".join(
            f"-X {pkg}.{k}={val}"
            for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
            for k, val in stamps.items()
        )
    if binary.module == "containerd":
        return f"-X github.com/containerd/containerd/v2/version.Version={v['containerd']}"
    if binary.module == "buildkit":
        return f"-X github.com/moby/buildkit/version.Version={v['buildkit']}"
    if binary.module == "kwok":
        return f"-X sigs.k8s.io/kwok/pkg/consts.Version={v['kwok'].lstrip('v')}"
    return ""


def go() -> str | None:
    """The Go toolchain on PATH (or $GO), None without one."""
    return os.environ.get("GO") or shutil.which("go")


def go_version(gobin: str) -> str:
    return subprocess.run([gobin, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()


def pinned(module: str, path: str) -> str:
    """The version a build module requires of ``path`` (from its go.mod)."""
    for line in (GOMOD / module / "go.mod").read_text().splitlines():
        words = line.replace("require ", "").split()
        if len(words) >= 2 and words[0] == path:
            return words[1]
    raise LookupError(f"{path} is not required in cluster/gomod/{module}/go.mod")


def versions() -> dict[str, str]:
    """Component -> pinned release, as the build modules say."""
    return {
        "kubernetes": pinned("kubernetes", "k8s.io/kubernetes"),
        "etcd": pinned("etcd", "go.etcd.io/etcd/server/v3"),
        "kwok": pinned("kwok", "sigs.k8s.io/kwok"),
        "kuberay": pinned("kuberay", KUBERAY_MODULE),
        "containerd": pinned("containerd", "github.com/containerd/containerd/v2"),
        "cni-plugins": pinned("cni", "github.com/containernetworking/plugins"),
        "coredns": pinned("coredns", "github.com/coredns/coredns"),
        "buildkit": pinned("buildkit", "github.com/moby/buildkit"),
    }


def kueue_version() -> str:
    """Kueue's pinned release (kept out of `versions`, whose values name the cache folder: see OWN)."""
    return pinned("kueue", KUEUE_MODULE)


def cache_key(go_version_text: str) -> str:
    digest = hashlib.sha256(go_version_text.encode())
    digest.update(repr([(b, ldflags(b)) for b in BINARIES]).encode())
    for module in sorted({b.module for b in BINARIES}):
        for name in ("go.mod", "go.sum"):
            digest.update((GOMOD / module / name).read_bytes())
    return f"{key_stem()}{digest.hexdigest()[:10]}"


def key_stem() -> str:
    """The readable start of a cache folder's name: every component's version."""
    return "".join(f"{name}-{version}-" for name, version in versions().items())


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kuberl-cluster")


def find_cached() -> Path | None:
    """A complete cache folder for the current pins, found without Go (the newest if several)."""
    stem = key_stem()
    gobin = go()
    if gobin is not None:
        folder = cache_root() / cache_key(go_version(gobin))
        return folder if complete(folder) else None
    found = sorted((p for p in cache_root().glob(stem + "*") if complete(p)), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def own_name(binary: Binary) -> str:
    """The file name of a binary of OWN: its name and a hash of its build module's files."""
    digest = hashlib.sha256()
    for path in sorted((GOMOD / binary.module).iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return f"{binary.name}-{digest.hexdigest()[:10]}"


def kueue_config(folder: Path) -> Path:
    """Where a cache folder keeps the pinned Kueue's CRDs (crds/) and webhook manifests (webhooks.yaml)."""
    return folder / f"{own_name(KUEUE)}-config"


def complete(folder: Path) -> bool:
    return all((folder / "bin" / b.name).is_file() for b in BINARIES) and (folder / "crds").is_dir()
