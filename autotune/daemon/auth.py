"""API tokens and who holds them.

Every token belongs to a tenant and has a role: ``admin`` manages tenants, tokens and
policies and may act on every job; ``member`` submits, cancels and overrides its own
tenant's jobs; ``viewer`` only reads. Tokens are issued (``issue_token``), rotated and
revoked through the API or the command line; each is shown once and stored only as its
SHA-256 hash, with its tenant, role, name and expiry.

The first start without ``AUTOTUNE_TOKEN`` generates the first admin token of the
``default`` tenant; ``AUTOTUNE_TOKEN``, when set, is an admin token of ``default`` that
is never stored (it cannot be revoked through the API: change the setting). A running
daemon reads the stored tokens again within ``StoredTokenCheck.refresh_s``, at once after
a change made through its own API, so a revoked or rotated token stops working without a
restart; an expired one stops at its expiry.

A token is 32 random bytes (``secrets.token_urlsafe``), so one unsalted SHA-256 is as
hard to reverse as the token is to guess; looking a digest up in a dict tells a timing
observer about digests, not about tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from sqlalchemy.orm import Session

from autotune.core import DEFAULT_TENANT, utc_now
from autotune.db import Database
from autotune.db import repository as repo

__all__ = [
    "CONFIGURED",
    "ROLES",
    "Principal",
    "Role",
    "StoredTokenCheck",
    "TokenCheck",
    "ensure_token",
    "hash_token",
    "issue_token",
    "rotate_stored_token",
    "rotate_token",
]

Role = Literal["admin", "member", "viewer"]
ROLES: tuple[Role, ...] = get_args(Role)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who presented a valid token: its tenant and role, and which token it was
    (``token_id`` ``None``: ``AUTOTUNE_TOKEN``, which is stored nowhere)."""

    tenant: str
    role: Role
    token_id: int | None = None
    token_name: str = ""

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def writes(self) -> bool:
        """Whether the token may change anything (a viewer's may not)."""
        return self.role != "viewer"

    def may_act_for(self, tenant: str) -> bool:
        """Whether it may change ``tenant``'s jobs: an admin's any, a member's its own."""
        return self.is_admin or (self.role == "member" and tenant == self.tenant)


CONFIGURED = Principal(tenant=DEFAULT_TENANT, role="admin", token_name="AUTOTUNE_TOKEN")
"""Who ``AUTOTUNE_TOKEN`` (or a fixed ``TokenCheck`` token) is."""


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenCheck:
    """Who a presented token is (``None``: no valid token). This base class accepts a
    fixed set of admin tokens of the ``default`` tenant, by hash; ``StoredTokenCheck``
    adds the stored ones."""

    def __init__(self, hashes: Sequence[str]) -> None:
        self._hashes = [bytes.fromhex(h) for h in hashes]

    def __call__(self, token: str) -> Principal | None:
        presented = hashlib.sha256(token.encode()).digest()
        ok = False
        for accepted in self._hashes:  # no early exit: the time does not say which
            ok |= hmac.compare_digest(presented, accepted)
        return CONFIGURED if ok else None

    def invalidate(self) -> None:
        """Read the stored tokens again at the next request (after a change)."""


class StoredTokenCheck(TokenCheck):
    """The stored tokens (read again at most every ``refresh_s`` seconds, or at the next
    request after ``invalidate``), besides the fixed ``configured`` ones."""

    def __init__(
        self, db: Database, refresh_s: float = 2.0, configured: Sequence[str] = ()
    ) -> None:
        super().__init__(configured)
        self._db = db
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._stored: dict[str, repo.TokenRecord] = {}

    def invalidate(self) -> None:
        with self._lock:
            self._read_at = None

    def __call__(self, token: str) -> Principal | None:
        fixed = super().__call__(token)
        if fixed is not None:
            return fixed
        with self._lock:
            stale = self._read_at is None or time.monotonic() - self._read_at >= self.refresh_s
        if stale:
            with self._db.session() as session:
                stored = dict(repo.usable_tokens(session=session))
            with self._lock:
                self._stored, self._read_at = stored, time.monotonic()
        record = self._stored.get(hash_token(token))
        if record is None or not record.usable_at(utc_now()) or record.role not in ROLES:
            return None
        return Principal(
            tenant=record.tenant,
            role=record.role,  # checked just above
            token_id=record.token_id,
            token_name=record.name,
        )


def _new_token() -> str:
    return secrets.token_urlsafe(32)


def issue_token(
    session: Session,
    *,
    tenant: str,
    role: Role,
    name: str = "",
    expires_at: datetime | None = None,
    created_by: int | None = None,
) -> tuple[repo.TokenRecord, str]:
    """A new token of ``tenant`` (which must exist), stored by hash: its record, and the
    token itself to show once."""
    token = _new_token()
    record = repo.add_token(
        session=session,
        token_sha256=hash_token(token),
        tenant=tenant,
        role=role,
        name=name,
        expires_at=expires_at,
        created_by=created_by,
    )
    return record, token


def rotate_stored_token(session: Session, token_id: int) -> tuple[repo.TokenRecord, str] | None:
    """Give a stored token a new secret (same id, tenant, role and expiry): its record
    and the new token to show once; ``None`` when there is no such token not revoked."""
    token = _new_token()
    record = repo.rotate_token_hash(
        session=session, token_id=token_id, token_sha256=hash_token(token)
    )
    return None if record is None else (record, token)


def ensure_token(db: Database, configured: str | None) -> tuple[TokenCheck, str | None]:
    """The check for API tokens, and a newly generated first admin token to show the
    user once (``None`` when ``configured`` is set, or a token was stored before)."""
    if configured:
        return StoredTokenCheck(db, configured=[hash_token(configured)]), None
    token = None
    with db.session() as session:
        if not repo.list_tokens(session=session):
            _, token = issue_token(session, tenant=DEFAULT_TENANT, role="admin", name="first")
    return StoredTokenCheck(db), token


def rotate_token(db: Database, token_id: int | None = None) -> tuple[repo.TokenRecord, str]:
    """Rotate token ``token_id`` (default: the oldest admin token not revoked, or a new
    admin token of ``default`` when none is left): its record and the new token, shown
    once. The old secret stops working (in a running daemon within
    ``StoredTokenCheck.refresh_s``). For an admin who lost the token: the command line
    reaches the database without one."""
    with db.session() as session:
        if token_id is None:
            first = repo.first_admin_token(session=session)
            if first is None:
                return issue_token(session, tenant=DEFAULT_TENANT, role="admin", name="first")
            token_id = first.token_id
        rotated = rotate_stored_token(session, token_id)
        if rotated is None:
            raise LookupError(f"no token {token_id} that is not revoked")
        return rotated
