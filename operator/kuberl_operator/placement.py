"""Placement that no cluster can give, known from the spec alone: refused before anything is made.

Two layers check a job's GPU placement (docs/placement.md). The runtime checks the links of the GPUs
a role actually got, when the driver starts, and reports a violation through the progress ConfigMap
(the operator mirrors it). This module checks, under ``spec.placement.policy: required``, what is
certain before any pod exists:

- a replica that needs more GPUs than any node has (``--max-gpus-per-node``) can never be scheduled;
- under ``mode: dra`` the scheduler is asked for the layout, so the request must be able to say it:
  no standard DRA device attribute marks NVLink-connected GPUs (``minLink: NV`` cannot be asked
  for, and a PCIe-root or NUMA constraint does not imply it), and a ``numaNode`` constraint admits
  GPUs linked only at ``NODE``, so a PCIe ``minLink`` (PIX, PXB, PHB) needs ``pcieRoot``.

A role with at most one GPU per replica has no link inside a replica and is never refused for it.
Under ``policy: preferred`` nothing here applies: the driver reports the links it finds.
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberl.spec import RLTrainingJob, enabled_roles
from kuberl.topology.matrix import link_score


@dataclass(frozen=True)
class Infeasible:
    """One reason a job's placement cannot be met: the spec field to change, and why."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def static_problems(job: RLTrainingJob, max_gpus_per_node: int) -> list[Infeasible]:
    """Why ``job`` can never be placed as it requires; empty when it may be (or is only preferred)."""
    placement, roles = job.spec.placement, job.spec.roles
    if placement.policy != "required":
        return []
    out: list[Infeasible] = []
    gpus = {role: roles.get(role).gpus for role in enabled_roles(job.spec)}
    for role, n in gpus.items():
        if n > max_gpus_per_node:
            out.append(Infeasible(
                f"spec.{roles.path(role)}.gpus",
                f"role {role} needs {n} GPUs per replica, more than any node has (at most {max_gpus_per_node}, "
                f"the operator's --max-gpus-per-node): its pods can never be scheduled"))
    grouped = [role for role, n in gpus.items() if n >= 2]
    if placement.mode != "dra" or not grouped:
        return out
    which = f"role{'s' if len(grouped) > 1 else ''} {', '.join(grouped)}"
    if placement.min_link == "NV":
        out.append(Infeasible(
            "spec.placement.minLink",
            f"NV cannot be requested through DRA ({which}): no standard device attribute marks NVLink-connected "
            f"GPUs, and a {placement.dra_constraint} constraint does not imply NVLink; use mode device-plugin "
            f"(the driver checks the links at start) or a PCIe level (PIX, PXB, PHB) with draConstraint pcieRoot"))
    elif placement.dra_constraint == "numaNode" and link_score(placement.min_link) > link_score("NODE"):
        out.append(Infeasible(
            "spec.placement.draConstraint",
            f"numaNode keeps each replica's GPUs on one NUMA node ({which}), where they may be linked only at "
            f"NODE; minLink {placement.min_link} needs draConstraint pcieRoot"))
    return out
