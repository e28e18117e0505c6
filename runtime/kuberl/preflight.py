"""Everything a run will need, checked before any process starts (`kuberl run`, `kuberl validate`).

The manifest has already passed the spec model. Here: the reward function imports and has a usable
signature; spec.environment's class imports and has reset and step; the data (and eval) files exist, are
readable, parse, and hold a non-empty text prompt under the prompt key in every row (and the answer key when the
reward takes the answer), and the training data holds at least one batch of prompts; the tracking packages the
spec asks for are installed; the models' tokenizers load, and a prompt plus its response fit the context of a
local or cached model; every other extension point named by an import path (advantage estimator, policy loss, KL
estimator, an extra role's worker class) resolves. Every problem is one line naming the field and the fix; all of
them are reported, not only the first.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from .spec import JobSpec


class PreflightFailed(ValueError):
    """One or more problems, each a one-line message starting with the spec field."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems

    def report(self) -> int:
        for problem in self.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1


def check_job(spec: JobSpec, manifest_dir: Path | None = None) -> list[dict[str, Any]]:
    """Raise PreflightFailed listing every problem; returns the training rows (for warnings about them).
    Import paths resolve as `python -m` resolves them from here (the current folder is importable), and from
    `manifest_dir` first, so a reward module may sit next to the manifest."""
    from kuberl.data.tasks import DataError, batch_problem, load_eval_rows, load_rows

    from .rewards import RewardImportError, add_import_dir, load_reward_fn

    add_import_dir(Path.cwd())  # as `python -m`: examples.remax's modules resolve from the repository root
    if manifest_dir is not None:
        add_import_dir(manifest_dir)  # first on the path
    problems: list[str] = []
    need_answer = ""
    if spec.reward.function:
        try:
            reward = load_reward_fn(spec.reward.function)
            need_answer = spec.reward.function if reward.needs_answer else ""
        except RewardImportError as exc:
            problems.append(str(exc))
    problems += environment_problems(spec)
    rows: list[dict[str, Any]] = []
    for load in (load_rows, load_eval_rows):
        try:
            got = load(spec.data, need_answer)
            if load is load_rows and (problem := batch_problem(spec.data, got)):
                problems.append(problem)
            rows = rows or got
        except DataError as exc:
            problems.append(str(exc))
    problems += tracking_problems(spec)
    if not problems:  # tokenizers and the registries (torch) are slow to import: only when nothing cheaper failed
        problems += model_problems(spec) + extension_problems(spec)
    if problems:
        raise PreflightFailed(problems)
    return rows


def environment_problems(spec: JobSpec) -> list[str]:
    """spec.environment's class: its module imports (from the manifest's folder first), the class is there and has
    reset(row) and step(action_text); a built-in is built (code_tools checks that its sandbox runs here)."""
    if spec.environment is None:
        return []
    from .envs import EnvironmentImportError, load_environment_class, make_environment

    try:
        if spec.environment.builtin:
            make_environment(spec.environment)
        else:
            load_environment_class(spec.environment.module, spec.environment.class_)
    except EnvironmentImportError as exc:
        return [str(exc)]
    return []


def output_problems(spec: JobSpec, out: Path) -> list[str]:
    """The run's outputs, before any worker starts: the output and checkpoint folders can be created and
    written, and the /metrics address and port can be bound."""
    from kuberl.resilience import checkpoint

    problems = []
    for path, field, fix in ((out, "--out", "pass a folder you can write"),
                             (checkpoint.root_for(spec, out), "spec.trainer.checkpoint.path",
                              "name a writable folder, e.g. on the checkpoint volume")):
        if problem := unwritable(path):
            problems.append(f"{field}: cannot write {path} ({problem}) (fix: {fix})")
            break  # the checkpoint folder defaults to one inside --out
    m = spec.trainer.metrics
    if m.prometheus_port is not None:
        if problem := unbindable(m.prometheus_address, m.prometheus_port):
            field = ("spec.trainer.metrics.prometheusPort (--metrics-port)" if "in use" in problem else
                     "spec.trainer.metrics.prometheusAddress (--metrics-address)")
            problems.append(f"{field}: cannot serve /metrics on {m.prometheus_address}:{m.prometheus_port} ({problem}) "
                            "(fix: a free port, or 0 for any; an IP address of this host, e.g. 127.0.0.1 or 0.0.0.0)")
    return problems


def gpu_problems(spec: JobSpec, gpus_here: int) -> list[str]:
    """Roles asking for more GPUs per replica than this host has (a local run: nothing would ever start)."""
    from .spec import enabled_roles

    out = []
    for role in enabled_roles(spec):
        want = spec.roles.get(role).gpus
        if want > gpus_here:
            field = f"spec.{spec.roles.path(role)}.gpus"
            out.append(f"{field}: {want} GPU(s) per replica, but this host has {gpus_here or 'none'} (fix: set it "
                       f"to 0 to run on CPU, or run on a host or cluster with the GPUs)")
    return out


def local_gpu_count() -> int:
    """NVIDIA GPUs this process may use: device nodes, narrowed by CUDA_VISIBLE_DEVICES (no CUDA import)."""
    import glob
    import os

    found = len(glob.glob("/dev/nvidia[0-9]*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    return min(found, len([v for v in visible.split(",") if v.strip() and v.strip() != "-1"]))


def unwritable(path: Path) -> str:
    """'' when `path` is a folder this process can write in, or can be created as one, else why not.
    Leaves nothing behind, so a refused run has created no folder: a missing `path` is tested by making
    and removing a folder in its nearest existing parent."""
    import os
    import tempfile

    path = path.absolute()
    nearest = path
    while not os.path.lexists(nearest):
        nearest = nearest.parent
    try:
        if nearest == path:
            with tempfile.TemporaryFile(dir=path):
                pass
        else:
            with tempfile.TemporaryDirectory(dir=nearest):
                pass
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return ""


def unbindable(address: str, port: int) -> str:
    """'' when a TCP server could listen on address:port now, else why not."""
    import socket

    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        return "not an address"
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind(sockaddr)
        except OSError as exc:
            return "the port is in use" if exc.errno == 98 else (exc.strerror or type(exc).__name__)
    return ""


def tracking_problems(spec: JobSpec) -> list[str]:
    """The tracking backends the spec asks for whose package is not installed."""
    out = []
    for name, wanted in (("mlflow", spec.tracking.mlflow), ("wandb", spec.tracking.wandb)):
        if wanted is not None and importlib.util.find_spec(name) is None:
            out.append(
                f"spec.tracking.{name}: the {name} package is not installed "
                f"(fix: pip install {name} into the runtime environment, or remove spec.tracking.{name})"
            )
    if spec.tracking.tensorboard and importlib.util.find_spec("tensorboardX") is None:
        out.append(
            "spec.tracking.tensorboard: the tensorboardX package is not installed "
            "(fix: pip install 'kuberl[runtime]', or set spec.tracking.tensorboard to false)"
        )
    return out


def extension_problems(spec: JobSpec) -> list[str]:
    """The algorithm's registry entries and the extra roles' worker classes that do not resolve."""
    from .algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
    from .registry import RegistryError
    from .workers import worker_class

    checks = [lambda: ADVANTAGE_ESTIMATORS.get(spec.algorithm.estimator),
              lambda: POLICY_LOSSES.get(spec.algorithm.policy_loss),
              lambda: KL_ESTIMATORS.get(spec.algorithm.kl.estimator),
              *(lambda role=role: worker_class(spec, role) for role in spec.roles.extra)]
    out = []
    for check in checks:
        try:
            check()
        except RegistryError as exc:
            out.append(str(exc))
    return out


def model_problems(spec: JobSpec) -> list[str]:
    out = [check_model_source(spec.model, "spec.model")]
    if spec.reward.model is not None and spec.reward.model.is_set():
        out.append(check_model_source(spec.reward.model, "spec.reward.model"))
    return [p for p in out if p] + context_lines(spec)


POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
"""The keys under which a Hugging Face config.json gives the model's context, in the order they are looked for."""


def model_positions(src) -> int | None:
    """The context (max positions) of a local path's or a cached hub model's config.json, or None where it is not
    known without a download or a model import (a hub model not in the cache, a config without such a key)."""
    import json

    if src.path:
        config = Path(src.path) / "config.json"
    elif src.hub:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(src.hub, "config.json")
        if not isinstance(cached, str):
            return None
        config = Path(cached)
    else:
        return None
    try:
        values = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(values, dict):
        return None
    found = [values[k] for k in POSITION_KEYS if type(values.get(k)) is int and values[k] > 0]
    return found[0] if found else None


def context_lines(spec: JobSpec) -> list[str]:
    """data.maxPromptLength + rollout.maxNewTokens beyond the context of a local or cached model (the spec model
    checks the built-ins')."""
    from .spec.model import context_problems

    limits = []
    for at, src in (("model", spec.model), ("reward.model", spec.reward.model)):
        if src is not None and (src.path or src.hub) and (positions := model_positions(src)) is not None:
            which = f"spec.{at}.path ({src.path})" if src.path else f"spec.{at}.hub ({src.hub})"
            limits.append((which, positions))
    return [f"spec.{field}: {message} (fix: {fix})" for field, message, fix in context_problems(spec, limits)]


def check_model_source(src, field: str) -> str:
    """'' when the model's tokenizer loads (a local path must exist; a hub id must resolve), else the problem."""
    if src.builtin:
        return ""
    if src.path and not Path(src.path).is_dir():
        return f"{field}.path: {src.path!r} is not a directory (fix: mount the model there or use hub)"
    from kuberl.training.models import load_tokenizer

    try:
        load_tokenizer(src)
    except (OSError, ValueError) as exc:
        where = f"{field}.hub" if src.hub else f"{field}.path"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            f"{where}: cannot load the tokenizer ({first}) "
            "(fix: check the id or path; offline, put the model in the Hugging Face cache)"
        )
    return ""


def warn_unknown_characters(spec: JobSpec, rows: list[dict[str, Any]]) -> None:
    """Once per run: which prompt characters the built-in tokenizer maps to <unk>, with their counts."""
    if not spec.model.builtin:
        return
    from kuberl.training.vocab import unknown_characters

    unknown = unknown_characters(r["prompt"] for r in rows)
    if unknown:
        shown = ", ".join(f"{c!r} x{n}" for c, n in unknown.most_common(8))
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        print(
            f"warning: the prompts hold {sum(unknown.values())} characters that the built-in tokenizer does not know "
            f"({shown}{more}); they become <unk> (it covers printable ASCII, newline and tab)",
            file=sys.stderr,
        )


def ignored_credentials(spec: JobSpec) -> str | None:
    """The note of a run on this machine for spec.credentials: Secrets of a namespace; here, the environment."""
    from .spec.model import CREDENTIALS

    named = [var for attr, (var, _) in CREDENTIALS.items() if getattr(spec.credentials, attr) is not None]
    if not named or all(os.environ.get(v) for v in named):
        return None
    return (f"note: spec.credentials names Kubernetes Secrets; on this machine {', '.join(named)} come from the "
            f"environment (export them to use them here)")


def ignored_placement(spec: JobSpec) -> str | None:
    """The one warning of a run on this machine for the roles' Kubernetes scheduling fields (nodeSelector,
    gpuProduct, tolerations, affinity, priorityClassName, runtimeClassName): they choose nodes, and here
    there is one, so they are ignored and the manifest runs as it is. None when no role sets any."""
    from .spec import enabled_roles

    used = [f"spec.{spec.roles.path(r)} ({', '.join(fields)})" for r in enabled_roles(spec)
            if (fields := spec.roles.get(r).constrained())]
    if not used:
        return None
    return (f"warning: {'; '.join(used)}: Kubernetes scheduling fields, ignored on this machine (they apply when "
            f"the operator runs the job)")
