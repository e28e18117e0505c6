"""Operator settings: from `kuberl operator` flags, or from the environment under plain `kopf run`."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .builders import DEFAULT_IMAGE


@dataclass(frozen=True)
class OperatorConfig:
    image: str = DEFAULT_IMAGE  # the runtime image of Ray pods and the driver
    metrics_port: int | None = None  # None: no metrics endpoint
    metrics_address: str = "0.0.0.0"

    @classmethod
    def from_env(cls) -> "OperatorConfig":
        """KUBERL_RUNTIME_IMAGE, KUBERL_METRICS_PORT, KUBERL_METRICS_ADDRESS."""
        port = os.environ.get("KUBERL_METRICS_PORT")
        return cls(
            image=os.environ.get("KUBERL_RUNTIME_IMAGE", DEFAULT_IMAGE),
            metrics_port=int(port) if port else None,
            metrics_address=os.environ.get("KUBERL_METRICS_ADDRESS", cls.metrics_address),
        )
