"""The Ray auth token stays the one the running cluster uses.

Ray reads its token once, when each process starts, so a new token in the Secret would lock every
pod that starts later (a restarted role, a retried driver) out of the running cluster. The operator
puts a finalizer of its own on the Secret it makes. A Secret deleted by hand then lingers, with its
token, until the operator's next pass, which removes the finalizer and makes the Secret anew with the
same token (Event ``RayTokenKept``). Only a Secret whose finalizer was also stripped by hand loses its
token: the Secret is made with a new one, and an Event ``RayTokenLost`` says the job must restart
(suspend, then resume) for its pods to agree again.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import names
from .kube import SECRETS, Kube

GONE_WAIT_S = 10.0  # how long a pass waits for the old Secret to go once its finalizer is removed


@dataclass(frozen=True)
class Token:
    value: str
    event: tuple[str, str, str] | None = None  # (type, reason, message) to post, if any


def stored(secret: Mapping[str, Any]) -> str | None:
    """The token a Secret holds (``data`` is base64), or None."""
    raw = (secret.get("data") or {}).get(names.AUTH_TOKEN_KEY)
    return base64.b64decode(raw).decode() if raw else None


def without_finalizer(secret: Mapping[str, Any]) -> list[str]:
    return [f for f in secret["metadata"].get("finalizers", []) if f != names.TOKEN_FINALIZER]


async def release(kube: Kube, namespace: str, secret: Mapping[str, Any]) -> None:
    """Remove our finalizer (when the job goes, or to make the Secret anew)."""
    if names.TOKEN_FINALIZER in secret["metadata"].get("finalizers", []):
        await kube.patch(SECRETS, namespace, secret["metadata"]["name"],
                         {"metadata": {"finalizers": without_finalizer(secret),
                                       "resourceVersion": secret["metadata"]["resourceVersion"]}})


async def token_for(kube: Kube, namespace: str, job: str, cluster_running: bool) -> Token:
    """The token to make the job's Secret with, should it not exist: the one being deleted, else a new one."""
    name = names.auth_secret(job)
    secret = await kube.get(SECRETS, namespace, name)
    if secret is not None and secret["metadata"].get("deletionTimestamp") and (old := stored(secret)):
        await release(kube, namespace, secret)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GONE_WAIT_S
        while await kube.get(SECRETS, namespace, name) is not None and loop.time() < deadline:
            await asyncio.sleep(0.2)
        return Token(old, ("Normal", "RayTokenKept",
                           f"Secret {name} was deleted; made it anew with the token the running Ray cluster uses"))
    fresh = secrets.token_urlsafe(32)
    if secret is None and cluster_running:
        return Token(fresh, ("Warning", "RayTokenLost",
                             f"Secret {name} is gone with its token (its finalizer {names.TOKEN_FINALIZER} was removed "
                             f"by hand); made it with a new token, which the running Ray cluster does not know: "
                             f"suspend and resume the job (spec.suspend) so that every pod starts with the new token"))
    return Token(fresh)
