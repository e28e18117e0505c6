"""`kuberl render JOB.yaml` (every object the operator would create, no cluster) and `kuberl operator`."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kuberl.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ppo-gpu.yaml"
DRA_EXAMPLE = EXAMPLE.with_name("ppo-gpu-dra.yaml")


def test_render_prints_a_valid_yaml_stream(capsys: pytest.CaptureFixture[str], validator) -> None:
    assert main(["render", str(EXAMPLE), "--namespace", "ml", "--image", "runtime:2"]) == 0
    objs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [o["kind"] for o in objs] == ["ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "ConfigMap",
                                         "ConfigMap", "RayCluster", "Job"]
    for obj in objs:
        assert validator(obj) == [], obj["kind"]
        assert obj["metadata"]["namespace"] == "ml"
    cluster = objs[-2]
    assert [g["groupName"] for g in cluster["spec"]["workerGroupSpecs"]] == ["actor", "critic", "ref", "reward"]
    assert cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] == "runtime:2"
    assert capsys.readouterr().err == ""


def test_render_takes_the_operators_network_policy_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(EXAMPLE), "--metrics-from", "monitoring"]) == 0
    (policy,) = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "monitoring"]
    assert main(["render", str(EXAMPLE), "--no-network-policy"]) == 0
    assert "NetworkPolicy" not in [o["kind"] for o in yaml.safe_load_all(capsys.readouterr().out)]
    assert main(["render", str(EXAMPLE), "--metrics-from-cidr", "10.89.0.1/32"]) == 0
    (policy,) = [o for o in yaml.safe_load_all(capsys.readouterr().out) if o["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"][1]["from"] == [{"ipBlock": {"cidr": "10.89.0.1/32"}}]
    with pytest.raises(SystemExit):  # a host address with a prefix, or none at all: one line naming the flag
        main(["render", str(EXAMPLE), "--metrics-from-cidr", "10.89.0.1/24"])
    err = capsys.readouterr().err
    assert "--metrics-from-cidr" in err and "such as 10.0.0.0/24" in err and "Traceback" not in err


def test_render_says_when_checkpoints_do_not_survive_a_restart(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(EXAMPLE)]) == 0  # no spec.trainer.checkpoint.volumeClaim
    err = capsys.readouterr().err
    assert "do not survive a pod restart" in err
    assert "metrics.jsonl and reward_curve.png go to /kuberl/out in the driver pod, an emptyDir that vanishes" in err
    assert main(["render", str(DRA_EXAMPLE)]) == 0  # has one
    err = capsys.readouterr().err
    assert "do not survive" not in err and "vanishes" not in err
    assert ("metrics.jsonl and reward_curve.png go to /checkpoints/runs/ppo-gpu-dra, in folder kuberl/ppo-gpu-dra of "
            "the checkpoint volume") in err


def test_render_of_a_dra_job_has_claim_templates_the_workers_use(capsys: pytest.CaptureFixture[str], validator) -> None:
    assert main(["render", str(DRA_EXAMPLE), "-n", "ml"]) == 0
    objs = list(yaml.safe_load_all(capsys.readouterr().out))
    templates = [o for o in objs if o["kind"] == "ResourceClaimTemplate"]
    assert [t["metadata"]["name"] for t in templates] == ["ppo-gpu-dra-actor-gpus", "ppo-gpu-dra-critic-gpus",
                                                          "ppo-gpu-dra-ref-gpus"]
    for obj in objs:
        assert validator(obj) == [], (obj["kind"], validator(obj))
    (cluster,) = [o for o in objs if o["kind"] == "RayCluster"]
    claims = {g["groupName"]: g["template"]["spec"].get("resourceClaims") for g in cluster["spec"]["workerGroupSpecs"]}
    assert claims["actor"] == [{"name": "gpus",
                                "resourceClaimTemplateName": "ppo-gpu-dra-actor-gpus"}] and claims["reward"] is None


def test_render_refuses_a_placement_no_node_can_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = yaml.safe_load(DRA_EXAMPLE.read_text())
    manifest["spec"]["roles"]["actor"]["gpus"] = 12
    manifest["spec"]["roles"]["actor"]["replicas"] = 1
    manifest["spec"]["data"]["batchSize"] = 48
    manifest["spec"]["trainer"].update(miniBatchSize=48, microBatchSize=4)
    manifest["spec"]["rollout"]["tensorParallelSize"] = 1
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["render", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("error: spec.roles.actor.gpus: role actor needs 12 GPUs per replica")
    assert main(["render", str(path), "--max-gpus-per-node", "16"]) == 0


def test_invalid_manifest_names_fields_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = yaml.safe_load(EXAMPLE.read_text())
    bad["spec"]["roles"]["actor"]["gpus"] = -1
    bad["spec"]["trainer"]["miniBatchSize"] = 0
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert main(["render", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert any(line.startswith("error: spec.roles.actor.gpus: must be >= 0") and "(fix:" in line for line in lines)
    assert any("spec.trainer.miniBatchSize" in line for line in lines)


@pytest.mark.parametrize("text", ["spec: [unclosed", "apiVersion: v1\nkind: Pod\n"])
def test_broken_input_exits_1_with_one_line_and_no_traceback(tmp_path: Path, text: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    for target in (path, tmp_path / "missing.yaml"):
        proc = subprocess.run([sys.executable, "-m", "kuberl.cli", "render", str(target)], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 1 and proc.stdout == "" and proc.stderr.count("\n") == 1
        assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_operator_command_refuses_two_scopes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", "--namespace", "a", "--all-namespaces"]) == 2
    assert "error:" in capsys.readouterr().err


def test_render_is_deterministic_and_prints_no_secret(capsys: pytest.CaptureFixture[str]) -> None:
    """Two renders of one file are identical: the operator makes the Ray token's Secret, with a token of its own."""
    outs = []
    for _ in range(2):
        assert main(["render", str(EXAMPLE)]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    assert "Secret" not in [o["kind"] for o in yaml.safe_load_all(outs[0])]


def test_head_and_driver_pod_sizes_are_operator_settings(capsys: pytest.CaptureFixture[str]) -> None:
    """A small node (the local cluster's 2 cores) runs the head and driver smaller than the defaults."""
    assert main(["render", str(EXAMPLE), "--head-resources", "cpu=200m,memory=2Gi",
                 "--driver-resources", "cpu=250m,memory=1Gi"]) == 0
    objs = list(yaml.safe_load_all(capsys.readouterr().out))
    head = objs[-2]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]
    driver = objs[-1]["spec"]["template"]["spec"]["containers"][0]["resources"]
    for pod, (cpu, memory) in ((head, ("200m", "2Gi")), (driver, ("250m", "1Gi"))):
        for quantities in (pod["requests"], pod["limits"]):
            assert (quantities["cpu"], quantities["memory"]) == (cpu, memory) and len(quantities) == 3


@pytest.mark.parametrize("value", ["cpu=1", "cpu=1,memory=lots", "memory=1Gi,cpu=1,gpu=1"])
def test_a_bad_pod_size_is_one_line_naming_the_flag(value: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "kuberl.cli", "render", str(EXAMPLE), "--head-resources", value],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--head-resources" in proc.stderr and "Traceback" not in proc.stderr


def test_the_liveness_url_takes_the_pods_ip_as_the_downward_api_gives_it() -> None:
    from kuberl_operator.cli import liveness_url

    assert liveness_url("http://10.244.0.7:8081/healthz") == "http://10.244.0.7:8081/healthz"
    assert liveness_url("http://fd00:10:244::7:8081/healthz") == "http://[fd00:10:244::7]:8081/healthz"
    assert liveness_url("http://[fd00::7]:8081/healthz") == "http://[fd00::7]:8081/healthz"
    with pytest.raises(argparse.ArgumentTypeError, match="give http://HOST:PORT/PATH"):
        liveness_url("10.244.0.7")


def test_scratch_sizes_are_an_operator_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", str(EXAMPLE), "--scratch", "cache=100Gi"]) == 0
    objs = list(yaml.safe_load_all(capsys.readouterr().out))
    head = objs[-2]["spec"]["headGroupSpec"]["template"]["spec"]
    assert {v["name"]: v["emptyDir"]["sizeLimit"] for v in head["volumes"] if "emptyDir" in v} == {
        "tmp": "16Gi", "cache": "100Gi"}  # the rest at their defaults
    assert head["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "117Gi"  # 16 + 100 + 1 (logs)
    with pytest.raises(SystemExit):
        main(["render", str(EXAMPLE), "--scratch", "disk=1Gi"])
    assert "give some of tmp=<quantity>,cache=<quantity>" in capsys.readouterr().err
