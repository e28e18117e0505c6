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


BINARIES = (
    Binary("etcd", "etcd", "go.etcd.io/etcd/server/v3"),
    Binary("kube-apiserver", "kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver"),
    Binary("kube-controller-manager", "kubernetes", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    Binary("kube-scheduler", "kubernetes", "k8s.io/kubernetes/cmd/kube-scheduler"),
    Binary("kubectl", "kubernetes", "k8s.io/kubernetes/cmd/kubectl"),  # the server's own version, for tests and you
    Binary("kwok", "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
    Binary("ray-operator", "kuberay", "github.com/ray-project/kuberay/ray-operator"),
)
KUBERAY_MODULE = "github.com/ray-project/kuberay/ray-operator"  # its CRDs: config/crd/bases in the module


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
    }


def cache_key(go_version_text: str) -> str:
    digest = hashlib.sha256(go_version_text.encode())
    digest.update(repr([(b, ldflags(b)) for b in BINARIES]).encode())
    for module in sorted({b.module for b in BINARIES}):
        for name in ("go.mod", "go.sum"):
            digest.update((GOMOD / module / name).read_bytes())
    v = versions()
    return f"k8s-{v['kubernetes']}-etcd-{v['etcd']}-kwok-{v['kwok']}-kuberay-{v['kuberay']}-{digest.hexdigest()[:10]}"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kuberl-cluster")


def find_cached() -> Path | None:
    """A complete cache folder for the current pins, found without Go (the newest if several)."""
    v = versions()
    stem = f"k8s-{v['kubernetes']}-etcd-{v['etcd']}-kwok-{v['kwok']}-kuberay-{v['kuberay']}-"
    gobin = go()
    if gobin is not None:
        folder = cache_root() / cache_key(go_version(gobin))
        return folder if complete(folder) else None
    found = sorted((p for p in cache_root().glob(stem + "*") if complete(p)), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def complete(folder: Path) -> bool:
    return all((folder / "bin" / b.name).is_file() for b in BINARIES) and (folder / "crds").is_dir()
