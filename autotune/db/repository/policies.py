"""The policy registry: policy versions (registered, active or shadow) and the events
that record every change to them: registration, activation, shadowing, rollback,
and the loads that failed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from autotune.core import utc_now
from autotune.db.tables import PolicyEventRow, PolicyVersionRow

__all__ = [
    "POLICY_ACTIONS",
    "PolicyConflictError",
    "PolicyEventRecord",
    "PolicyNotFoundError",
    "PolicyVersionRecord",
    "activate_policy",
    "active_policy_version",
    "clear_shadow_policy",
    "get_policy_version",
    "latest_policy_event",
    "list_policy_events",
    "list_policy_versions",
    "policy_state",
    "record_policy_failure",
    "register_policy",
    "register_policy_version",
    "rollback_policy",
    "set_shadow_policy",
]


class PolicyNotFoundError(LookupError):
    """No policy version by that name."""


class PolicyConflictError(ValueError):
    """A registry change the registry's state does not allow (the message says why)."""


POLICY_ACTIONS = (
    "register",
    "activate",
    "rollback",
    "shadow",
    "unshadow",
    "activate_failed",
    "shadow_failed",
)
"""What a ``policy_events`` row records; an ``activate`` or ``rollback`` event's
``detail["previous"]`` is the version active before it."""
_ACTIVATIONS = ("activate", "rollback")
_FAILURES = ("activate_failed", "shadow_failed")


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyVersionRecord:
    version: str
    kind: str
    checkpoint_path: str | None
    active: bool
    metrics: dict[str, Any]
    created_at: datetime
    name: str = ""
    content_hash: str | None = None
    shadow: bool = False
    activated_at: datetime | None = None
    last_error: str | None = None
    """Why its newest activation or shadowing failed, when that is the newest thing
    that happened to it."""

    @property
    def state(self) -> Literal["active", "shadow", "registered"]:
        """``active`` (it decides), ``shadow`` (it decides beside the active one, never
        applied) or ``registered``."""
        return "active" if self.active else "shadow" if self.shadow else "registered"


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyEventRecord:
    event_id: int
    version: str
    action: str
    at: datetime
    detail: dict[str, Any]


def _policy_record(row: PolicyVersionRow, last_error: str | None = None) -> PolicyVersionRecord:
    return PolicyVersionRecord(
        version=row.version,
        kind=row.kind,
        checkpoint_path=row.checkpoint_path,
        active=row.active,
        metrics=row.metrics,
        created_at=row.created_at,
        name=row.name or row.version,
        content_hash=row.content_hash,
        shadow=row.shadow,
        activated_at=row.activated_at,
        last_error=last_error,
    )


def _policy_event(session: Session, version: str, action: str, at: datetime, **detail: Any) -> None:
    if action not in POLICY_ACTIONS:
        raise ValueError(f"policy event {action!r}: one of {POLICY_ACTIONS}")
    session.add(PolicyEventRow(version=version, action=action, at=at, detail=detail))


def _policy_row(session: Session, version: str) -> PolicyVersionRow:
    row = session.get(PolicyVersionRow, version)
    if row is None:
        raise PolicyNotFoundError(f"no policy version {version!r}")
    return row


def _active_row(session: Session) -> PolicyVersionRow | None:
    """The active version (the one activated last, should two writers ever have left two
    active)."""
    return session.scalars(
        select(PolicyVersionRow)
        .where(PolicyVersionRow.active)
        .order_by(PolicyVersionRow.activated_at.desc().nulls_last())
    ).first()


def _shadow_row(session: Session) -> PolicyVersionRow | None:
    return session.scalars(select(PolicyVersionRow).where(PolicyVersionRow.shadow)).first()


def _runnable(row: PolicyVersionRow) -> None:
    """A version the daemon can build: a checkpoint, or the rules."""
    if row.checkpoint_path is None and row.kind != "rules":
        raise PolicyConflictError(
            f"policy version {row.version!r} has no checkpoint to load (it fell back to "
            "rules when it was recorded); register its checkpoint"
        )


def _make_active(
    session: Session, row: PolicyVersionRow, action: str, at: datetime, **detail: Any
) -> bool:
    """Make ``row`` the one active version, recording ``action`` with the version active
    before it (as ``previous``, unless ``detail`` says it); ``False`` if it already was."""
    current = _active_row(session)
    if current is not None and current.version == row.version:
        return False
    for other in session.scalars(select(PolicyVersionRow).where(PolicyVersionRow.active)):
        other.active = False
    session.flush()  # one active version at any moment, also inside the transaction
    row.active = True
    row.activated_at = at
    detail.setdefault("previous", None if current is None else current.version)
    _policy_event(session, row.version, action, at, **detail)
    if row.shadow:  # the candidate now decides: nothing left to shadow
        row.shadow = False
        _policy_event(session, row.version, "unshadow", at, reason="activated")
    return True


def register_policy_version(
    *,
    session: Session,
    version: str,
    kind: str,
    checkpoint_path: str | None = None,
    activate: bool = False,
    metrics: dict[str, Any] | None = None,
    at: datetime | None = None,
    name: str | None = None,
    content_hash: str | None = None,
    by: str = "daemon start",
) -> PolicyVersionRecord:
    """Record a policy version (idempotent: a version recorded before keeps its name and
    gains the checkpoint and hash it lacked); ``activate`` makes it the only active one
    (an ``activate`` event, ``by`` saying who, when it was not active already). ``at``:
    when (default now)."""
    when = at or utc_now()
    row = session.get(PolicyVersionRow, version)
    if row is None:
        row = PolicyVersionRow(
            version=version,
            kind=kind,
            checkpoint_path=checkpoint_path,
            active=False,
            shadow=False,
            metrics=metrics or {},
            created_at=when,
            name=name or version,
            content_hash=content_hash,
        )
        session.add(row)
        _policy_event(
            session, version, "register", when, kind=kind, checkpoint=checkpoint_path, by=by
        )
    else:
        if row.checkpoint_path is None and checkpoint_path is not None:
            row.checkpoint_path = checkpoint_path
        if row.content_hash is None and content_hash is not None:
            row.content_hash = content_hash
    if activate:
        _make_active(session, row, "activate", when, by=by)
    session.flush()
    return _policy_record(row)


def register_policy(
    *,
    session: Session,
    kind: str,
    checkpoint_path: str,
    content_hash: str,
    name: str | None = None,
    at: datetime | None = None,
) -> tuple[PolicyVersionRecord, bool]:
    """Register a checkpoint by its content hash: ``(record, created)``. The same
    content registered again (from any path, under any name) is the version already
    there, unchanged (``created`` false). Its version is ``<kind>-<hash[:12]>``."""
    existing = session.scalars(
        select(PolicyVersionRow)
        .where(PolicyVersionRow.content_hash == content_hash)
        .order_by(PolicyVersionRow.created_at)
    ).first()
    if existing is not None:
        if existing.checkpoint_path is None:
            existing.checkpoint_path = checkpoint_path
        return _policy_record(existing), False
    version = f"{kind}-{content_hash[:12]}"
    record = register_policy_version(
        session=session,
        version=version,
        kind=kind,
        checkpoint_path=checkpoint_path,
        content_hash=content_hash,
        name=name,
        at=at,
        by="api",
    )
    return record, True


def get_policy_version(*, session: Session, version: str) -> PolicyVersionRecord | None:
    row = session.get(PolicyVersionRow, version)
    if row is None:
        return None
    return _policy_record(row, _last_errors(session, [version]).get(version))


def active_policy_version(*, session: Session) -> str | None:
    return session.scalar(select(PolicyVersionRow.version).where(PolicyVersionRow.active))


def policy_state(
    *, session: Session
) -> tuple[PolicyVersionRecord | None, PolicyVersionRecord | None]:
    """The active and the shadow version: one read of a table of a few rows, cheap
    enough for every tick."""
    active = shadow = None
    rows = session.scalars(
        select(PolicyVersionRow)
        .where(or_(PolicyVersionRow.active, PolicyVersionRow.shadow))
        .order_by(PolicyVersionRow.activated_at.desc().nulls_last())
    )
    for row in rows:
        if row.active and active is None:
            active = _policy_record(row)
        elif row.shadow and not row.active and shadow is None:
            shadow = _policy_record(row)
    return active, shadow


def activate_policy(
    *, session: Session, version: str, by: str = "api", at: datetime | None = None
) -> PolicyVersionRecord:
    """Make ``version`` the active one: the daemon decides with it from its next tick.
    ``PolicyNotFoundError``, or ``PolicyConflictError`` when it has nothing to load."""
    row = _policy_row(session, version)
    _runnable(row)
    _make_active(session, row, "activate", at or utc_now(), by=by)
    session.flush()
    return _policy_record(row)


def set_shadow_policy(
    *, session: Session, version: str, at: datetime | None = None
) -> PolicyVersionRecord:
    """Make ``version`` the shadow: from the daemon's next tick it decides every round
    beside the active version, its decisions stored (``source="shadow"``), never applied.
    It replaces the shadow there was. Not the active version itself."""
    when = at or utc_now()
    row = _policy_row(session, version)
    if row.active:
        raise PolicyConflictError(
            f"policy version {version!r} is the active one: nothing to compare"
        )
    _runnable(row)
    if row.shadow:
        return _policy_record(row)
    current = _shadow_row(session)
    if current is not None:
        current.shadow = False
        _policy_event(session, current.version, "unshadow", when, reason=f"replaced by {version}")
    session.flush()
    row.shadow = True
    _policy_event(session, version, "shadow", when)
    session.flush()
    return _policy_record(row)


def clear_shadow_policy(
    *, session: Session, reason: str = "stopped", at: datetime | None = None
) -> PolicyVersionRecord | None:
    """Stop shadowing; returns the version that was the shadow (``None``: there was none)."""
    row = _shadow_row(session)
    if row is None:
        return None
    row.shadow = False
    _policy_event(session, row.version, "unshadow", at or utc_now(), reason=reason)
    session.flush()
    return _policy_record(row)


def rollback_policy(*, session: Session, at: datetime | None = None) -> PolicyVersionRecord:
    """Make the version that was active before the current one active again (repeated,
    it walks further back). ``PolicyConflictError`` when no version was active before it, or
    that version cannot be loaded any more."""
    current = _active_row(session)
    if current is None:
        raise PolicyConflictError("no active policy version to roll back from")
    previous = _previous_active(session, current.version)
    if previous is None:
        raise PolicyConflictError(
            f"no version was active before {current.version!r}: nothing to roll back to"
        )
    row = session.get(PolicyVersionRow, previous)
    if row is None:
        raise PolicyConflictError(
            f"the version active before, {previous!r}, is no longer registered"
        )
    _runnable(row)
    # The version rolled back to takes its own predecessor along, so a second rollback
    # goes further back instead of forth.
    _make_active(
        session,
        row,
        "rollback",
        at or utc_now(),
        previous=_previous_active(session, previous),
        rolled_back=current.version,
    )
    session.flush()
    return _policy_record(row)


def _previous_active(session: Session, version: str) -> str | None:
    """The version active before ``version``'s newest activation."""
    detail = session.scalar(
        select(PolicyEventRow.detail)
        .where(PolicyEventRow.version == version, PolicyEventRow.action.in_(_ACTIVATIONS))
        .order_by(PolicyEventRow.id.desc())
        .limit(1)
    )
    previous = (detail or {}).get("previous")
    return previous if isinstance(previous, str) else None


def record_policy_failure(
    *,
    session: Session,
    version: str,
    action: str,
    reason: str,
    kept: str | None,
    at: datetime | None = None,
) -> None:
    """A version the daemon could not load: ``action`` is ``activate_failed`` (the
    daemon keeps deciding with ``kept``, which becomes the active version again) or
    ``shadow_failed`` (shadowing stops). Recorded with the reason, so the registry says
    why; nothing changes if another version was activated or shadowed meanwhile."""
    if action not in _FAILURES:
        raise ValueError(f"policy failure {action!r}: one of {_FAILURES}")
    row = session.get(PolicyVersionRow, version)
    _policy_event(session, version, action, at or utc_now(), reason=reason, kept=kept)
    if row is None:
        return
    if action == "activate_failed" and row.active and kept is not None and kept != version:
        back = session.get(PolicyVersionRow, kept)
        if back is not None:
            row.active = False
            session.flush()
            back.active = True
    elif action == "shadow_failed" and row.shadow:
        row.shadow = False
    session.flush()


def _last_errors(session: Session, versions: Sequence[str] | None = None) -> dict[str, str]:
    """Per version, the reason of its newest failure, when nothing it succeeded at came
    after it."""
    query = select(PolicyEventRow.version, PolicyEventRow.action, PolicyEventRow.detail).where(
        PolicyEventRow.action.in_((*_FAILURES, *_ACTIVATIONS, "shadow"))
    )
    if versions is not None:
        query = query.where(PolicyEventRow.version.in_(list(versions)))
    errors: dict[str, str] = {}
    for version, action, detail in session.execute(query.order_by(PolicyEventRow.id)):
        if action in _FAILURES:
            errors[version] = str((detail or {}).get("reason", action))
        else:
            errors.pop(version, None)
    return errors


def list_policy_versions(*, session: Session) -> list[PolicyVersionRecord]:
    """Every registered policy version, newest first, with its state and last error."""
    rows = session.scalars(
        select(PolicyVersionRow).order_by(
            PolicyVersionRow.created_at.desc(), PolicyVersionRow.version
        )
    ).all()
    errors = _last_errors(session)
    return [_policy_record(r, errors.get(r.version)) for r in rows]


def list_policy_events(
    *, session: Session, version: str | None = None, limit: int = 100
) -> list[PolicyEventRecord]:
    """What happened to policy versions (to ``version``, when given), newest first."""
    query = select(PolicyEventRow).order_by(PolicyEventRow.id.desc()).limit(limit)
    if version is not None:
        query = query.where(PolicyEventRow.version == version)
    return [
        PolicyEventRecord(
            event_id=row.id, version=row.version, action=row.action, at=row.at, detail=row.detail
        )
        for row in session.scalars(query)
    ]


def latest_policy_event(
    *, session: Session, version: str, actions: Sequence[str]
) -> PolicyEventRecord | None:
    """``version``'s newest event among ``actions``."""
    row = session.scalars(
        select(PolicyEventRow)
        .where(PolicyEventRow.version == version, PolicyEventRow.action.in_(list(actions)))
        .order_by(PolicyEventRow.id.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    return PolicyEventRecord(
        event_id=row.id, version=row.version, action=row.action, at=row.at, detail=row.detail
    )
