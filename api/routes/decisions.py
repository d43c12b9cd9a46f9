from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response

from autotune.api.deps import SessionDep
from autotune.api.schemas import DecisionExplanation, DecisionPublic, DecisionsPublic
from autotune.core import DecisionSource
from autotune.db import Database
from autotune.db import repository as repo
from autotune.serde import to_json

router = APIRouter(prefix="/decisions", tags=["decisions"])

SourceQuery = Annotated[DecisionSource | None, Query()]


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
    )


# The busiest read, so it runs on the event loop: a sync endpoint and its session
# dependency each cost a thread-pool hop, and ``bench/api_latency.py`` measured twice
# the throughput without them (SQLite in WAL mode never makes a reader wait).
@router.get("", response_model=DecisionsPublic)
async def list_decisions(
    request: Request,
    job: str | None = None,
    source: SourceQuery = None,
    since: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    """Decisions, newest first; filter by job, source and time (ISO 8601 with zone)."""
    if since is not None and since.tzinfo is None:
        raise HTTPException(status_code=422, detail="since needs a time zone, e.g. ...Z")
    database: Database = request.app.state.db
    with database.session() as session:
        rows, count = repo.list_decision_rows(
            session=session, job_id=job, source=source, since=since, limit=limit, offset=offset
        )
    page = DecisionsPublic(data=[DecisionPublic(**row) for row in rows], count=count)
    # Serialised once here; returning the model would have FastAPI dump, re-validate
    # and dump it again (a third of a 50-decision page's time).
    return Response(page.model_dump_json(), media_type="application/json")


@router.get("/{decision_id}", response_model=DecisionPublic)
def get_decision(session: SessionDep, decision_id: int) -> DecisionPublic:
    """One decision."""
    record = repo.get_decision(session=session, decision_id=decision_id)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no decision {decision_id}")
    return _public(record)


@router.get("/{decision_id}/explain", response_model=DecisionExplanation)
def explain_decision(session: SessionDep, decision_id: int) -> DecisionExplanation:
    """Why: the observation features that mattered, the alternatives considered with
    their predicted goodput, and why this one won."""
    record = repo.get_decision(session=session, decision_id=decision_id)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no decision {decision_id}")
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
        features=explanation["features"],
        chosen=explanation["chosen"],
        alternatives=explanation["alternatives"],
        why=explanation["why"],
    )
