"""The runtime as a library: the stable public import path for a program of one's own (docs/library.md).

    from kuberl.library import Prompts, Roles

The code lives in `kuberl.controller` (`Roles`, `Fault` and `RoleHistory` in `kuberl.controller.roles`, the
errors that end a job in `kuberl.controller.job_errors`) and `kuberl.data.prompts`; this module only names it.
"""

from kuberl.controller.job_errors import CheckpointUntrusted, JobFailed
from kuberl.controller.roles import Fault, RoleHistory, Roles
from kuberl.data.prompts import Prompts

__all__ = ["CheckpointUntrusted", "Fault", "JobFailed", "Prompts", "RoleHistory", "Roles"]
