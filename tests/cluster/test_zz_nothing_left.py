"""Runs last among the real-cluster tests (file order): the suite cleans up after itself (issue 29, item 4).

No RLTrainingJob is left in any namespace for the session's operator to keep working on, and that operator, with
nothing to do, is at rest: counted from the API server's audit log, it sends almost nothing (its watches stay open).
Once, 24 jobs were left behind, and the operator sent about 93 requests a second for the rest of the suite.
"""

from __future__ import annotations

import time

import pytest
from localkube.api import RLTJ, Api
from localkube.stack import Cluster

from .conftest import OPERATOR_USER
from .operator_process import OperatorProcess
from .rbac import requests_between

pytestmark = pytest.mark.netns
REST_S, AT_MOST = 20.0, 2  # a watch that the API server closes (after 30-60 min) and kopf reopens: one request


def test_no_job_is_left_and_the_operator_is_at_rest(cluster: Cluster, admin: Api, operator: OperatorProcess) -> None:
    left = [f"{j['metadata']['namespace']}/{j['metadata']['name']}" for j in admin.list(RLTJ, namespace=None)]
    assert not left, f"jobs left by the tests before this one: {left}"
    offset = cluster.audit_log.stat().st_size
    time.sleep(REST_S)
    sent = requests_between(cluster.audit_log, OPERATOR_USER, offset)
    print(f"the operator with no job, {REST_S:.0f}s: {dict(sent) or 'no request'}")
    assert sum(sent.values()) <= AT_MOST, sent
