"""The API token: from the settings (``AUTOTUNE_TOKEN``), or generated at the first
start, shown once and stored only as its SHA-256 hash in the database.

A token is 32 random bytes (``secrets.token_urlsafe``), so one unsalted SHA-256 is as
hard to reverse as the token is to guess; comparison is in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence

from autotune.db import Database
from autotune.db import repository as repo

__all__ = ["TokenCheck", "ensure_token", "hash_token"]


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenCheck:
    """Whether a presented token is one of the accepted ones (by hash)."""

    def __init__(self, hashes: Sequence[str]) -> None:
        self._hashes = [bytes.fromhex(h) for h in hashes]

    def __call__(self, token: str) -> bool:
        presented = hashlib.sha256(token.encode()).digest()
        ok = False
        for accepted in self._hashes:  # no early exit: the time does not say which
            ok |= hmac.compare_digest(presented, accepted)
        return ok


def ensure_token(db: Database, configured: str | None) -> tuple[TokenCheck, str | None]:
    """The check for API tokens, and a newly generated token to show the user once
    (``None`` when the token is configured or was generated at an earlier start)."""
    if configured:
        return TokenCheck([hash_token(configured)]), None
    with db.session() as session:
        hashes = repo.token_hashes(session=session)
        if hashes:
            return TokenCheck(hashes), None
        token = secrets.token_urlsafe(32)
        repo.add_token_hash(session=session, token_sha256=hash_token(token))
    return TokenCheck([hash_token(token)]), token
