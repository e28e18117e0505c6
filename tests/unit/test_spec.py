"""The spec model: defaults, field-named errors with fixes, cross-field rules, CRD drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kuberl.spec import SpecInvalid, crd_yaml, enabled_roles, generate_crd, parse_yaml, validate_manifest

REPO = Path(__file__).resolve().parents[2]


def manifest(**spec) -> dict:
    base = {"data": {"task": "repeat-letter"}, "reward": {"function": "kuberl.rewards.builtin:repeat_letter"}}
    base.update(spec)
    return {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLTrainingJob", "metadata": {"name": "t"}, "spec": base}


def errors_of(obj) -> list[str]:
    with pytest.raises(SpecInvalid) as info:
        validate_manifest(obj)
    return [str(e) for e in info.value.errors]


def test_minimal_manifest_gets_defaults() -> None:
    job = validate_manifest(manifest())
    assert job.spec.model.builtin == "tiny"
    assert job.spec.algorithm.name == "ppo" and job.spec.roles.actor.max_restarts == 3
    assert enabled_roles(job.spec) == ["actor", "critic", "ref", "reward"]


def test_hub_model_does_not_get_builtin_default() -> None:
    job = validate_manifest(manifest(model={"hub": "Qwen/Qwen2-0.5B"}))
    assert job.spec.model.builtin is None and job.spec.model.hub == "Qwen/Qwen2-0.5B"


@pytest.mark.parametrize(
    "spec, field, words",
    [
        ({"roles": {"actor": {"gpus": -1}}}, "spec.roles.actor.gpus", "must be >= 0"),
        ({"trainer": {"steps": "many"}}, "spec.trainer.steps", "must be an integer"),
        ({"trainer": {"bogus": 1}}, "spec.trainer.bogus", "not a known field"),
        ({"rollout": {"engine": "tgi"}}, "spec.rollout.engine", "must be one of"),
        ({"reward": {"function": "not a path"}}, "spec.reward.function", "import path"),
        ({"algorithm": {"name": "grpo", "groupSize": 1}}, "spec.algorithm.groupSize", "must be >= 2 for grpo"),
        ({"roles": {"actor": {"gpus": 4}}, "rollout": {"tensorParallelSize": 3}}, "spec.rollout.tensorParallelSize",
         "must divide spec.roles.actor.gpus (4)"),
        ({"trainer": {"miniBatchSize": 5}}, "spec.trainer.miniBatchSize", "must divide the samples per step"),
        ({"data": {"task": "repeat-letter", "files": ["a.jsonl"]}}, "spec.data", "either task or files"),
        ({"data": {"files": ["a.csv"]}}, "spec.data.files", ".jsonl or .parquet"),
        ({"roles": {"actor": {"resources": {"memory": "lots"}}}}, "spec.roles.actor.resources.memory",
         "Kubernetes quantity"),
        ({"algorithm": {"kl": {"controller": "adaptive"}}}, "spec.algorithm.kl.target", "required"),
        ({"reward": {"function": "kuberl.rewards.builtin:repeat_letter", "overlong": {"buffer": 16}},
          "rollout": {"maxNewTokens": 16}}, "spec.reward.overlong.buffer", "must be below rollout.maxNewTokens (16)"),
        ({"algorithm": {"lossAggregation": "seq-mean"}}, "spec.algorithm.lossAggregation", "must be one of"),
        ({"algorithm": {"tis": "on"}, "rollout": {"engine": "vllm", "temperature": 0.7},
          "roles": {"actor": {"gpus": 1}}}, "spec.algorithm.tis", "needs rollout.temperature 1 with engine vllm"),
        ({"algorithm": {"name": "grpo", "groupSize": 4, "dynamicSampling": {}}, "rollout": {"engine": "vllm"},
          "roles": {"actor": {"gpus": 1}}}, "spec.algorithm.dynamicSampling", "needs rollout.sleepMode false"),
        ({"reward": {"function": "kuberl.rewards.builtin:repeat_letter", "overlong": {"buffer": 4}},
          "rollout": {"fixedLength": True}}, "spec.reward.overlong", "penalises every response"),
        ({"algorithm": {"dynamicSampling": {}}}, "spec.algorithm.dynamicSampling",
         "needs several responses per prompt"),
        ({"algorithm": {"name": "grpo", "groupSize": 4, "dynamicSampling": {"maxRounds": 2}},
          "rollout": {"asynchronous": True}}, "spec.algorithm.dynamicSampling", "not supported with rollout.asynch"),
        ({"algorithm": {"name": "grpo", "groupSize": 4, "dynamicSampling": {"maxRounds": 2}},
          "rollout": {"async": {}}}, "spec.algorithm.dynamicSampling", "not supported with rollout.async ("),
        ({"roles": {"actor": {"resources": {"cpu": "2 cores"}}}}, "spec.roles.actor.resources.cpu",
         "not a Kubernetes quantity"),
        ({"data": {"task": "repeat-letter", "batchSize": 3}, "roles": {"actor": {"gpus": 2}}},
         "spec.roles.actor.replicas", "2 ranks"),
        ({"roles": {"actor": {"gpus": 4}}}, "spec.trainer.miniBatchSize",
         "actor's ranks x trainer.microBatchSize (4 x 8)"),
        ({"trainer": {"checkpoint": {"volumeClaim": "Bad_Name"}}}, "spec.trainer.checkpoint.volumeClaim", "must match"),
        ({"trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "ckpt"}}}, "spec.trainer.checkpoint.path",
         "absolute path"),
        ({"placement": {"deviceClass": "GPU Class"}}, "spec.placement.deviceClass", "must match"),
        ({"image": ""}, "spec.image", "at least 1"),
        ({"data": {"task": "repeat-letter", "batch_size": 8}}, "spec.data.batch_size", "did you mean batchSize?"),
        ({"trainer": {"actor_lr": 0.1}}, "spec.trainer.actor_lr", "did you mean actorLr?"),
        ({"trainer": {"stepz": 3}}, "spec.trainer.stepz", "did you mean steps?"),
        ({"roles": {"actor": {"max_restarts": 1}}}, "spec.roles.actor.max_restarts", "did you mean maxRestarts?"),
        ({"data": {"task": "repeat-letter", "eval": {"intervall": 3}}}, "spec.data.eval.intervall",
         "did you mean interval?"),
        ({"data": {"files": ["a.jsonl"], "eval": {}}}, "spec.data.eval", "built-in held-out split exists only"),
        ({"data": {"task": "repeat-letter", "eval": {"files": ["x.csv"]}}}, "spec.data.eval.files",
         ".jsonl or .parquet"),
        ({"tracking": {"wandb": {}}}, "spec.tracking.wandb.project", "required"),
        ({"resilience": {"callTimeoutSeconds": float("inf")}}, "spec.resilience.callTimeoutSeconds", "finite number"),
        ({"trainer": {"actorLr": float("nan")}}, "spec.trainer.actorLr", "finite number"),
        ({"trainer": {"criticLr": float("-inf")}}, "spec.trainer.criticLr", "finite number"),
        ({"rollout": {"engine": "vllm", "asynchronous": True}}, "spec.rollout", "asynchronous needs engine hf"),
    ],
)
def test_errors_name_the_field_and_fix(spec, field, words) -> None:
    errs = errors_of(manifest(**spec))
    hit = [e for e in errs if e.startswith(field + ":")]
    assert hit, errs
    assert words in hit[0] and "(fix: " in hit[0]


def test_wrong_kind_and_version() -> None:
    bad = manifest()
    bad["kind"] = "Pod"
    assert errors_of(bad)[0].startswith("kind: must be RLTrainingJob")
    bad = manifest()
    bad["apiVersion"] = "kuberl.io/v1"
    assert errors_of(bad)[0].startswith("apiVersion: must be kuberl.io/v1alpha1")


def test_unparseable_yaml_names_line() -> None:
    with pytest.raises(SpecInvalid) as info:
        parse_yaml("spec:\n  a: [1,\n", "job.yaml")
    assert "line" in str(info.value) and "job.yaml" in str(info.value)


def test_crd_in_repo_matches_model() -> None:
    """Fails when crds/ drifts from the spec model: regenerate with `make crds`."""
    on_disk = (REPO / "crds" / "rltrainingjobs.kuberl.io.yaml").read_text()
    assert on_disk == crd_yaml(), "crds/ is stale: run `make crds`"


def test_crd_is_structural_and_accepts_examples() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    crd = generate_crd()
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["shortNames"] == ["rltj"] and version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    assert "$ref" not in text and "anyOf" not in text and "additionalProperties: false" not in text
    for example in sorted((REPO / "examples").glob("*.yaml")):
        obj = yaml.safe_load(example.read_text())
        jsonschema.Draft4Validator(_draft4(schema)).validate(obj)  # OpenAPI 3.0 bounds are draft-4 style
        validate_manifest(obj)


def _draft4(schema):
    """OpenAPI v3.0 'nullable'/'x-' keys are not JSON Schema; drop them for jsonschema's check."""
    if isinstance(schema, dict):
        out = {k: _draft4(v) for k, v in schema.items() if not k.startswith("x-") and k != "nullable"}
        if schema.get("nullable") and "type" in out:
            out["type"] = [out["type"], "null"]
        return out
    if isinstance(schema, list):
        return [_draft4(s) for s in schema]
    return schema


@pytest.mark.parametrize("text", ["a: [", "kind: Pod\napiVersion: v1\n", "- 1\n- 2\n",
                                  "apiVersion: kuberl.io/v1alpha1\nkind: RLTrainingJob\nspec:\n"
                                  "  roles: {actor: {gpus: -2}}\n"])
def test_validate_cli_never_tracebacks(tmp_path, text) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "kuberl.cli", "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("error: ")
    assert all(line.startswith("error: ") and "(fix: " in line for line in proc.stderr.splitlines())


def test_kubernetes_only_fields_are_optional() -> None:
    job = validate_manifest(manifest(image="registry.example.com/kuberl:1",
                                     trainer={"checkpoint": {"volumeClaim": "ckpt", "path": "/data/ckpt"}}))
    assert job.spec.image == "registry.example.com/kuberl:1"
    assert (job.spec.trainer.checkpoint.volume_claim, job.spec.trainer.checkpoint.path) == ("ckpt", "/data/ckpt")
    plain = validate_manifest(manifest(trainer={"checkpoint": {"path": "relative/dir"}}))  # no PVC: any path
    assert plain.spec.image is None and plain.spec.trainer.checkpoint.volume_claim is None


def test_topology_domain_resource_name() -> None:
    from kuberl.spec.model import node_resource, role_resource

    assert node_resource("gpu-7.example.internal") == "kuberl_node_gpu-7.example.internal"
    assert role_resource("actor") == "kuberl_role_actor"


def test_crd_declares_the_status_the_operator_writes() -> None:
    status = generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert "x-kubernetes-preserve-unknown-fields" not in status  # undeclared fields would be pruned: declare them
    assert {"phase", "step", "totalSteps", "tokensPerSec", "restarts", "rayCluster", "rayClusterUID",
            "observedGeneration", "message", "conditions", "roles"} <= set(status["properties"])
    role = status["properties"]["roles"]["additionalProperties"]
    assert {"desired", "ready", "restarts", "podRestarts", "lastFailure", "worstLink", "members",
            "handledUIDs"} <= set(role["properties"])


def test_non_utf8_manifest_is_a_one_line_error(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"\x00\xff\xfe")
    proc = subprocess.run([sys.executable, "-m", "kuberl.cli", "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.startswith(f"error: {path}: is not UTF-8 text")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text, words, line", [
    ("spec:\n  data: {task: repeat-letter}\n  data: {task: gsm8k-toy}\n",
     "duplicate key 'data' (first given at line 2)", 3),
    ("a: &a [1,2,3,4,5,6,7,8,9]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
     "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n", "aliases expand the document past", 5),
    ("a: &x [1, *x]\n", "alias *x refers to the node that contains it", 1),
])
def test_yaml_refuses_duplicate_keys_and_alias_bombs(text: str, words: str, line: int) -> None:
    with pytest.raises(SpecInvalid) as info:
        parse_yaml(text, "job.yaml")
    msg = str(info.value)
    assert msg.startswith(f"job.yaml: is not valid YAML at line {line},") and words in msg and "(fix: " in msg


def test_yaml_keeps_merge_keys_and_modest_aliases() -> None:
    obj = parse_yaml("r: &r {cpu: '1'}\nactor: {resources: *r}\nbase: &b {x: 1}\nc:\n  <<: *b\n  x: 2\n")
    assert obj["actor"]["resources"] == {"cpu": "1"} and obj["c"] == {"x": 2}


def test_set_overrides_are_validated_like_the_file(tmp_path) -> None:
    from kuberl.spec import load_manifest

    path = REPO / "examples" / "quickstart.yaml"
    job = load_manifest(path, ["trainer.steps=10", "algorithm.kl.coef=0.02", "spec.data.eval={interval: 5}",
                               "metadata.name=qs2", 'roles.actor.resources.memory="3Gi"'])
    spec = job.spec
    assert (spec.trainer.steps, spec.algorithm.kl.coef, spec.data.eval.interval) == (10, 0.02, 5)
    assert job.metadata.name == "qs2"
    for sets, want in [(["trainer.stepz=3"], "spec.trainer.stepz: is not a known field (did you mean steps?)"),
                       (["trainer.steps=abc"], "spec.trainer.steps: must be an integer"),
                       (["trainer.steps"], "--set trainer.steps: is not PATH=VALUE"),
                       (["trainer.steps.x=1"], "its parent is not a mapping")]:
        with pytest.raises(SpecInvalid) as info:
            load_manifest(path, sets)
        assert want in str(info.value), str(info.value)
    proc = subprocess.run([sys.executable, "-m", "kuberl.cli", "validate", str(path), "--set", "trainer.batch_size=4"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.startswith("error: spec.trainer.batch_size: is not a known field")
