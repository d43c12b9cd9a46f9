"""Policy versions: the registry the daemon's policy lifecycle follows
(``autotune.daemon.lifecycle``). Register a checkpoint, activate a version (the daemon
swaps to it at its next tick, no restart), shadow one (it decides every round beside
the active one; its decisions are stored with ``source="shadow"``, never applied), roll
back to the version active before. Changes need the token; reads are open."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from sqlalchemy.orm import Session

from autotune.api.deps import (
    BODY_ERRORS,
    READ_ERRORS,
    WRITE_ERRORS,
    AdminTokenDep,
    SessionDep,
    problem,
    unprocessable,
)
from autotune.api.schemas import (
    LINE_PATTERN,
    GoodputPair,
    PoliciesPublic,
    PolicyCreate,
    PolicyEventPublic,
    PolicyEventsPublic,
    PolicyPublic,
    ShadowPublic,
)
from autotune.daemon.lifecycle import PolicyLoader
from autotune.db import Database
from autotune.db import repository as repo
from autotune.errors import InputError

router = APIRouter(prefix="/policies", tags=["policies"])

T = TypeVar("T")

VersionPath = Annotated[str, Path(min_length=1, max_length=128, pattern=LINE_PATTERN)]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: problem("No such policy version")}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: problem(
        "The registry's state does not allow it (nothing to roll back to, no checkpoint "
        "to load), or this daemon does not switch policy versions"
    )
}

RECENT_TICKS = 20
"""Ticks the ``*_recent`` figures of ``GET /policies/shadow`` cover."""


def _public(record: repo.PolicyVersionRecord) -> PolicyPublic:
    return PolicyPublic(
        version=record.version,
        name=record.name,
        kind=record.kind,
        content_hash=record.content_hash,
        checkpoint_path=record.checkpoint_path,
        state=record.state,
        active=record.active,
        shadow=record.shadow,
        activated_at=record.activated_at,
        last_error=record.last_error,
        metrics=record.metrics,
        created_at=record.created_at,
    )


@contextmanager
def _registry_errors() -> Iterator[None]:
    """A version that does not exist is a 404; a change the registry's state does not
    allow (nothing to roll back to, no checkpoint to load) a 409 saying why."""
    try:
        yield
    except repo.PolicyNotFoundError as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from None
    except repo.PolicyConflictError as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None


def _switching(request: Request) -> None:
    """A daemon in this process that does not follow the registry (started with
    ``--policy rules``) would take a change and never act on it: 409."""
    if request.app.state.policy_lifecycle is False:
        raise HTTPException(
            status_code=409,
            detail="this daemon does not switch policy versions (it was started with "
            "--policy rules); restart it with the learned policy to use the registry",
        )


def _change(request: Request, work: Callable[[Session], T]) -> T:
    _switching(request)
    database: Database = request.app.state.db
    with _registry_errors(), database.session() as session:
        return work(session)


@router.get("", response_model=PoliciesPublic, responses=READ_ERRORS)
def list_policies(session: SessionDep) -> PoliciesPublic:
    """Every registered policy version, newest first, with its name, content hash and
    state (active, shadow or registered), and why it last failed to load, if it did."""
    records = repo.list_policy_versions(session=session)
    return PoliciesPublic(data=[_public(r) for r in records], count=len(records))


@router.post(
    "",
    response_model=PolicyPublic,
    status_code=201,
    dependencies=[AdminTokenDep],
    responses={**BODY_ERRORS, **_CONFLICT, 200: {"model": PolicyPublic, "description": "Known"}},
)
def register_policy(request: Request, response: Response, body: PolicyCreate) -> PolicyPublic:
    """Register a checkpoint: a folder on the daemon's machine, loaded here as the
    daemon would load it (422 with the reason when it does not serve). Versions are
    identified by the checkpoint's content: the same content registered again is the
    version already there (200, unchanged). It decides nothing until activated or
    shadowed."""
    _switching(request)
    loader: PolicyLoader | None = request.app.state.policy_loader
    if loader is None:
        raise HTTPException(
            status_code=409, detail="this API cannot load checkpoints (no policy loader)"
        )
    if body.kind == "rules":
        raise unprocessable("kind", "the rules need no checkpoint; they are registered already")
    try:  # in this request's worker thread: the event loop does not wait for the load
        info = loader.inspect(body.checkpoint, body.kind)
    except InputError as exc:
        raise unprocessable("checkpoint", str(exc)) from None
    database: Database = request.app.state.db
    with database.session() as session:
        record, created = repo.register_policy(
            session=session,
            kind=info.kind,
            checkpoint_path=info.path,
            content_hash=info.content_hash,
            name=body.name,
        )
    if not created:
        response.status_code = 200
    return _public(record)


@router.get(
    "/active",
    response_model=PolicyPublic,
    responses={**READ_ERRORS, 404: problem("No active policy: the daemon has not started")},
)
def active_policy(session: SessionDep) -> PolicyPublic:
    """The policy version that decides now."""
    active, _shadow = repo.policy_state(session=session)
    if active is None:
        raise HTTPException(status_code=404, detail="no active policy: the daemon has not started")
    return _public(active)


@router.get("/events", response_model=PolicyEventsPublic, responses=READ_ERRORS)
def policy_events(
    session: SessionDep,
    version: Annotated[
        str | None, Query(min_length=1, max_length=128, pattern=LINE_PATTERN)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> PolicyEventsPublic:
    """What happened to policy versions, newest first: registered, activated (with the
    version active before), shadowed, unshadowed, rolled back, failed to load (why)."""
    events = repo.list_policy_events(session=session, version=version, limit=limit)
    return PolicyEventsPublic(
        data=[
            PolicyEventPublic(
                id=e.event_id, version=e.version, action=e.action, at=e.at, detail=e.detail
            )
            for e in events
        ],
        count=len(events),
    )


@router.get(
    "/shadow",
    response_model=ShadowPublic,
    responses={**READ_ERRORS, 404: problem("No shadow policy")},
)
def shadow_policy(session: SessionDep) -> ShadowPublic:
    """The shadow version and how it compares with the active one since it became the
    shadow: ticks shadowed, agreement (overall and over the newest ticks), and the
    predicted goodput of its rounds and of the active policy's."""
    active, shadow = repo.policy_state(session=session)
    if shadow is None:
        detail = "no shadow policy"
        for event in repo.list_policy_events(session=session, limit=1):
            if event.action == "shadow_failed":
                detail += f": {event.version} failed to load: {event.detail.get('reason')}"
        raise HTTPException(status_code=404, detail=detail)
    started = repo.latest_policy_event(session=session, version=shadow.version, actions=["shadow"])
    since = started.at if started is not None else None

    def summary(name: str) -> repo.MetricSummary:
        return repo.summarize_metric(
            session=session,
            name=name,
            label="shadow",
            value=shadow.version,
            since=since,
            recent=RECENT_TICKS,
        )

    agreement = summary("shadow_agreement")
    mine = summary("shadow_predicted_goodput")
    theirs = summary("active_predicted_goodput")
    decisions = repo.list_decision_rows(
        session=session, source="shadow", policy_version=shadow.version, since=since, limit=1
    )
    return ShadowPublic(
        version=shadow.version,
        name=shadow.name,
        active_version=active.version if active is not None else None,
        since=since,
        ticks=max(mine.rounds, agreement.rounds),
        agreement=agreement.mean,
        agreement_recent=agreement.recent_mean,
        recent_ticks=mine.recent_rounds,
        predicted_goodput=GoodputPair(shadow=mine.mean, active=theirs.mean),
        predicted_goodput_recent=GoodputPair(shadow=mine.recent_mean, active=theirs.recent_mean),
        decisions=decisions.count,
    )


@router.delete(
    "/shadow",
    response_model=PolicyPublic,
    dependencies=[AdminTokenDep],
    responses={**WRITE_ERRORS, **_CONFLICT, 404: problem("No shadow policy")},
)
def stop_shadow(request: Request) -> PolicyPublic:
    """Stop shadowing (from the daemon's next tick); returns the version that was the
    shadow. Its stored decisions stay."""
    record = _change(request, lambda session: repo.clear_shadow_policy(session=session))
    if record is None:
        raise HTTPException(status_code=404, detail="no shadow policy")
    return _public(record)


@router.post(
    "/rollback",
    response_model=PolicyPublic,
    dependencies=[AdminTokenDep],
    responses={**WRITE_ERRORS, **_CONFLICT, **_NOT_FOUND},
)
def rollback(request: Request) -> PolicyPublic:
    """Make the version active before the current one active again (the daemon swaps
    at its next tick); again, it goes further back. 409 when there is none."""
    return _public(_change(request, lambda session: repo.rollback_policy(session=session)))


@router.post(
    "/{version}/activate",
    response_model=PolicyPublic,
    dependencies=[AdminTokenDep],
    responses={**WRITE_ERRORS, **_CONFLICT, **_NOT_FOUND},
)
def activate(request: Request, version: VersionPath) -> PolicyPublic:
    """Make ``version`` the active one: the daemon loads it and decides with it from its
    next tick, without a restart. If it cannot load it, the daemon keeps its policy and
    the version's ``last_error`` says why."""
    return _public(
        _change(request, lambda session: repo.activate_policy(session=session, version=version))
    )


@router.post(
    "/{version}/shadow",
    response_model=PolicyPublic,
    dependencies=[AdminTokenDep],
    responses={**WRITE_ERRORS, **_CONFLICT, **_NOT_FOUND},
)
def shadow(request: Request, version: VersionPath) -> PolicyPublic:
    """Make ``version`` the shadow (replacing the one there was): from the daemon's next
    tick it decides every round beside the active version, deterministically; its
    decisions are stored with ``source="shadow"`` and never applied."""
    return _public(
        _change(request, lambda session: repo.set_shadow_policy(session=session, version=version))
    )
