"""The API token: from the settings (``AUTOTUNE_TOKEN``), or generated at the first
start, shown once and stored only as its SHA-256 hash in the database.
``autotune token rotate`` replaces the stored one: a running daemon reads the stored
hashes again within ``StoredTokenCheck.refresh_s``, so the old token stops working
without a restart.

A token is 32 random bytes (``secrets.token_urlsafe``), so one unsalted SHA-256 is as
hard to reverse as the token is to guess; comparison is in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Sequence

from autotune.db import Database
from autotune.db import repository as repo

__all__ = ["StoredTokenCheck", "TokenCheck", "ensure_token", "hash_token", "rotate_token"]


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


class StoredTokenCheck(TokenCheck):
    """``TokenCheck`` over the hashes stored in the database, read again at most every
    ``refresh_s`` seconds (so a rotation takes effect in a running daemon)."""

    def __init__(self, db: Database, refresh_s: float = 2.0) -> None:
        super().__init__([])
        self._db = db
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._read_at: float | None = None

    def __call__(self, token: str) -> bool:
        with self._lock:
            stale = self._read_at is None or time.monotonic() - self._read_at >= self.refresh_s
        if stale:
            with self._db.session() as session:
                hashes = [bytes.fromhex(h) for h in repo.token_hashes(session=session)]
            with self._lock:
                self._hashes, self._read_at = hashes, time.monotonic()
        return super().__call__(token)


def _new_token() -> str:
    return secrets.token_urlsafe(32)


def ensure_token(db: Database, configured: str | None) -> tuple[TokenCheck, str | None]:
    """The check for API tokens, and a newly generated token to show the user once
    (``None`` when the token is configured or was generated at an earlier start)."""
    if configured:
        return TokenCheck([hash_token(configured)]), None
    token = None
    with db.session() as session:
        if not repo.token_hashes(session=session):
            token = _new_token()
            repo.add_token_hash(session=session, token_sha256=hash_token(token))
    return StoredTokenCheck(db), token


def rotate_token(db: Database) -> str:
    """Replace the stored token(s) with a new one, returned to be shown once; the old
    ones stop working (in a running daemon within ``StoredTokenCheck.refresh_s``)."""
    token = _new_token()
    with db.session() as session:
        repo.replace_token_hashes(session=session, token_sha256=hash_token(token))
    return token
