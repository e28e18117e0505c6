"""The other side of a colocated role's restart (docs/operator.md, Colocated roles): the host's process dies and
only it restarts; its guests' processes and Ray actor IDs stay, and so does the set's placement group (on
Kubernetes: the shared pods), which the host's new actor goes back into."""

from __future__ import annotations

from .test_colocation import run_killing


def test_killed_host_recovers_alone_and_its_guests_keep_their_processes(ray_session, tmp_path):
    driver, records, before, after, placed, placed_after = run_killing("actor", tmp_path, steps=3)
    assert after["actor"] != before["actor"] and after["actor"][0][0] != before["actor"][0][0]
    for role in ("critic", "ref", "reward"):
        assert after[role] == before[role], f"{role} was disturbed by its host's failure"
        assert driver.history[role].recoveries == []
    (rec,) = driver.history["actor"].recoveries
    assert rec.step == 2 and "died" in rec.detail
    assert placed_after["placement_group"] == placed["ref"]["placement_group"]
    assert placed_after["gpu_ids"] == placed["ref"]["gpu_ids"]
    assert driver.step == 3 and records[-1].flat()["restarts_actor"] == 1
    assert records[-1].flat()["restarts_ref"] == records[-1].flat()["restarts_critic"] == 0
