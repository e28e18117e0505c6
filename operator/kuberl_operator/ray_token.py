"""The Ray auth token stays the one the running cluster uses.

Ray reads its token once, when each process starts, so a new token in the Secret would lock every
pod that starts later (a restarted role, a retried driver) out of the running cluster. The operator
remembers each job's token from the Secret it made or last read (every pass reads it), and makes a
Secret deleted by hand anew with that same token (Event ``RayTokenKept``). Only a Secret deleted
while the operator was away, before its first pass since, is gone with its token: the Secret is made
with a new one, and an Event ``RayTokenLost`` says the job must restart (suspend, then resume) for
its pods to agree again. No finalizer: a job removed while the operator is away leaves nothing behind.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from . import names
from .kube import SECRETS, Kube

Key = tuple[str, str, str]  # (namespace, job, job uid): a re-created job of the same name is another job


@dataclass(frozen=True)
class Token:
    value: str
    event: tuple[str, str, str] | None = None  # (type, reason, message) to post, if any


def stored(secret: Mapping[str, Any]) -> str | None:
    """The token a Secret holds (``data`` is base64), or None."""
    raw = (secret.get("data") or {}).get(names.AUTH_TOKEN_KEY)
    return base64.b64decode(raw).decode() if raw else None


async def token_for(kube: Kube, known: MutableMapping[Key, str], key: Key, cluster_running: bool) -> Token:
    """The token to make the job's Secret with, should it not exist; remembers the one it holds."""
    namespace, job, _ = key
    name = names.auth_secret(job)
    secret = await kube.get(SECRETS, namespace, name)
    if secret is not None and (value := stored(secret)):
        known[key] = value
        return Token(value)
    if secret is None and key in known:
        return Token(known[key], ("Normal", "RayTokenKept",
                                  f"Secret {name} was deleted; made it anew with the token the running Ray cluster "
                                  f"uses"))
    known[key] = secrets.token_urlsafe(32)
    if secret is None and cluster_running:
        return Token(known[key], ("Warning", "RayTokenLost",
                                  f"Secret {name} was deleted while the operator was away, and its token with it; "
                                  f"made it with a new token, which the running Ray cluster does not know: suspend "
                                  f"and resume the job (spec.suspend) so that every pod starts with the new token"))
    return Token(known[key])
