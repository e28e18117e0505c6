"""The leader election's rules (leader.py): who may take the Lease, and what is written; the real contest between
replicas is tests/cluster/test_operator_ha.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kuberl_operator.cli import lease_seconds
from kuberl_operator.leader import VERSION_ANNOTATION, Observer, Terms, lease_body, micro_time

ME = Terms("kuberl-system", "kuberl", "pod-a_1", duration_s=15)
NOW = datetime(2026, 12, 6, 12, 0, 0, 123456, tzinfo=UTC)


def lease(holder: str | None, renew: str = "2026-12-06T11:59:59.000000Z", rv: str = "7", transitions: int = 2) -> dict:
    return {"metadata": {"name": "kuberl", "namespace": "kuberl-system", "resourceVersion": rv},
            "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": 15,
                     "acquireTime": "2026-12-06T11:00:00.000000Z", "leaseTransitions": transitions}}


def test_timing_follows_the_duration() -> None:
    assert (ME.renew_every_s, ME.give_up_after_s, ME.retry_every_s) == (5, 10, 2)
    assert ME.give_up_after_s < ME.duration_s, "the leader stops acting before a peer may take over"
    assert Terms("n", "l", "i", duration_s=3).retry_every_s == 0.5


@pytest.mark.parametrize("seen", [None, lease(None), lease(""), lease(ME.identity)])
def test_an_absent_released_or_own_lease_is_taken_at_once(seen: dict | None) -> None:
    observer = Observer()
    observer.see(seen, now=100.0)
    assert observer.may_take(ME, now=100.0)


def test_a_peers_lease_is_taken_only_after_a_whole_duration_unchanged_on_our_clock() -> None:
    observer = Observer()
    observer.see(lease("pod-b_2"), now=100.0)
    assert not observer.may_take(ME, now=114.9)
    observer.see(lease("pod-b_2"), now=114.9)  # the same record: no news from the holder
    assert observer.may_take(ME, now=115.0)


def test_a_renewal_restarts_the_wait_whatever_the_peers_clock_says() -> None:
    observer = Observer()
    observer.see(lease("pod-b_2", renew="2020-01-01T00:00:00.000000Z"), now=100.0)  # a renewTime long past
    assert not observer.may_take(ME, now=101.0), "a peer's timestamp never counts: its clock may be skewed"
    observer.see(lease("pod-b_2", renew="2020-01-01T00:00:05.000000Z", rv="8"), now=110.0)
    assert not observer.may_take(ME, now=124.0)
    assert observer.may_take(ME, now=125.0)
    assert observer.holder == "pod-b_2"


def test_taking_a_peers_lease_moves_acquire_time_and_transitions_and_guards_the_write() -> None:
    body = lease_body(ME, lease("pod-b_2"), NOW, ME.identity)
    assert body["metadata"]["resourceVersion"] == "7", "a write over a changed Lease must fail (409)"
    assert body["metadata"]["annotations"][VERSION_ANNOTATION]
    assert body["spec"] == {"holderIdentity": ME.identity, "leaseDurationSeconds": 15, "acquireTime": micro_time(NOW),
                            "renewTime": "2026-12-06T12:00:00.123456Z", "leaseTransitions": 3}


def test_renewing_keeps_acquire_time_and_transitions() -> None:
    spec = lease_body(ME, lease(ME.identity), NOW, ME.identity)["spec"]
    assert (spec["acquireTime"], spec["leaseTransitions"], spec["renewTime"]) == (
        "2026-12-06T11:00:00.000000Z", 2, micro_time(NOW))


def test_creating_the_lease_starts_at_no_transitions() -> None:
    body = lease_body(ME, None, NOW, ME.identity)
    assert "resourceVersion" not in body["metadata"]
    assert body["spec"]["leaseTransitions"] == 0 and body["spec"]["holderIdentity"] == ME.identity


def test_releasing_clears_the_holder() -> None:
    spec = lease_body(ME, lease(ME.identity), NOW, None)["spec"]
    assert spec["holderIdentity"] is None and spec["leaseDurationSeconds"] == 1


@pytest.mark.parametrize("text,ok", [("3", True), ("300", True), ("2", False), ("301", False)])
def test_lease_seconds_are_bounded(text: str, ok: bool) -> None:
    import argparse

    if ok:
        assert lease_seconds(text) == int(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="3 to 300"):
            lease_seconds(text)
