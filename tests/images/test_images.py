"""The Dockerfiles, checked without a Docker engine: what they copy exists and is in the build
context, versions are pinned by documented build args, and the pins agree with the rest of the project."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
DOCKERFILES = {"operator": IMAGES / "operator" / "Dockerfile", "runtime": IMAGES / "runtime" / "Dockerfile"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


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


def copy_sources(inst: Instruction) -> list[str]:
    """Sources of a COPY/ADD from the build context ([] for COPY --from=stage)."""
    args = inst.args
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
    matches = sorted(REPO.glob(source.rstrip("/"))) if any(ch in source for ch in "*?[") else [REPO / source.rstrip("/")]
    return [m for m in matches if m.exists()]


@pytest.mark.parametrize("image", DOCKERFILES)
def test_every_copied_file_exists_and_is_in_the_context(image: str) -> None:
    dockerfile = DOCKERFILES[image]
    patterns = dockerignore(dockerfile)
    copies = [(inst, src) for inst in instructions(dockerfile) if inst.keyword in {"COPY", "ADD"}
              for src in copy_sources(inst)]
    assert copies, f"{dockerfile} copies nothing from the context"
    for inst, source in copies:
        assert not source.startswith(("/", "..")), f"line {inst.line}: {source} is outside the build context"
        found = context_files(source)
        assert found, f"{dockerfile.relative_to(REPO)}:{inst.line}: COPY {source}: no such file in the repository"
        for path in found:
            rel = str(path.relative_to(REPO))
            assert not ignored(rel, patterns), f"{dockerfile.relative_to(REPO)}:{inst.line}: {rel} is excluded by .dockerignore"
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
        assert f"| `{name}` | `{default}` |" in readme, f"images/README.md: no row for build arg {name} (default {default})"
        assert name in header.split("\nARG ", 1)[0], f"{name} is not named in the Dockerfile's comment header"


def requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0].lower().replace("_", "-")


def pin(extra: str, package: str) -> str:
    for req in PYPROJECT["project"]["optional-dependencies"][extra]:
        if requirement_name(req) == package:
            return req.split("==", 1)[1]
    raise AssertionError(f"pyproject's {extra} extra does not pin {package}")


def test_operator_image_installs_only_the_operator_extra() -> None:
    text = DOCKERFILES["operator"].read_text()
    installs = [i.args for i in instructions(DOCKERFILES["operator"]) if i.keyword == "RUN" and "pip install" in i.args]
    assert installs and all("[operator]" in run for run in installs)
    assert not re.search(r"\[(?:[^\]]*,)?\s*(runtime|dev)\b", text), "the operator image must not install the runtime or dev extra"
    assert "torch" not in "".join(installs)


def test_operator_extra_pulls_in_no_torch() -> None:
    from images.constraints import closure

    deps = closure("operator")
    assert "kopf" in deps
    heavy = {"torch", "ray", "transformers", "vllm", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13"} & set(deps)
    assert not heavy, f"kuberl[operator] pulls in {heavy}"


def test_operator_constraints_agree_with_pyproject() -> None:
    lines = [l for l in (IMAGES / "operator" / "constraints.txt").read_text().splitlines() if l and not l.startswith("#")]
    pins = dict(l.split("==", 1) for l in lines)
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9.-]*", n) for n in pins), "one `name==version` per line"
    for req in PYPROJECT["project"]["optional-dependencies"]["operator"] + PYPROJECT["project"]["dependencies"]:
        name = requirement_name(req)
        assert name in pins, f"constraints.txt lacks {name}: regenerate it (images/README.md)"
        if "==" in req:
            assert pins[name] == req.split("==", 1)[1], f"{name}: constraints.txt {pins[name]} != pyproject {req}"


def test_runtime_pins_agree_with_pyproject() -> None:
    args = build_args(DOCKERFILES["runtime"])
    assert args["RAY_VERSION"] == pin("runtime", "ray")
    assert args["TRANSFORMERS_VERSION"] == pin("runtime", "transformers")
    # The image tests what CI tests: pyproject's torch, which the venv CI builds installs (Makefile).
    assert args["TORCH_VERSION"] == pin("runtime", "torch")
    assert f"'torch=={args['TORCH_VERSION']}'" in (REPO / "Makefile").read_text()
    assert "torch==${TORCH_VERSION}" in DOCKERFILES["runtime"].read_text()


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
    assert uid > 0 and (uid, gid) == (values["podSecurityContext"]["runAsUser"], values["podSecurityContext"]["runAsGroup"])


def test_image_names_agree_with_the_chart_and_the_operator() -> None:
    from kuberl_operator import builders

    values = yaml.safe_load((REPO / "charts" / "kuberl" / "values.yaml").read_text())
    version = PYPROJECT["project"]["version"]
    assert builders.DEFAULT_IMAGE == f"{values['runtimeImage']['repository']}:{version}"
    makefile = (REPO / "Makefile").read_text()
    for image, dockerfile in DOCKERFILES.items():
        assert f"-f {dockerfile.relative_to(REPO)} -t $(REGISTRY)/kuberl-{image}:$(VERSION)" in makefile
    assert values["image"]["repository"].endswith("/kuberl-operator")


def test_operator_entrypoint_exists() -> None:
    entry = [i.args for i in instructions(DOCKERFILES["operator"]) if i.keyword == "ENTRYPOINT"][-1]
    assert json.loads(entry) == ["python", "-m", "kuberl_operator"]
    assert (REPO / "operator" / "kuberl_operator" / "__main__.py").is_file()
