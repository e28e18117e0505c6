"""A control flow of one's own (ReMax, examples/remax.py) and a role of one's own (the rule engine,
examples/rule_engine.py), on CPU with real Ray: own WorkerGroups and placement groups, restarts alone."""

from __future__ import annotations

import json

from examples.remax import remax
from kuberl.controller.driver import Driver
from kuberl.library import Fault
from kuberl.metrics import read_jsonl
from kuberl.metrics.progress import progress_of
from kuberl.workers.groups import RayWorkerGroup

from .conftest import load_example


def mean(records):
    return sum(r.reward_mean for r in records) / len(records)


def test_remax_program_learns_and_a_killed_rule_engine_restarts_alone(ray_session, tmp_path):
    spec = load_example("remax.yaml").spec
    records = remax(spec, lambda role: RayWorkerGroup(role, spec, timeout_s=120), tmp_path, faults=[Fault("rules", 5)])
    first, last = mean(records[:10]), mean(records[-10:])
    print(f"remax reward first10={first:.3f} last10={last:.3f} gain={last - first:.3f}")
    assert last - first >= 0.15
    assert [r.step for r in records] == list(range(1, spec.trainer.steps + 1))
    (rec,) = records[4].roles["rules"].recoveries
    assert rec.step == 5 and "died" in rec.detail and rec.restored_from == "model path"
    assert records[-1].roles["rules"].restarts == 1
    assert all(records[-1].roles[r].restarts == 0 for r in ("actor", "reward"))
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[4]["restarts_rules"] == 1 and rows[4]["recoveries"][0]["role"] == "rules"


def test_kuberl_run_gives_an_extra_role_its_own_group_placement_group_and_status(ray_session, tmp_path):
    spec = load_example("remax.yaml", **{"trainer.steps": 2}).spec
    driver = Driver(spec, "extra", tmp_path, lambda role: RayWorkerGroup(role, spec), progress=False)
    driver.start()
    try:
        assert list(driver.groups) == ["actor", "reward", "rules"]
        pids = {role: [i["pid"] for i in g.identities()] for role, g in driver.groups.items()}
        assert len({p for ps in pids.values() for p in ps}) == 3
        assert len({g.pg.id for g in driver.groups.values()}) == 3
        records = driver.run()
    finally:
        driver.shutdown()
    assert records[-1].flat()["restarts_rules"] == 0 and "memory_rules_rss_peak_bytes" in records[-1].flat()
    doc = json.loads(progress_of(records[-1], 2).to_json())
    assert doc["roles"]["rules"]["restarts"] == 0 and doc["roles"]["rules"]["replicas"] == 1  # its size, as it runs


def test_two_calls_in_flight_to_a_failed_role_cost_one_restart(ray_session, tmp_path):
    """Both futures see the dead rule engine; the first one waited on restarts it, the second replays
    on the new ranks without restarting it again."""
    import torch

    from examples.rule_engine import RuleEngine
    from kuberl.data.batch import Batch
    from kuberl.library import Roles

    spec = load_example("remax.yaml").spec
    responses = torch.randint(3, 20, (spec.samples_per_step, 4))
    batch = Batch({"responses": responses, "response_mask": torch.ones_like(responses, dtype=torch.float)})
    with Roles(spec, lambda role: RayWorkerGroup(role, spec, timeout_s=120), [Fault("rules", 1)]) as roles:
        rules = roles.proxy("rules", RuleEngine)
        roles.begin_step(1)
        first, second = rules.penalties.submit(batch), rules.penalties.submit(batch)  # the first one kills it
        a, b = first.result(), second.result()
    assert torch.equal(a["penalties"], b["penalties"]) and len(a) == len(batch)
    assert roles.history["rules"].restarts == 1 and len(first.recoveries) == 1 and second.recoveries == []
