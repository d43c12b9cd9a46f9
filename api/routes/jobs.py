from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from autotune.api.deps import SessionDep
from autotune.api.schemas import JobPublic, JobsPublic
from autotune.db import repository as repo
from autotune.serde import to_json

router = APIRouter(prefix="/jobs", tags=["jobs"])

StateQuery = Annotated[str | None, Query(pattern="^(pending|running|finished|failed|cancelled)$")]


def _public(record: repo.JobRecord) -> JobPublic:
    return JobPublic(
        job_id=record.spec.job_id,
        state=record.state,
        state_reason=record.state_reason,
        progress=record.progress,
        submitted_at=record.submitted_at,
        updated_at=record.updated_at,
        spec=to_json(record.spec),
    )


@router.get("", response_model=JobsPublic)
def list_jobs(
    session: SessionDep,
    state: StateQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JobsPublic:
    """Jobs, newest first."""
    records, count = repo.list_jobs(session=session, state=state, limit=limit, offset=offset)
    return JobsPublic(data=[_public(r) for r in records], count=count)


@router.get("/{job_id}", response_model=JobPublic)
def get_job(session: SessionDep, job_id: str) -> JobPublic:
    """One job."""
    record = repo.get_job(session=session, job_id=job_id)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return _public(record)
