"""The platform's rules on what a job's author may choose, checked by the operator itself.

Creating an RLTrainingJob amounts to creating pods (docs/security.md). The chart's values `jobPolicy.*` say
which images, claims, mount paths, classes and tolerations a job may use. The chart's ValidatingAdmissionPolicy
(templates/job-policy.yaml) refuses a job that breaks them at admission; the operator checks the same rules
here, so that a cluster without the policy (`jobPolicy.enabled: false`, a Kubernetes before 1.30, the CRD
installed without the chart) still creates nothing for such a job. The messages are the policy's own.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kuberl.spec import ROLES, RLTrainingJob

CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
SYSTEM_PATHS = ("/bin", "/boot", "/dev", "/etc", "/home", "/kuberl", "/lib", "/lib64", "/opt", "/proc", "/root", "/run",
                "/sbin", "/sys", "/tmp", "/usr", "/var")


class JobPolicy(BaseModel):
    """The chart's `jobPolicy` (less `enabled`), as `kuberl operator --job-policy JSON` takes it. Empty lists
    allow any value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowedImages: tuple[str, ...] = Field((), description="Prefixes spec.image must start with.")
    allowedVolumeClaims: tuple[str, ...] = Field((), description="Claims spec.trainer.checkpoint.volumeClaim names.")
    forbiddenMountPaths: tuple[str, ...] = Field(SYSTEM_PATHS, description="Paths checkpoint.path may not be "
                                                                           "or lie under.")
    allowedPriorityClasses: tuple[str, ...] = ()
    allowedRuntimeClasses: tuple[str, ...] = ()
    allowedDeviceClasses: tuple[str, ...] = ()
    allowedCredentialSecrets: tuple[str, ...] = Field((), description="Secrets spec.credentials.* may name.")
    allowWildcardTolerations: bool = Field(False, description="Keyless tolerations, control-plane nodeSelectors.")


class PolicyInvalid(ValueError):
    """`--job-policy` is not a JobPolicy document."""


def parse(text: str) -> JobPolicy:
    """A JobPolicy from its JSON (the chart renders `jobPolicy` with toJson)."""
    try:
        return JobPolicy.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise PolicyInvalid(f"--job-policy: {str(exc).splitlines()[0]} (give the chart's jobPolicy as JSON, e.g. "
                            f'{{"allowedImages": ["registry.example.com/ml/"]}})') from None


def _under(path: str, forbidden: str) -> bool:
    return path == forbidden or path.startswith(forbidden if forbidden.endswith("/") else forbidden + "/")


def violations(job: RLTrainingJob, policy: JobPolicy) -> list[str]:
    """One line per rule the job breaks, naming the field and the value of the policy that forbids it."""
    spec, out = job.spec, []
    ckpt = spec.trainer.checkpoint
    roles = [spec.roles.get(r) for r in ROLES] + list(spec.roles.extra.values())
    if policy.allowedImages and spec.image is not None and not spec.image.startswith(policy.allowedImages):
        out.append(f"spec.image must start with one of {', '.join(policy.allowedImages)} (the chart's "
                   f"jobPolicy.allowedImages)")
    if policy.allowedVolumeClaims and ckpt.volume_claim and ckpt.volume_claim not in policy.allowedVolumeClaims:
        out.append(f"spec.trainer.checkpoint.volumeClaim must be one of {', '.join(policy.allowedVolumeClaims)} "
                   f"(jobPolicy.allowedVolumeClaims)")
    path = ckpt.path
    if path is not None and (".." in path or any(_under(path, f) for f in policy.forbiddenMountPaths)):
        out.append(f"spec.trainer.checkpoint.path must not be, or lie under, {', '.join(policy.forbiddenMountPaths)} "
                   f"(jobPolicy.forbiddenMountPaths), nor contain '..': pick a path of its own, such as /checkpoints")
    for field, rule, allowed, values in (
            ("priorityClassName", "allowedPriorityClasses", policy.allowedPriorityClasses,
             [r.priority_class_name for r in roles]),
            ("runtimeClassName", "allowedRuntimeClasses", policy.allowedRuntimeClasses,
             [r.runtime_class_name for r in roles])):
        if allowed and any(v is not None and v not in allowed for v in values):
            out.append(f"spec.roles.<role>.{field} must be one of {', '.join(allowed)} (jobPolicy.{rule})")
    device = spec.placement.device_class if "device_class" in spec.placement.model_fields_set else None
    if policy.allowedDeviceClasses and device is not None and device not in policy.allowedDeviceClasses:
        out.append(f"spec.placement.deviceClass must be one of {', '.join(policy.allowedDeviceClasses)} "
                   f"(jobPolicy.allowedDeviceClasses)")
    if policy.allowedCredentialSecrets and any(s not in policy.allowedCredentialSecrets
                                               for s in spec.credentials.secrets()):
        out.append(f"spec.credentials.*.name must be one of {', '.join(policy.allowedCredentialSecrets)} "
                   f"(jobPolicy.allowedCredentialSecrets)")
    if not policy.allowWildcardTolerations and any(
            any(not t.key for t in r.tolerations) or CONTROL_PLANE in r.node_selector for r in roles):
        out.append("spec.roles.<role>: a toleration without a key tolerates every taint, and a nodeSelector on "
                   f"{CONTROL_PLANE} asks for the control plane: neither is allowed "
                   "(jobPolicy.allowWildcardTolerations)")
    return out
