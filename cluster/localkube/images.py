"""Build the images of images/ with BuildKit from Debian packages: no Docker engine, no registry.

``python -m localkube images [pause operator runtime-cpu runtime]`` (``make images``) starts a
buildkitd (runc worker, host network for RUN steps) for the duration of the builds and stops it after.
The Debian bases come from ``debootstrap`` (bookworm, minbase), are cached by their package list and
handed to the repository's own Dockerfiles as named contexts; each lock's wheels are downloaded on
the host into a wheelhouse, the named context ``wheels``. Every result is an OCI tar under
``pins.cache_root()/images/oci``, loaded into the local node's containerd with ``load`` when it runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import build, pins, procs

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("buildkitd", "buildctl", "ctr")  # built from cluster/gomod/{buildkit,containerd} when missing
MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
REGISTRY = "ghcr.io/kuberl"
PAUSE_IMAGE = "localhost/kuberl/pause:3.10"
BUILD_SYSTEM = "images/build-system.txt"  # pyproject's [build-system] requires, locked by `make locks`
DEFAULT = ("pause", "operator", "runtime-cpu")  # `runtime` (CUDA) needs nvidia/cuda from Docker Hub
# BuildKit's garbage collection: keep a warm cache of the images (several GB) but leave the disk room.
BUILDKITD_TOML = """\
[worker.oci]
  gc = true
  reservedSpace = "20GB"
  maxUsedSpace = "60GB"
  minFreeSpace = "10GB"
[worker.containerd]
  enabled = false
"""
ROOTFS_REVISION = 1  # part of the bases' cache key: bump it when prepare_rootfs changes
Log = Callable[[str], None]


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class Base:
    """A Debian root filesystem made by debootstrap, as an image named ``name`` for BASE_IMAGE."""

    name: str
    packages: tuple[str, ...] = ()

    def key(self) -> str:
        recipe = [SUITE, "minbase", MIRROR, sorted(self.packages), ROOTFS_REVISION,
                  (REPO / "images/base/Dockerfile").read_text()]
        return hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]


# The operator's Python comes with the base (its Dockerfile installs nothing with apt); the runtime's
# Dockerfile installs its own Debian packages (python3-venv, gcc, wget, ...) on a bare minbase.
DEBIAN = Base("localhost/kuberl/debian:bookworm")
DEBIAN_PYTHON = Base("localhost/kuberl/debian-python:bookworm",
                     ("python3", "python3-venv", "python-is-python3", "ca-certificates"))


@dataclass(frozen=True)
class Image:
    key: str  # what `make images IMAGES=...` names
    name: str  # the image reference in the OCI tar
    dockerfile: str  # relative to the repository
    base: Base | None = None  # None: the Dockerfile's own BASE_IMAGE, pulled from its registry
    args: dict[str, str] = field(default_factory=dict)
    lock: str | None = None  # the lock whose wheels make the wheelhouse
    python: str = "3.11"  # the image's Python, for the wheelhouse


def version() -> str:
    return re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)


def catalogue(registry: str = REGISTRY, cuda_base: str = "") -> dict[str, Image]:
    """Every image ``make images`` can build, by key; the CUDA runtime on ``cuda_base`` (a digest) when given."""
    v = version()
    return {
        "pause": Image("pause", PAUSE_IMAGE, "images/pause/Dockerfile"),
        "operator": Image("operator", f"{registry}/kuberl-operator:{v}", "images/operator/Dockerfile", DEBIAN_PYTHON,
                          {"LOCK": "requirements-py311.txt"}, "images/operator/requirements-py311.txt"),
        "runtime-cpu": Image("runtime-cpu", f"{registry}/kuberl-runtime:{v}-cpu", "images/runtime/Dockerfile", DEBIAN,
                             {"FLAVOR": "cpu", "LOCK": "requirements-cpu.txt"}, "images/runtime/requirements-cpu.txt"),
        "runtime": Image("runtime", f"{registry}/kuberl-runtime:{v}", "images/runtime/Dockerfile",
                         args={"BASE_IMAGE": cuda_base} if cuda_base else {}, lock="images/runtime/requirements.txt",
                         python="3.12"),
    }


def cache_dir() -> Path:
    return pins.cache_root() / "images"


def tar_path(key: str) -> Path:
    """Where the OCI tar of image ``key`` goes."""
    return cache_dir() / "oci" / f"{key}.tar"


def bindir(log: Log = print) -> Path:
    """The binary cache's bin/ with buildkitd, buildctl and ctr; only those are built here when missing."""
    gobin = pins.go()
    if gobin is None:
        found = sorted((p / "bin" for p in pins.cache_root().iterdir()
                        if all((p / "bin" / t).is_file() for t in TOOLS)), key=lambda p: p.stat().st_mtime)
        if not found:
            raise ImageError("no Go toolchain and no cached buildkitd/buildctl/ctr\n"
                             "fix: install Go >= 1.26 and run `make cluster-build`")
        return found[-1]
    folder = pins.cache_root() / pins.cache_key(pins.go_version(gobin)) / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    for binary in pins.BINARIES:
        if binary.name in TOOLS and not (folder / binary.name).is_file():
            build.build_binary(gobin, binary, folder, log)
    return folder


def need(program: str, package: str) -> str:
    path = shutil.which(program) or shutil.which(program, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        raise ImageError(f"{program} is missing: sh images/install.sh (apt-get install {package})")
    return path


def run(argv: list[str | Path], log_file: Path | None = None, **kw) -> None:
    """Run a command; its output goes to ``log_file`` (or is captured) and its tail into the error."""
    argv = [str(a) for a in argv]
    if log_file is None:
        proc = subprocess.run(argv, capture_output=True, text=True, **kw)
        tail = (proc.stdout + proc.stderr).strip()
    else:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "w") as out:
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kw)
        tail = log_file.read_text(errors="replace").strip()
    if proc.returncode != 0:
        tail = "\n".join(tail.splitlines()[-25:])
        where = f" (whole log: {log_file})" if log_file else ""
        raise ImageError(f"{Path(argv[0]).name} failed{where}:\n{tail}")


@contextlib.contextmanager
def buildkitd(bins: Path, log: Log = print) -> Iterator[str]:
    """A buildkitd for the builds: root, state in ``pins.cache_root()/buildkit`` (its cache survives), socket
    in a temporary folder; stopped (and the folder removed) on the way out, and killed if this process dies."""
    if os.geteuid() != 0:
        raise ImageError("buildkitd's runc worker needs root (run `make images` as root)")
    runc = need("runc", "runc")
    tmp = Path(tempfile.mkdtemp(prefix="kuberl-buildkit-"))
    addr = f"unix://{tmp}/buildkitd.sock"
    (tmp / "buildkitd.toml").write_text(BUILDKITD_TOML)
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    argv = [str(bins / "buildkitd"), "--root", str(pins.cache_root() / "buildkit"), "--addr", addr,
            "--config", str(tmp / "buildkitd.toml"), "--oci-worker=true", "--containerd-worker=false",
            "--oci-worker-net=host", "--oci-worker-binary", runc]
    (logs / "buildkitd.log").unlink(missing_ok=True)
    proc = procs.start("buildkitd", argv, logs, tie_to_parent=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            probe = subprocess.run([str(bins / "buildctl"), "--addr", addr, "debug", "workers"], capture_output=True)
            if probe.returncode == 0:
                break
            if not proc.alive() or time.monotonic() > deadline:
                raise ImageError(f"buildkitd did not start ({proc.log}):\n{proc.tail()}")
            time.sleep(0.2)
        yield addr
    finally:
        procs.stop_all([proc])
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_rootfs(root: Path) -> None:
    """What debootstrap leaves that an image should not carry: device nodes (the runtime makes /dev), apt's
    package lists and downloaded packages, logs; and apt sources with Debian's security and point updates."""
    for folder in ("dev", "var/lib/apt/lists", "var/cache/apt", "var/log", "tmp", "run"):
        for entry in (root / folder).glob("*"):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)
    (root / "etc/apt/sources.list").write_text(
        f"deb {MIRROR} {SUITE} main\ndeb {MIRROR} {SUITE}-updates main\n"
        f"deb {MIRROR}-security {SUITE}-security main\n")
    for name in ("etc/hostname", "etc/resolv.conf"):
        (root / name).unlink(missing_ok=True)


def rootfs(base: Base, log: Log = print) -> Path:
    """``rootfs.tar`` of ``base``: debootstrap of bookworm (minbase plus its packages), cached by its recipe."""
    folder = cache_dir() / "base" / base.key()
    tar = folder / "rootfs.tar"
    if tar.is_file():
        return tar
    debootstrap = need("debootstrap", "debootstrap")
    part = folder.with_name(f".{folder.name}.part")
    if part.exists():
        run(["rm", "-rf", "--one-file-system", part])
    (part / "rootfs").mkdir(parents=True)
    debs = cache_dir() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    argv = [debootstrap, "--variant=minbase", f"--cache-dir={debs}", "--components=main"]
    if base.packages:
        argv.append("--include=" + ",".join(base.packages))
    log(f"debootstrap {SUITE} (minbase{', ' + ', '.join(base.packages) if base.packages else ''}) for {base.name} ...")
    start = time.monotonic()
    run([*argv, SUITE, part / "rootfs", MIRROR], part / "debootstrap.log")
    prepare_rootfs(part / "rootfs")
    run(["tar", "--numeric-owner", "--xattrs", "-C", part / "rootfs", "-cf", part / "rootfs.tar", "."])
    run(["rm", "-rf", "--one-file-system", part / "rootfs"])
    shutil.rmtree(folder, ignore_errors=True)
    part.rename(folder)
    log(f"  {base.name}: rootfs {tar.stat().st_size / 2**20:.0f} MiB in {time.monotonic() - start:.0f}s")
    return tar


def buildctl(bins: Path, addr: str, dockerfile: Path, context: Path, output: str, log_file: Path,
             opts: dict[str, str] | None = None, extra: list[str] | None = None) -> None:
    argv = [bins / "buildctl", "--addr", addr, "build", "--progress=plain", "--frontend", "dockerfile.v0",
            "--local", f"context={context}", "--local", f"dockerfile={dockerfile.parent}",
            "--opt", f"filename={dockerfile.name}", "--output", output, *(extra or [])]
    for key, value in (opts or {}).items():
        argv += ["--opt", f"{key}={value}"]
    run(argv, log_file)


def oci_output(dest: Path, name: str, tar: bool = True) -> str:
    """An OCI exporter with uncompressed layers (faster to write and to import; the tars stay local)."""
    return f"type=oci,dest={dest},name={name},compression=uncompressed,tar={str(tar).lower()}"


def base_layout(base: Base, bins: Path, addr: str, log: Log = print) -> tuple[Path, str]:
    """The base as an OCI layout folder (built once per recipe) and its manifest digest."""
    layout = cache_dir() / "base" / base.key() / "oci"
    if not (layout / "index.json").is_file():
        tar = rootfs(base, log)
        part = layout.with_name("oci.part")
        shutil.rmtree(part, ignore_errors=True)
        buildctl(bins, addr, REPO / "images/base/Dockerfile", tar.parent, oci_output(part, base.name, tar=False),
                 cache_dir() / "logs" / f"base-{base.key()}.log")
        part.rename(layout)
    index = json.loads((layout / "index.json").read_text())
    return layout, index["manifests"][0]["digest"]


def lock_pins(lock: Path) -> set[tuple[str, str]]:
    return {(canonical(m.group(1)), m.group(2))
            for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", lock.read_text(), re.M)}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# The images' platform for `pip download`, which does not widen a manylinux_2_36 it is given to the older tags
# that the same glibc runs (bookworm and Ubuntu 24.04: glibc 2.36 and newer).
PLATFORMS = [f"--platform=manylinux_2_{n}_x86_64" for n in range(36, 4, -1)] + [
    f"--platform={tag}_x86_64" for tag in ("manylinux2014", "manylinux2010", "manylinux1")]


def wheelhouse(image: Image, log: Log = print) -> Path:
    """The wheels of the image's lock and of kuberl's build system (images/build-system.txt: with them the
    Dockerfiles' pip runs without an index), downloaded on the host, hash-checked and kept between builds;
    files of other versions are removed, so the folder, BuildKit's cache key for the install steps, is the
    locks' alone."""
    locks = [REPO / image.lock, REPO / BUILD_SYSTEM]
    folder = cache_dir() / "wheels" / f"{image.key}-py{image.python}"
    stamp = folder.with_name(folder.name + ".done")  # the locks it holds: a warm build skips pip's hash checks
    digest = hashlib.sha256(b"".join(lock.read_bytes() for lock in locks)).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest:
        return folder
    stamp.unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--require-hashes",
         "--no-deps", "--only-binary=:all:", "--implementation", "cp", "--python-version", image.python,
         *PLATFORMS, *(f"--requirement={lock}" for lock in locks), "-d", folder])
    wanted = lock_pins(locks[0]) | lock_pins(locks[1])
    for wheel in folder.iterdir():
        dist, ver = wheel.name.split("-")[:2]
        if (canonical(dist), ver) not in wanted:
            wheel.unlink()
    have = {canonical(w.name.split("-")[0]) for w in folder.glob("*.whl")}
    missing = sorted(name for name, _ in wanted if name not in have)
    if missing:
        raise ImageError(f"{image.lock}: no wheel kept for {missing} in {folder}")
    stamp.write_text(digest)
    size = sum(w.stat().st_size for w in folder.iterdir()) / 2**30
    log(f"  wheelhouse {folder}: {len(wanted)} wheels, {size:.1f} GiB ({time.monotonic() - start:.0f}s)")
    return folder


def pause_binary(log: Log = print) -> Path:
    """Kubernetes' build/pause/linux/pause.c from the pinned module, as upstream builds it (static, -Os)."""
    gobin = pins.go()
    if gobin is None:
        raise ImageError("the pause image is compiled from the k8s.io/kubernetes module: install Go")
    src = build.module_dir(gobin, "kubernetes", "k8s.io/kubernetes") / "build" / "pause"
    tag = re.search(r"^TAG \?= (\S+)", (src / "Makefile").read_text(), re.M).group(1)
    flags = ["-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{tag}"]
    key = hashlib.sha256(json.dumps([(src / "linux/pause.c").read_text(), flags]).encode()).hexdigest()[:12]
    out = cache_dir() / "pause" / key / "pause"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        run([need("gcc", "gcc libc6-dev"), *flags, "-o", out.with_suffix(".part"), src / "linux/pause.c"])
        out.with_suffix(".part").rename(out)
        log(f"  pause: compiled {src / 'linux/pause.c'} ({out.stat().st_size / 1024:.0f} KiB)")
    return out


def build_image(image: Image, bins: Path, addr: str, log: Log = print) -> Path:
    """One image into its OCI tar (replaced only when the build succeeds)."""
    start = time.monotonic()
    logs = cache_dir() / "logs"
    tar = tar_path(image.key)
    tar.parent.mkdir(parents=True, exist_ok=True)
    part = tar.with_name(f".{tar.name}.part")
    # A fixed creation time: an unchanged image keeps its digest, so containerd is not given it again.
    opts = {"build-arg:SOURCE_DATE_EPOCH": "0", **{f"build-arg:{k}": v for k, v in image.args.items()}}
    extra: list[str] = []
    context = REPO
    if image.key == "pause":
        context = pause_binary(log).parent
    if image.base is not None:
        layout, digest = base_layout(image.base, bins, addr, log)
        extra += ["--oci-layout", f"base={layout}"]
        opts["build-arg:BASE_IMAGE"] = image.base.name
        opts[f"context:{image.base.name}"] = f"oci-layout://base@{digest}"
    if image.lock is not None:
        extra += ["--local", f"wheels={wheelhouse(image, log)}"]
        opts["context:wheels"] = "local:wheels"
    log(f"building {image.name} from {image.dockerfile} (progress: {logs / image.key}.log) ...")
    buildctl(bins, addr, REPO / image.dockerfile, context, oci_output(part, image.name), logs / f"{image.key}.log",
             opts, extra)
    part.chmod(0o644)
    part.rename(tar)
    log(f"  {image.name}: {tar} ({tar.stat().st_size / 2**20:,.0f} MiB) in {time.monotonic() - start:.0f}s")
    return tar


def containerd_socket(state: Path) -> Path:
    """Where the local node's containerd listens (cluster/localkube's node stack)."""
    return state / "node" / "containerd" / "containerd.sock"


def tar_image(tar: Path) -> tuple[str, str]:
    """The name and manifest digest of a one-image OCI tar (as BuildKit's oci exporter writes it)."""
    with tarfile.open(tar) as archive:
        entry = json.load(archive.extractfile("index.json"))["manifests"][0]
    return entry["annotations"]["io.containerd.image.name"], entry["digest"]


def load(tar: Path, address: Path) -> bool:
    """Import an OCI tar into the containerd at ``address``, in the namespace the kubelet uses (k8s.io),
    unless it holds that image already (same name and digest); whether it imported."""
    ctr = [str(bindir() / "ctr"), "--address", str(address), "-n", "k8s.io", "images"]
    name, digest = tar_image(tar)
    listed = subprocess.run([*ctr, "ls", f"name=={name}"], capture_output=True, text=True)
    if listed.returncode == 0 and any(line.split()[:1] == [name] and digest in line.split()
                                      for line in listed.stdout.splitlines()):
        return False
    # --discard-unpacked-layers: the layers' blobs go once unpacked (the snapshots are what runs): 6 GB less.
    run([*ctr, "import", "--local", "--all-platforms", "--discard-unpacked-layers", tar])
    return True


def main(keys: list[str], state: Path, registry: str = REGISTRY, cuda_base: str = "", log: Log = print) -> int:
    """Build ``keys`` (default: DEFAULT), then load them into the local node's containerd if it runs."""
    images = catalogue(registry, cuda_base)
    unknown = [k for k in keys if k not in images]
    if unknown:
        print(f"error: unknown image {unknown}; choose from {', '.join(images)}", file=sys.stderr)
        return 2
    if "runtime" in keys and "@sha256:" not in cuda_base:
        print("error: the CUDA runtime is built on nvidia/cuda pinned by digest: give CUDA_BASE="
              "nvidia/cuda:13.0.2-runtime-ubuntu24.04@sha256:<digest> (images/README.md)", file=sys.stderr)
        return 2
    start = time.monotonic()
    try:
        bins = bindir(log)
        tars = {}
        with buildkitd(bins, log) as addr:
            for key in keys or DEFAULT:
                tars[key] = build_image(images[key], bins, addr, log)
        log(f"built {len(tars)} images in {time.monotonic() - start:.0f}s")
        sock = containerd_socket(state)
        if sock.is_socket():
            for key, tar in tars.items():
                begin = time.monotonic()
                if load(tar, sock):
                    log(f"loaded {images[key].name} into {sock} (k8s.io) in {time.monotonic() - begin:.0f}s")
                else:
                    log(f"{images[key].name}: {sock} has it already")
        else:
            log(f"no containerd at {sock}: not loaded; once the node runs, for each tar:\n"
                f"  {bins / 'ctr'} --address {sock} -n k8s.io images import --all-platforms <tar>\n"
                f"  (or run `make images` again: warm, it only loads)")
    except (ImageError, build.BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
