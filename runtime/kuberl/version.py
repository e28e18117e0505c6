"""Which kuberl a process runs: the installed distribution's version, for ``kuberl_build_info``."""

from __future__ import annotations

from functools import lru_cache
from importlib import metadata


@lru_cache(maxsize=1)
def version() -> str:
    """The installed ``kuberl`` distribution's version ("unknown" when run from a bare source tree)."""
    try:
        return metadata.version("kuberl")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_labels(component: str) -> dict[str, str]:
    """Labels of ``kuberl_build_info`` for one component ("driver" or "operator")."""
    return {"version": version(), "component": component}
