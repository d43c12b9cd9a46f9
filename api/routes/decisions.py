from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from sqlalchemy.orm import Session

from autotune.api.deps import (
    MAX_ROW_ID,
    READ_ERRORS,
    CursorQuery,
    IdPath,
    JobQuery,
    OffsetQuery,
    ReaderDep,
    SinceQuery,
    bad_cursor,
    in_session,
    problem,
    seen_tenant,
)
from autotune.api.schemas import (
    LINE_PATTERN,
    DecisionExplanation,
    DecisionPublic,
    DecisionsPublic,
)
from autotune.core import DecisionSource
from autotune.daemon.auth import Principal
from autotune.db import repository as repo
from autotune.serde import to_json

router = APIRouter(prefix="/decisions", tags=["decisions"])

SourceQuery = Annotated[DecisionSource | None, Query()]
_ONE: dict[int | str, dict[str, Any]] = {**READ_ERRORS, 404: problem("No decision with that id")}


def _public(record: repo.DecisionRecord) -> DecisionPublic:
    decision = record.decision
    assert decision.decision_id is not None
    return DecisionPublic(
        id=decision.decision_id,
        job_id=decision.job_id,
        source=decision.source,
        policy_version=decision.policy_version,
        decided_at=decision.decided_at,
        applied_at=record.applied_at,
        reason=decision.reason,
        config=to_json(decision.config),
        placement=None if decision.placement is None else to_json(decision.placement),
        override_id=record.override_id,
        preempt=decision.preempt,
    )


# The busiest read: its database work runs in one worker thread (``in_session``), and
# the page is serialised once, here; returning the model would have FastAPI dump,
# re-validate and dump it again (a third of a 50-decision page's time).
@router.get("", response_model=DecisionsPublic, responses=READ_ERRORS)
async def list_decisions(
    request: Request,
    reader: ReaderDep,
    job: JobQuery = None,
    source: SourceQuery = None,
    since: SinceQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: OffsetQuery = 0,
    cursor: CursorQuery = None,
    policy_version: Annotated[
        str | None, Query(min_length=1, max_length=128, pattern=LINE_PATTERN)
    ] = None,
) -> Response:
    """Decisions, newest first; filter by job, source, policy version and time (ISO 8601
    with zone). Without ``source``, the decisions taken: a shadow policy's (never
    applied) are listed with ``source=shadow``. Page with ``cursor`` (the previous
    page's ``next``): any page costs the same. With ``reads=tenant``, the token's
    tenant's jobs' only (an admin's: every tenant's)."""
    tenant = seen_tenant(reader)
    with bad_cursor():
        page = await in_session(
            request,
            lambda session: repo.list_decision_rows(
                session=session,
                job_id=job,
                source=source,
                since=since,
                limit=limit,
                offset=offset,
                cursor=cursor,
                policy_version=policy_version,
                tenant=tenant,
            ),
        )
    body = DecisionsPublic(
        data=[DecisionPublic(**row) for row in page.rows],
        count=page.count,
        count_exact=page.count_exact,
        next=page.next_cursor,
    )
    return Response(body.model_dump_json(), media_type="application/json")


async def _decision(
    request: Request, decision_id: int, reader: Principal | None
) -> repo.DecisionRecord:
    """The decision, or a 404 (without a query for an id no row can have; for a job of
    another tenant than the reader's, with ``reads=tenant``)."""
    tenant = seen_tenant(reader)

    def read(session: Session) -> repo.DecisionRecord | None:
        record = repo.get_decision(session=session, decision_id=decision_id)
        if record is None or tenant is None:
            return record
        owner = repo.job_tenant(session=session, job_id=record.decision.job_id)
        return record if owner == tenant else None

    record = None
    if decision_id <= MAX_ROW_ID:
        record = await in_session(request, read)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no decision {decision_id}")
    return record


@router.get("/{decision_id}", response_model=DecisionPublic, responses=_ONE)
async def get_decision(request: Request, decision_id: IdPath, reader: ReaderDep) -> DecisionPublic:
    """One decision."""
    return _public(await _decision(request, decision_id, reader))


@router.get("/{decision_id}/explain", response_model=DecisionExplanation, responses=_ONE)
async def explain_decision(
    request: Request, decision_id: IdPath, reader: ReaderDep
) -> DecisionExplanation:
    """Why: the observation features that mattered, the alternatives considered with
    their predicted goodput, and why this one won."""
    record = await _decision(request, decision_id, reader)
    explanation = record.explanation or {
        "features": {},
        "chosen": {},
        "alternatives": [],
        "why": record.decision.reason + " (recorded before decisions kept an explanation)",
    }
    return DecisionExplanation(
        decision_id=decision_id,
        job_id=record.decision.job_id,
        source=record.decision.source,
        override_id=record.override_id,
        # A preemption's explanation has no configuration chosen and no alternatives.
        features=explanation.get("features", {}),
        chosen=explanation.get("chosen", {}),
        alternatives=explanation.get("alternatives", []),
        why=explanation.get("why", record.decision.reason),
    )
