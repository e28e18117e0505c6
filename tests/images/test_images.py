"""The Dockerfiles, checked without a Docker engine: what they copy exists and is in the build
context, versions are pinned by documented build args, and the pins agree with the rest of the project."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
DOCKERFILES = {"operator": IMAGES / "operator" / "Dockerfile", "runtime": IMAGES / "runtime" / "Dockerfile"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
sys.path.insert(0, str(REPO / "cluster"))
from localkube import images as local  # noqa: E402  (the BuildKit builds of `make images`)


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def instructions(path: Path) -> list[Instruction]:
    """Dockerfile instructions with continuations joined, comments and heredoc bodies skipped."""
    out: list[Instruction] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        start, text = i + 1, lines[i]
        i += 1
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        while text.endswith("\\") and i < len(lines):
            text = text[:-1] + " " + lines[i].strip()
            i += 1
        for marker in re.findall(r"<<-?'?\"?(\w+)'?\"?", text):  # heredoc: skip to its end marker
            while i < len(lines) and lines[i].strip() != marker:
                i += 1
            i += 1
        keyword, _, args = text.strip().partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
    return out


def expand(text: str, args: dict[str, str | None]) -> str:
    """``${NAME}`` replaced by the build arg's value."""
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], text)


def copy_sources(inst: Instruction, args: dict[str, str | None] | None = None) -> list[str]:
    """Sources of a COPY/ADD from the build context ([] for COPY --from=stage), build args expanded."""
    args = expand(inst.args, args or {})
    if args.startswith("["):
        parts = json.loads(args)
    else:
        parts = shlex.split(args)
    flags = [p for p in parts if p.startswith("--")]
    if any(f.startswith("--from=") for f in flags):
        return []
    paths = [p for p in parts if not p.startswith("--")]
    return paths[:-1]


def dockerignore(dockerfile: Path) -> list[str]:
    path = dockerfile.with_name(dockerfile.name + ".dockerignore")
    if not path.exists():
        path = REPO / ".dockerignore"
    if not path.exists():
        return []
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule, closely enough for these files: the last pattern matching the path or one of its
    parent directories decides; `!` re-includes."""
    parents = [str(Path(*Path(rel).parts[: n + 1])) for n in range(len(Path(rel).parts))]
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        candidates = [pat, pat[3:]] if pat.startswith("**/") else [pat]
        if any(fnmatch.fnmatchcase(p, c) for p in parents for c in candidates):
            verdict = not negate
    return verdict


def context_files(source: str) -> list[Path]:
    pattern = any(ch in source for ch in "*?[")
    matches = sorted(REPO.glob(source.rstrip("/"))) if pattern else [REPO / source.rstrip("/")]
    return [m for m in matches if m.exists()]


@pytest.mark.parametrize("image", DOCKERFILES)
def test_every_copied_file_exists_and_is_in_the_context(image: str) -> None:
    dockerfile = DOCKERFILES[image]
    patterns = dockerignore(dockerfile)
    variants = [build_args(dockerfile)] + [{**build_args(dockerfile), **i.args} for i in local.catalogue().values()
                                           if i.dockerfile == str(dockerfile.relative_to(REPO))]
    copies = sorted({(inst, src) for args in variants for inst in instructions(dockerfile)
                     if inst.keyword in {"COPY", "ADD"} for src in copy_sources(inst, args)}, key=lambda c: c[0].line)
    assert len(variants) > 1, f"make images builds nothing from {dockerfile}"
    assert copies, f"{dockerfile} copies nothing from the context"
    for inst, source in copies:
        assert not source.startswith(("/", "..")), f"line {inst.line}: {source} is outside the build context"
        found = context_files(source)
        assert found, f"{dockerfile.relative_to(REPO)}:{inst.line}: COPY {source}: no such file in the repository"
        for path in found:
            rel = str(path.relative_to(REPO))
            assert not ignored(rel, patterns), (
                f"{dockerfile.relative_to(REPO)}:{inst.line}: {rel} is excluded by .dockerignore")
            if path.is_dir():
                kept = [f for f in path.rglob("*.py") if not ignored(str(f.relative_to(REPO)), patterns)]
                assert kept, f"{rel}: every Python file is excluded by .dockerignore"


def test_dockerignore_keeps_the_context_small() -> None:
    for dockerfile in DOCKERFILES.values():
        patterns = dockerignore(dockerfile)
        for heavy in (".venv/bin/python", ".tools/helm", "runs/quickstart/metrics.jsonl", ".git/HEAD",
                      "runtime/kuberl/__pycache__/cli.cpython-311.pyc"):
            assert ignored(heavy, patterns), f"{dockerfile.relative_to(REPO)}: {heavy} would be sent to the builder"


def build_args(dockerfile: Path) -> dict[str, str | None]:
    args: dict[str, str | None] = {}
    for inst in instructions(dockerfile):
        if inst.keyword == "ARG":
            name, eq, default = inst.args.partition("=")
            if eq or name.strip() not in args:  # a stage's bare `ARG NAME` takes the global default
                args[name.strip()] = default.strip().strip('"') if eq else None
    return args


@pytest.mark.parametrize("image", DOCKERFILES)
def test_versions_are_pinned_build_args_with_defaults(image: str) -> None:
    dockerfile = DOCKERFILES[image]
    args = build_args(dockerfile)
    missing = [name for name, default in args.items() if not default]
    assert not missing, f"build args without a default: {missing}"
    for inst in instructions(dockerfile):
        if inst.keyword != "FROM":
            continue
        ref = inst.args.split()[0]
        if "${" not in ref and ":" not in ref:
            continue  # FROM <stage>
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref)
        assert ":" in resolved and not resolved.endswith(":latest"), f"line {inst.line}: {resolved} is not pinned"
    for name, default in args.items():
        if name.endswith("_VERSION"):
            assert re.fullmatch(r"\d+(\.\d+)+", default), f"{name}={default} is not an exact version"


@pytest.mark.parametrize("image", DOCKERFILES)
def test_build_args_are_documented(image: str) -> None:
    readme = (IMAGES / "README.md").read_text()
    header = DOCKERFILES[image].read_text()
    for name, default in build_args(DOCKERFILES[image]).items():
        assert f"| `{name}` | `{default}` |" in readme, (
            f"images/README.md: no row for build arg {name} (default {default})")
        assert name in header.split("\nARG ", 1)[0], f"{name} is not named in the Dockerfile's comment header"


def requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0].lower().replace("_", "-")


def pin(extra: str, package: str) -> str:
    for req in PYPROJECT["project"]["optional-dependencies"][extra]:
        if requirement_name(req) == package:
            return req.split("==", 1)[1]
    raise AssertionError(f"pyproject's {extra} extra does not pin {package}")


# Python 3.12 locks for python:3.12-slim and Ubuntu 24.04; Python 3.11 ones for Debian bookworm (`make images`).
LOCKS = {**{image: IMAGES / image / "requirements.txt" for image in DOCKERFILES},
         "operator-py311": IMAGES / "operator" / "requirements-py311.txt",
         "runtime-cpu": IMAGES / "runtime" / "requirements-cpu.txt"}
HEAVY = {"torch", "ray", "transformers", "vllm", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13"}


def lock(image: str) -> dict[str, str]:
    """name -> version of a uv lock (``name==version \\`` then ``--hash=sha256:...`` lines); checks its form."""
    pins: dict[str, str] = {}
    name = None
    for line in LOCKS[image].read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            m = re.fullmatch(r"([a-z0-9][a-z0-9._-]*)==([^\s;]+)(?: ; .*)? \\", line)
            assert m, f"{LOCKS[image].relative_to(REPO)}: {line!r} is not `name==version \\`"
            name = canonical(m.group(1))
            assert name not in pins, f"{name} is locked twice"
            pins[name] = m.group(2)
        else:
            assert re.fullmatch(r"\s+--hash=sha256:[0-9a-f]{64}( \\)?", line), f"{name}: {line!r} is not a hash"
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extra(name: str) -> list[Requirement]:
    reqs = PYPROJECT["project"]["optional-dependencies"][name] + PYPROJECT["project"]["dependencies"]
    return [Requirement(r) for r in reqs if not r.startswith("kuberl[")]


@pytest.mark.parametrize("image", DOCKERFILES)
def test_images_install_their_lock_with_hashes(image: str) -> None:
    installs = [i.args for i in instructions(DOCKERFILES[image]) if i.keyword == "RUN" and "pip install" in i.args]
    text = " ".join(installs)
    assert "--require-hashes --no-deps -r /tmp/requirements.txt" in text
    args = build_args(DOCKERFILES[image])
    copies = [expand(i.args, args) for i in instructions(DOCKERFILES[image]) if i.keyword == "COPY"]
    assert f"images/{image}/requirements.txt /tmp/requirements.txt" in copies
    # kuberl itself comes without its dependencies: everything it needs is in the lock; its build system is locked
    # too, and no build isolation fetches an unpinned setuptools or wheel.
    assert re.search(r'pip install (?:"\$@" )?--no-deps --no-build-isolation /src(\s|$)', text)
    assert "--require-hashes --no-deps -r /tmp/build-system.txt" in text
    assert "images/build-system.txt /tmp/build-system.txt" in copies
    assert not re.search(r"\[(?:[^\]]*,)?\s*(runtime|operator|dev)\b", text), "an extra would resolve outside the lock"


@pytest.mark.parametrize("image", LOCKS)
def test_locks_pin_every_requirement_with_hashes(image: str) -> None:
    """Each lock satisfies every requirement of its extra (the runtime one also the Dockerfile's vLLM), and
    every package in it carries hashes (pip's --require-hashes refuses anything else)."""
    pins = lock(image)
    for req in extra(image.split("-")[0]):
        name = canonical(req.name)
        assert name in pins, f"{LOCKS[image].relative_to(REPO)} lacks {name}: run `make locks`"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name} {pins[name]} does not satisfy {req}"
    assert LOCKS[image].read_text().startswith(
        "# This file was autogenerated by uv via the following command:\n#    make locks\n")


def test_operator_lock_holds_no_runtime_or_test_packages() -> None:
    pins = lock("operator")
    assert "kopf" in pins and "pydantic" in pins
    assert not HEAVY & set(pins), f"kuberl[operator] pulls in {HEAVY & set(pins)}"
    assert "kubernetes-validate" not in pins and "pytest" not in pins


def test_local_locks_are_the_312_locks_for_python_311() -> None:
    """The Debian bookworm (Python 3.11) locks hold the versions of the 3.12 ones (uv was seeded with them):
    the CPU runtime differs from the GPU one only by what vLLM pulls in, and keeps torch's nvidia-* wheels,
    without which PyPI's torch 2.13.0 (a CUDA build) does not import."""
    for local_lock, lock312 in (("operator-py311", "operator"), ("runtime-cpu", "runtime")):
        pins, pins312 = lock(local_lock), lock(lock312)
        assert set(pins) <= set(pins312), f"{local_lock} has packages the 3.12 lock lacks: {set(pins) - set(pins312)}"
        moved = {name: (v, pins312[name]) for name, v in pins.items() if pins312[name] != v}
        assert not moved, f"{local_lock} differs from {lock312}: {moved}"
    cpu = lock("runtime-cpu")
    assert "vllm" not in cpu and "nvidia-cudnn-cu13" in cpu and "nvidia-nccl-cu13" in cpu
    assert lock("operator-py311").keys().isdisjoint(HEAVY)


def test_dockerfiles_need_no_frontend_image() -> None:
    """No `# syntax=` line: BuildKit would pull that frontend from Docker Hub; its built-in one does heredocs."""
    for dockerfile in IMAGES.glob("*/Dockerfile"):
        assert not re.search(r"^#\s*syntax\s*=", dockerfile.read_text(), re.M | re.I), dockerfile


def test_kubernetes_validate_is_a_test_dependency_only() -> None:
    """Only tests import it, so it lives in the dev extra, not in the operator's extra or image."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "kubernetes-validate" in {requirement_name(r) for r in extras["dev"]}
    assert "kubernetes-validate" not in {requirement_name(r) for r in extras["operator"] + extras["runtime"]}
    for package in ("operator", "runtime"):
        users = [p for p in (REPO / package).rglob("*.py") if "kubernetes_validate" in p.read_text()]
        assert not users, f"{users} import kubernetes_validate: it is not installed in the images"


def test_runtime_image_and_ci_test_the_same_torch() -> None:
    """The runtime image's torch is pyproject's pin, which is what `make venv` (CI's environment) installs; its
    vLLM is the Dockerfile's VLLM_VERSION (the build checks it), and Ray and transformers are pyproject's."""
    pins, args = lock("runtime"), build_args(DOCKERFILES["runtime"])
    assert pins["torch"] == pin("runtime", "torch")
    assert f"'torch=={pins['torch']}'" in (REPO / "Makefile").read_text()
    assert pins["vllm"] == args["VLLM_VERSION"]
    assert pins["ray"] == pin("runtime", "ray") and pins["transformers"] == pin("runtime", "transformers")
    assert "nvidia-ml-py" in pins  # NVML for the topology reader (kuberl.topology)
    assert "vllm.__version__ == '${VLLM_VERSION}'" in DOCKERFILES["runtime"].read_text()


def last_user(dockerfile: Path) -> tuple[int, int]:
    args = build_args(dockerfile)
    user = [i.args for i in instructions(dockerfile) if i.keyword == "USER"][-1]
    uid, gid = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], user).split(":")
    return int(uid), int(gid)


def test_images_run_as_the_users_the_pods_expect() -> None:
    from kuberl_operator import builders

    assert last_user(DOCKERFILES["runtime"]) == (builders.RAY_UID, builders.RAY_GID)
    values = yaml.safe_load((REPO / "charts" / "kuberl" / "values.yaml").read_text())
    uid, gid = last_user(DOCKERFILES["operator"])
    assert uid > 0 and (uid, gid) == (values["podSecurityContext"]["runAsUser"],
                                      values["podSecurityContext"]["runAsGroup"])


def test_image_names_agree_with_the_chart_and_the_operator() -> None:
    from kuberl_operator import builders

    values = yaml.safe_load((REPO / "charts" / "kuberl" / "values.yaml").read_text())
    version = PYPROJECT["project"]["version"]
    assert builders.DEFAULT_IMAGE == f"{values['runtimeImage']['repository']}:{version}"
    built = local.catalogue()
    assert built["runtime"].name == builders.DEFAULT_IMAGE
    assert built["operator"].name == f"{values['image']['repository']}:{version}"
    assert built["runtime-cpu"].name == f"{builders.DEFAULT_IMAGE}-cpu"
    assert built["pause"].name == "localhost/kuberl/pause:3.10"
    assert '$(CLUSTER) images --registry $(REGISTRY) --cuda-base "$(CUDA_BASE)" $(IMAGES)' in (
        REPO / "Makefile").read_text()
    assert values["image"]["repository"].endswith("/kuberl-operator")


@pytest.mark.parametrize("image", ["operator", "runtime"])
def test_a_base_image_by_tag_is_refused(image: str) -> None:
    """Each Dockerfile's first step after FROM runs its BASE_IMAGE check: a tag fails the build, naming the fix; a
    digest, or make images's own base (a named context pinned by digest), passes. Run here with sh, as BuildKit
    runs it."""
    steps = instructions(DOCKERFILES[image])
    first = next(i for i, s in enumerate(steps) if s.keyword == "FROM" and "BASE_IMAGE" in s.args)
    check = next(s for s in steps[first + 1:] if s.keyword == "RUN")
    assert "BASE_IMAGE" in check.args, f"{image}: the first RUN after FROM ${{BASE_IMAGE}} is not the check"
    default = build_args(DOCKERFILES[image])["BASE_IMAGE"]
    for base, ok in ((default, False), ("python:3.12", False), (f"{default}@sha256:{'0' * 64}", True),
                     ("localhost/kuberl/debian:bookworm", True)):
        run = subprocess.run(["sh", "-c", check.args], env={"BASE_IMAGE": base}, capture_output=True, text=True)
        assert (run.returncode == 0) == ok, (base, run.stderr)
        if not ok:
            assert f"BASE_IMAGE={base} is a tag: pin it by digest" in run.stderr, run.stderr
    assert local.main(["runtime"], Path("/nonexistent"), cuda_base="nvidia/cuda:13.0.2-runtime-ubuntu24.04") == 2


def test_operator_entrypoint_exists() -> None:
    entry = [i.args for i in instructions(DOCKERFILES["operator"]) if i.keyword == "ENTRYPOINT"][-1]
    assert json.loads(entry) == ["python", "-m", "kuberl_operator"]
    assert (REPO / "operator" / "kuberl_operator" / "__main__.py").is_file()


def test_make_images_builds_the_local_flavours_on_debian() -> None:
    """The default `make images` set: pause, and operator and CPU runtime on the debootstrap bases, with the
    Python 3.11 locks (the runtime without vLLM); the CUDA runtime keeps its nvidia/cuda base."""
    built = local.catalogue()
    assert local.DEFAULT == ("pause", "operator", "runtime-cpu")
    assert built["operator"].base == local.DEBIAN_PYTHON and "python3-venv" in local.DEBIAN_PYTHON.packages
    assert built["runtime-cpu"].base == local.DEBIAN and built["runtime-cpu"].args["FLAVOR"] == "cpu"
    assert built["runtime"].base is None and built["runtime"].args == {}
    pinned = f"nvidia/cuda:13.0.2-runtime-ubuntu24.04@sha256:{'0' * 64}"
    assert local.catalogue(cuda_base=pinned)["runtime"].args == {"BASE_IMAGE": pinned}
    for image in built.values():
        if image.lock:
            assert (REPO / image.lock).is_file() and image.lock.endswith(image.args.get("LOCK", "requirements.txt"))
    for name in ("FLAVOR", "LOCK", "BASE_IMAGE"):
        assert name in build_args(DOCKERFILES["runtime"])


def oci_image(tar: Path) -> tuple[dict, list[str]]:
    """The image config of a one-image OCI tar, and every path in its layers (headers only: fast)."""
    with tarfile.open(tar) as outer:
        def blob(digest: str):
            return outer.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")

        index = json.load(outer.extractfile("index.json"))
        manifest = json.load(blob(index["manifests"][0]["digest"]))
        config = json.load(blob(manifest["config"]["digest"]))
        paths = []
        for layer in manifest["layers"]:
            assert layer["mediaType"].endswith("tar"), f"{tar}: {layer['mediaType']} (make images writes uncompressed)"
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r:") as inner:
                paths += [m.name.removeprefix("./") for m in inner]
    return config, paths


def built(key: str) -> Path:
    tar = local.tar_path(key)
    if not tar.is_file():
        pytest.skip(f"{tar} not built: run `make images`")
    return tar


def test_built_operator_image() -> None:
    config, paths = oci_image(built("operator"))
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Entrypoint"] == ["python", "-m", "kuberl_operator"]
    assert "opt/kuberl/bin/python" in paths and "usr/bin/python3.11" in paths
    assert not [p for p in paths if re.search(r"site-packages/(torch|ray|vllm|transformers)/", p)]


def test_built_cpu_runtime_image() -> None:
    config, paths = oci_image(built("runtime-cpu"))
    env = dict(e.split("=", 1) for e in config["config"]["Env"])
    assert config["config"]["User"] == "1000:100" and env["HOME"] == "/home/ray"
    assert env["PATH"].startswith("/opt/kuberl/bin:")
    assert not [k for k in env if k.startswith(("CUDA", "NVIDIA", "NV_"))], env
    site = "opt/kuberl/lib/python3.11/site-packages"
    assert f"{site}/torch/__init__.py" in paths and f"{site}/ray/__init__.py" in paths
    assert not [p for p in paths if p.startswith(f"{site}/vllm") or p.startswith("usr/local/cuda")]
    for needed in ("usr/bin/wget", "etc/profile.d/kuberl.sh", "home/ray", "usr/bin/gcc"):
        assert needed in paths, needed


def test_built_pause_image() -> None:
    config, paths = oci_image(built("pause"))
    assert config["config"]["Entrypoint"] == ["/pause"] and config["config"]["User"] == "65535:65535"
    assert paths == ["pause"]
