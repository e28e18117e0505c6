"""The env role (spec.roles.env) in real pods: examples/agent.yaml with the built-in tool environment (`tools`, in the
runtime image; the example's own letter_env.py is not), on the real node.

The environments run in the RayCluster's `env` worker group: a CPU pod of its own, non-root, read-only, with no
ServiceAccount token, which the actor's pod calls directly over Ray. Its pod deleted during training, only the env
role restarts (a new pod; every other pod keeps its UID, their restarts stay 0), and the job completes: 162 s with
the real cluster's start, alone on the 2-core VM (2026-12-07). Its pod template is tests/operator/test_builders.py's.
The file's name sorts after test_node_lifecycle.py, which needs the network namespace before the package's real
cluster starts (one real node per namespace at a time).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

from tests.cluster.waits import wait_for
from tests.conftest import REPO

from .conftest import Kubectl
from .test_real_pods import INSIDE, describe, others_gone, pods_by_role, running, status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
JOB, ROLES = "agent", ("actor", "ref", "reward", "env")
DELETE_AT, STEPS = 10, 60


def agent_job() -> dict[str, Any]:
    """examples/agent.yaml with the built-in tool environment and the task's own reward (the tool environment gives
    none): a policy turn with no tool call ends its trajectory, so each takes one reset and one step on an env pod."""
    job = yaml.safe_load((REPO / "examples" / "agent.yaml").read_text())
    spec = job["spec"]
    spec["environment"] = {k: v for k, v in spec["environment"].items() if k != "class"} | {"module": "tools"}
    spec["reward"] = {"function": "repeat-letter"}
    spec["trainer"]["steps"] = STEPS
    spec["roles"]["env"]["replicas"] = 1
    return job


def all_up(k: Kubectl) -> dict[str, list[dict[str, Any]]] | None:
    pods = pods_by_role(k, JOB)
    return pods if all(r in pods and all(map(running, pods[r])) for r in ("head", "driver", *ROLES)) else None


def test_the_env_role_runs_in_its_own_pod_and_restarts_alone(installed: Kubectl) -> None:
    k = installed.in_namespace("env-role")
    wait_for(lambda: others_gone(k), 180, "the earlier jobs' pods gone", lambda: describe(k, ""), interval=2)
    k("create", "namespace", k.namespace)
    k.apply(agent_job())
    pods = wait_for(lambda: all_up(k), 420, "the head, the driver and one pod per role Running",
                    lambda: describe(k, JOB), interval=1)
    (env_pod,) = pods["env"]
    name = env_pod["metadata"]["name"]
    assert env_pod["spec"]["automountServiceAccountToken"] is False, env_pod["spec"]
    assert not any("nvidia.com/gpu" in c["resources"].get("limits", {}) for c in env_pod["spec"]["containers"])
    inside = {check: k.exec(name, *cmd) for check, cmd in INSIDE.items()}
    assert inside["uid"].stdout.strip() == "1000" and inside["token"].returncode != 0, inside
    assert inside["write"].returncode != 0 and "Read-only file system" in inside["write"].stderr, inside

    wait_for(lambda: (status(k, JOB).get("step") or 0) >= DELETE_AT, 600, f"step {DELETE_AT}",
             lambda: describe(k, JOB), interval=1)
    others = {p["metadata"]["uid"] for r, ps in pods_by_role(k, JOB).items() if r != "env" for p in ps}
    t0 = time.monotonic()
    k.delete("pod", name)

    def restarted() -> dict[str, Any] | None:
        st = status(k, JOB)
        return st if st.get("roles", {}).get("env", {}).get("restarts", 0) >= 1 else None

    st = wait_for(restarted, 400, "the env role's restart in the status", lambda: describe(k, JOB), interval=1)
    print(f"env pod deleted at step {DELETE_AT}: its restart in the status {time.monotonic() - t0:.1f}s later "
          f"(step {st.get('step')})")
    now = pods_by_role(k, JOB)
    assert others == {p["metadata"]["uid"] for r, ps in now.items() if r != "env" for p in ps}  # nobody else's pod
    assert name not in {p["metadata"]["name"] for p in now.get("env", [])}
    wait_for(lambda: status(k, JOB).get("phase") in ("Succeeded", "Failed"), 900, "the job to end",
             lambda: describe(k, JOB), interval=2)
    final = status(k, JOB)
    assert final["phase"] == "Succeeded", describe(k, JOB)
    assert final["roles"]["env"]["restarts"] == 1 and final["roles"]["env"]["podRestarts"] == 1, final["roles"]
    assert all(final["roles"][r]["restarts"] == 0 for r in ROLES if r != "env"), final["roles"]
    logs = k("logs", f"job/{JOB}-driver", timeout=60)
    assert "role env failed" in logs and "restarting env only" in logs, logs[-3000:]
    k.delete("rltj", JOB, wait=True)
