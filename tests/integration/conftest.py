"""Shared fixtures for runtime integration tests: one Ray session (Ray takes seconds to start on 2 cores)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kuberl.spec import RLTrainingJob, validate_manifest

REPO = Path(__file__).resolve().parents[2]
EXTRA_ROLES = ("rules",)  # the extra roles of the examples (examples/remax.yaml)


@pytest.fixture(scope="session")
def ray_session(netns):
    """A local Ray bound to 127.0.0.1 with every role's resource, shared by the whole session."""
    from kuberl.run import quiet_local_ray

    quiet_local_ray()  # before ray is imported: loopback only, no notices
    ray = pytest.importorskip("ray")
    from kuberl.spec import ROLES, role_resource

    # num_gpus: GPUs Ray can hand out (none exist here), for the colocation tests' fractional requests;
    # workers run on device cpu whatever Ray reserved for them
    ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=8, num_gpus=2, include_dashboard=False,
             configure_logging=False, resources={role_resource(r): 16.0 for r in (*ROLES, *EXTRA_ROLES)})
    yield ray
    ray.shutdown()


def load_example(name: str, **overrides: Any) -> RLTrainingJob:
    """An example manifest with dotted-path overrides, e.g. {"trainer.steps": 4}."""
    obj = yaml.safe_load((REPO / "examples" / name).read_text())
    for dotted, value in overrides.items():
        node = obj["spec"]
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return validate_manifest(obj)
