"""The Ray auth token stays the one the running cluster uses, and the operator never reads it back.

Ray reads its token once, when each process starts, so a new token in the Secret would lock every
pod that starts later (a restarted role, a retried driver) out of the running cluster. The Secret is
immutable, and the operator holds no right to get, patch or delete Secrets: every pass only creates
it, which answers 409 while it exists. The operator remembers the token it made in this process; a
Secret deleted by hand is made anew with that same token (Event ``RayTokenKept``). A Secret deleted
while the operator did not know its token (made by an earlier operator process) is gone with it: the
Secret is made with a new one, and, once the job's Ray cluster runs, an Event ``RayTokenLost`` says
the job must restart (suspend, then resume) for its pods to agree again. Garbage collection removes
the Secret with its job (owner reference).
"""

from __future__ import annotations

import secrets
from collections.abc import MutableMapping
from dataclasses import dataclass

Key = tuple[str, str, str]  # (namespace, job, job uid): a re-created job of the same name is another job
Event = tuple[str, str, str]  # (type, reason, message)


@dataclass(frozen=True)
class Token:
    value: str
    known: bool  # made by this process, so the running cluster's if the Secret holds it


def token_for(known: MutableMapping[Key, str], key: Key) -> Token:
    """The token to create the job's Secret with: the one this process made, else a new one."""
    if key in known:
        return Token(known[key], True)
    return Token(secrets.token_urlsafe(32), False)


def created(known: MutableMapping[Key, str], key: Key, token: Token, secret: str, cluster_running: bool,
            made: bool) -> Event | None:
    """Record a create of Secret ``secret`` with ``token`` (``made``: it did not exist, else 409); the Event
    to post, if any. A Secret that was there keeps a token this process may never have seen."""
    if not made:
        return None
    known[key] = token.value
    if token.known:
        return ("Normal", "RayTokenKept",
                f"Secret {secret} was deleted; made it anew with the token the running Ray cluster uses")
    if cluster_running:
        return ("Warning", "RayTokenLost",
                f"Secret {secret} was deleted, and its token with it (the operator never reads it back); made it "
                f"with a new token, which the running Ray cluster does not know: suspend and resume the job "
                f"(spec.suspend) so that every pod starts with the new token")
    return None
