"""`kuberl run`'s --fault flags: one parser with a typed result, and the one check that faults need the Ray backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from kuberl.cli import main
from kuberl.run import FaultFlag, UsageError, apply_overrides, build_driver, parse_fault, require_ray_backend
from kuberl.spec import load_manifest

QUICKSTART = str(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")
NEEDS_RAY = "fault injection kills worker processes: it needs --backend ray"


def test_parse_fault_gives_a_typed_flag() -> None:
    flag = parse_fault("critic:3")
    assert flag == FaultFlag("critic", 3, "kill") and (flag.role, flag.step, flag.mode) == ("critic", 3, "kill")
    assert parse_fault("ref:2:stop") == ("ref", 2, "stop")
    for bad in ("critic", "critic:x", "critic:3:boom", "a:1:kill:2"):
        with pytest.raises(UsageError, match=f"--fault '{bad}': expected ROLE:STEP or ROLE:STEP:MODE"):
            parse_fault(bad)


def test_overrides_take_parsed_flags_or_their_text_alike() -> None:
    job = load_manifest(QUICKSTART)
    parsed = apply_overrides(job, 8, [parse_fault("critic:3"), parse_fault("actor:5:hang")])
    assert parsed == apply_overrides(job, 8, ["critic:3", "actor:5:hang"])
    assert [(f.role, f.step) for f in parsed.spec.resilience.faults] == [("critic", 3), ("actor", 5)]


def test_the_driver_gets_each_fault_with_its_flags_mode(tmp_path: Path) -> None:
    """A fault in the spec file has no flag: it kills; a flag's mode reaches its fault (no Ray is started)."""
    from kuberl.controller.driver import Fault

    flags = [parse_fault("ref:2:hang")]
    job = apply_overrides(load_manifest(QUICKSTART, ["resilience.faults=[{role: critic, step: 3}]"]), 4, flags)
    driver = build_driver(job, tmp_path, "ray", "cpu", flags, progress=False)
    assert driver.roles.faults == [Fault("critic", 3, "kill"), Fault("ref", 2, "hang")]
    with pytest.raises(UsageError, match=NEEDS_RAY):
        build_driver(job, tmp_path, "local", "cpu", flags, progress=False)


def test_faults_need_the_ray_backend() -> None:
    job = apply_overrides(load_manifest(QUICKSTART), None, ["critic:2"])
    require_ray_backend("ray", job.spec)
    require_ray_backend("local", load_manifest(QUICKSTART).spec)
    with pytest.raises(UsageError, match=NEEDS_RAY):
        require_ray_backend("local", job.spec)


def test_run_with_a_fault_and_the_local_backend_is_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", QUICKSTART, "--backend", "local", "--fault", "critic:2", "--out", str(tmp_path / "out")])
    assert code == 1 and capsys.readouterr().err.strip() == f"error: {NEEDS_RAY}"
    assert not (tmp_path / "out").exists()
    code = main(["run", QUICKSTART, "--fault", "critic", "--out", str(tmp_path / "out")])
    assert code == 1 and "error: --fault 'critic': expected ROLE:STEP" in capsys.readouterr().err
