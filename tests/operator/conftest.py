"""Fixtures for the operator's unit tests: KubeRay's and our CRD schemas, to validate what the builders make.

The operator's behaviour against an API server is tested on the real stack: tests/cluster/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .schemas import make_validator


@pytest.fixture(scope="session")
def kuberay_dir(shared_dir: Path) -> Path:
    path = shared_dir / "kuberay"
    if not (path / "ray.io_rayclusters.yaml").is_file():
        pytest.skip(f"{path}/ray.io_rayclusters.yaml is absent: RayClusters cannot be validated")
    return path


@pytest.fixture(scope="session")
def validator(kuberay_dir: Path):
    return make_validator(kuberay_dir)
