"""Build the missing binaries of the current pins into the cache (``pins.cache_root()/<key>``).

A failure names the component and the fix, e.g. a proxy that cannot be reached, and leaves no
half-written binary behind (each is linked to a temporary name, then renamed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import pins


class BuildError(RuntimeError):
    pass


# What the build never takes from the caller's environment: modules are fetched only as go.sum pins them
# (-mod=readonly: no go.mod/go.sum rewrite), every download is checked against the checksum database, and none
# is fetched over plain HTTP.
UNCHECKED = ("GONOSUMDB", "GONOSUMCHECK", "GOINSECURE", "GOPRIVATE", "GONOPROXY", "GOSUMDB", "GOFLAGS")


def go_env(static: bool = False) -> dict[str, str]:
    """The environment of every go command of the build."""
    env = {k: v for k, v in os.environ.items() if k not in UNCHECKED}
    env["GOFLAGS"] = "-buildvcs=false -mod=readonly"
    if static:
        env["CGO_ENABLED"] = "0"
    return env


def module_dir(gobin: str, build_module: str, path: str) -> Path:
    """Where the Go module cache holds ``path`` at the version ``build_module`` pins (downloaded if needed)."""
    out = subprocess.run(
        [gobin, "mod", "download", "-json", path], cwd=pins.GOMOD / build_module, capture_output=True, text=True,
        env=go_env(),
    )
    if out.returncode != 0:
        raise BuildError(
            f"cannot download {path} for cluster/gomod/{build_module}: {out.stderr.strip()[-500:]}\n"
            "fix: check that the Go module proxy is reachable (go env GOPROXY)"
        )
    return Path(json.loads(out.stdout)["Dir"])


def build_binary(gobin: str, binary: pins.Binary, bindir: Path, log=print, name: str | None = None) -> float:
    """go build one command into bindir (as `name`, default its own); seconds taken."""
    start = time.monotonic()
    name = name or binary.name
    part = bindir / f".{name}.part"
    log(f"building {binary.name} ({binary.package}) in cluster/gomod/{binary.module} ...")
    env = go_env(binary.static)
    proc = subprocess.run(
        [gobin, "build", "-tags", binary.tags, "-ldflags", pins.ldflags(binary), "-o", str(part), binary.package],
        cwd=pins.GOMOD / binary.module,
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        part.unlink(missing_ok=True)
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise BuildError(
            f"building {binary.name} failed (cluster/gomod/{binary.module}):\n{tail}\n"
            "fix: a network error means the Go module proxy is unreachable (go env GOPROXY); a compile "
            "error means the Go toolchain is too old for the pins (go.mod's go line)"
        )
    part.rename(bindir / name)
    return time.monotonic() - start


def copy_crds(gobin: str, dest: Path) -> None:
    """KubeRay's own CRDs (RayCluster, RayJob, RayService) from the pinned module."""
    src = module_dir(gobin, "kuberay", pins.KUBERAY_MODULE) / "config" / "crd" / "bases"
    part = dest.with_name(".crds.part")
    shutil.rmtree(part, ignore_errors=True)
    shutil.copytree(src, part)
    for f in part.iterdir():
        f.chmod(0o644)
    shutil.rmtree(dest, ignore_errors=True)
    part.rename(dest)


def copy_kueue_config(gobin: str, dest: Path) -> None:
    """Kueue's CRDs and webhook manifests from the pinned module (localkube.kueue reads them)."""
    src = module_dir(gobin, "kueue", pins.KUEUE_MODULE) / "config" / "components"
    part = dest.with_name(dest.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    shutil.copytree(src / "crd" / "bases", part / "crds")
    shutil.copy(src / "webhook" / "manifests.yaml", part / "webhooks.yaml")
    for f in part.rglob("*"):
        f.chmod(0o755 if f.is_dir() else 0o644)
    shutil.rmtree(dest, ignore_errors=True)
    part.rename(dest)


def ensure_built(log=print) -> Path:
    """The cache folder with every binary and the KubeRay CRDs, building what is missing."""
    gobin = pins.go()
    if gobin is None:
        cached = pins.find_cached()
        if cached is None:
            raise BuildError(
                "no Go toolchain (go on PATH, or $GO) and no cached build of the pinned versions\n"
                "fix: install Go >= 1.26 and run `make cluster`"
            )
        return cached
    folder = pins.cache_root() / pins.cache_key(pins.go_version(gobin))
    bindir = folder / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    timings = {}
    for binary in pins.BINARIES:
        if not (bindir / binary.name).is_file():
            timings[binary.name] = round(build_binary(gobin, binary, bindir, log), 1)
    for binary in pins.OWN:
        if not (bindir / pins.own_name(binary)).is_file():
            timings[binary.name] = round(build_binary(gobin, binary, bindir, log, pins.own_name(binary)), 1)
    if not (folder / "crds").is_dir():
        copy_crds(gobin, folder / "crds")
    if not pins.kueue_config(folder).is_dir():
        copy_kueue_config(gobin, pins.kueue_config(folder))
    if timings:
        log(f"built {', '.join(f'{k} in {v}s' for k, v in timings.items())} into {bindir}")
    (folder / "versions.json").write_text(json.dumps(pins.versions(), indent=1) + "\n")
    return folder


def main() -> int:
    try:
        print(ensure_built())
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
