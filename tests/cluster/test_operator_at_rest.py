"""At rest the operator costs the API server nothing per job: it reads from its watch-backed cache and writes
only what changed (docs/operator.md, "Reads from a cache"). Counted from the API server's audit log."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from localkube.api import CONFIGMAPS, JOBS, RLTJ, Api
from localkube.stack import Cluster

from .conftest import OPERATOR_USER
from .jobs import describe, manifest, status
from .operator_process import OperatorProcess
from .rbac import requests_between
from .waits import wait_for

pytestmark = pytest.mark.netns
JOBS_AT_REST, REST_S = 2, 30.0


@pytest.fixture
def tuned(operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The session's operator, restarted with the default Secret probe (15 min) for this test; as before after."""
    yield operator
    operator.stop()
    operator.resync_seconds, operator.secret_probe_seconds = 2, None
    operator.start()


def restart(operator: OperatorProcess, resync_s: float) -> None:
    operator.stop()
    operator.resync_seconds, operator.secret_probe_seconds = resync_s, 900
    operator.start()


def test_at_rest_the_operator_sends_nothing_and_a_deleted_child_is_seen_through_its_watch(
    cluster: Cluster, ns: Api, tuned: OperatorProcess, job_name: str
) -> None:
    restart(tuned, 2)  # a level-triggered pass every 2 s over each job, and nothing to send
    names = [f"{job_name}-{i}" for i in range(JOBS_AT_REST)]
    for name in names:
        ns.create(RLTJ, manifest(name), strict=True)
    ctx = lambda: "".join(describe(ns, n) for n in names) + tuned.tail(30)  # noqa: E731
    wait_for(lambda: all(status(ns, n).get("phase") == "Running" for n in names), 120, "all Running", ctx)
    time.sleep(3)  # the last events of the start settle
    offset = cluster.audit_log.stat().st_size
    time.sleep(REST_S)
    sent = requests_between(cluster.audit_log, OPERATOR_USER, offset, namespace=ns.namespace)
    passes = REST_S / tuned.resync_seconds
    print(f"at rest: {JOBS_AT_REST} jobs, {passes:.0f} passes each in {REST_S:.0f}s, requests in their namespace "
          f"{dict(sent) or 'none'}")
    assert not sent, sent  # before the cache: about eight GETs per job and pass (issue 29)

    # Resync only every 10 minutes: what comes back within seconds came through the child's watch.
    restart(tuned, 600)
    time.sleep(3)
    spec, driver = f"{names[0]}-spec", f"{names[0]}-driver"
    old = ns.get(CONFIGMAPS, spec)["metadata"]["uid"]
    t0 = time.monotonic()
    ns.delete(CONFIGMAPS, spec)
    back = wait_for(lambda: (c := ns.get(CONFIGMAPS, spec)) and c["metadata"]["uid"] != old and c, 10,
                    "the spec ConfigMap made anew", ctx)
    seen_s = time.monotonic() - t0
    ns.delete(JOBS, driver, body={"propagationPolicy": "Background"})
    wait_for(lambda: (j := ns.get(JOBS, driver)) and not j["metadata"].get("deletionTimestamp"), 15,
             "the driver Job made anew", ctx)
    print(f"a hand-deleted ConfigMap was made anew after {seen_s:.1f}s (resync every 600 s)")
    assert back["data"] and seen_s < 10
