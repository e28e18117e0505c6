"""Jobs the job policy refuses, with words of the refusal: one list for the admission policy on the real stack
(tests/cluster/test_job_policy.py) and the operator's own check (tests/operator/test_job_policy.py)."""

from __future__ import annotations

from typing import Any

# (spec fields, words of the refusal) under the chart's default jobPolicy
DEFAULT_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "/opt/kuberl"}}}, "must not be, or lie under"),
    ({"trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "/etc"}}}, "must not be, or lie under"),
    ({"trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "/mnt/../etc"}}}, "nor contain '..'"),
    ({"roles": {"critic": {"tolerations": [{"operator": "Exists"}]}}}, "tolerates every taint"),
    ({"roles": {"ref": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}}}, "control plane"),
]

# a platform's allow-lists, as chart values
STRICT = {"jobPolicy": {"enabled": True, "allowedImages": ["reg.example.com/ml/"], "allowedVolumeClaims": ["ckpt"],
                        "forbiddenMountPaths": ["/opt"], "allowedPriorityClasses": ["batch"],
                        "allowedRuntimeClasses": ["nvidia"], "allowedDeviceClasses": ["gpu.nvidia.com"],
                        "allowedCredentialSecrets": ["hf-token"], "allowWildcardTolerations": False}}
STRICT_ALLOWED: dict[str, Any] = {"image": "reg.example.com/ml/kuberl:1",
                                  "trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "/checkpoints"}},
                                  "credentials": {"huggingFace": {"name": "hf-token", "key": "token"}}}
STRICT_REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"image": "docker.io/evil/miner:1"}, "spec.image must start with one of reg.example.com/ml/"),
    ({"trainer": {"checkpoint": {"volumeClaim": "team-b-data"}}}, "volumeClaim must be one of ckpt"),
    ({"trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "/opt/x"}}}, "must not be, or lie under"),
    ({"roles": {"actor": {"priorityClassName": "system-cluster-critical"}}}, "priorityClassName must be one of"),
    ({"roles": {"extra": {"rules": {"worker": "examples.rule_engine:RuleEngineWorker", "runtimeClassName": "x"}}}},
     "runtimeClassName must be one of"),
    ({"placement": {"mode": "dra", "deviceClass": "any.example.com"}}, "deviceClass must be one of"),
    ({"credentials": {"huggingFace": {"name": "hf-token", "key": "t"}, "wandb": {"name": "db-password", "key": "p"}}},
     "spec.credentials.*.name must be one of hf-token"),
]
# within the default policy, though it sets every field the policy looks at
DEFAULT_ALLOWED: dict[str, Any] = {
    "trainer": {"checkpoint": {"volumeClaim": "ckpt", "path": "/mnt/ckpt"}},
    "roles": {"critic": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                         "priorityClassName": "batch", "runtimeClassName": "nvidia"},
              "extra": {"rules": {"worker": "examples.rule_engine:RuleEngineWorker"}}},
    "placement": {"mode": "dra", "deviceClass": "gpu.example.com"}, "image": "reg.example.com/kuberl:1"}
