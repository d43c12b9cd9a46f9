from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request

from autotune.api.deps import SessionDep, TokenDep, unprocessable
from autotune.api.schemas import JobCreate, JobPublic, JobsPublic
from autotune.catalog.tasks import resolve_task
from autotune.core import ACTIVE_STATES, JobSpec, JobState
from autotune.db import repository as repo
from autotune.errors import FieldError
from autotune.serde import to_json

router = APIRouter(prefix="/jobs", tags=["jobs"])

StateQuery = Annotated[JobState | None, Query()]


def _public(record: repo.JobRecord) -> JobPublic:
    return JobPublic(
        job_id=record.spec.job_id,
        state=record.state,
        state_reason=record.state_reason,
        progress=record.progress,
        submitted_at=record.submitted_at,
        updated_at=record.updated_at,
        spec=to_json(record.spec),
        task=record.task,
        cancel_requested=record.cancel_requested_at is not None,
        started_at=record.started_at,
        finished_at=record.finished_at,
        sim_submitted_s=record.sim_submitted_s,
        sim_started_s=record.sim_started_s,
        sim_finished_s=record.sim_finished_s,
        jct_s=record.jct_s,
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


@router.post("", response_model=JobPublic, status_code=201, dependencies=[TokenDep])
def submit_job(session: SessionDep, request: Request, body: JobCreate) -> JobPublic:
    """Submit a job; the daemon hands it to the cluster at its next tick."""
    try:
        task = resolve_task(
            body.task, request.app.state.task_modules, trains=request.app.state.trains
        )
    except ValueError as exc:
        raise unprocessable("task", str(exc)) from None
    if body.max_gpus < body.min_gpus:
        raise unprocessable("max_gpus", f"must be >= min_gpus={body.min_gpus}")
    constraints = body.constraints
    try:
        spec = JobSpec(
            job_id=body.job_id or f"api-{secrets.token_hex(5)}",
            model=task.model,
            global_batch=body.global_batch,
            min_gpus=body.min_gpus,
            max_gpus=body.max_gpus,
            gpu_milli=constraints.gpu_milli,
            gpu_types=None if constraints.gpu_types is None else tuple(constraints.gpu_types),
            max_nodes=constraints.max_nodes,
            cpu_milli=constraints.cpu_milli,
            memory_mib=constraints.memory_mib,
            priority=body.priority,
        )
    except FieldError as exc:  # a JobSpec field: top level in the body, or a constraint
        field = f"constraints.{exc.field}" if hasattr(constraints, exc.field) else exc.field
        raise unprocessable(field, str(exc)) from None
    record = repo.submit_job(
        session=session,
        spec=spec,
        task={"name": task.name, "steps": body.steps, "origin": "api"},
    )
    if record is None:
        raise HTTPException(status_code=409, detail=f"job {spec.job_id!r} exists")
    return _public(record)


@router.get("/{job_id}", response_model=JobPublic)
def get_job(session: SessionDep, job_id: str) -> JobPublic:
    """One job."""
    record = repo.get_job(session=session, job_id=job_id)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    public = _public(record)
    public.metrics = repo.job_metrics(session=session, job_id=job_id)
    return public


@router.delete("/{job_id}", response_model=JobPublic, status_code=202, dependencies=[TokenDep])
def cancel_job(session: SessionDep, job_id: str) -> JobPublic:
    """Cancel a job: the daemon stops it and frees its GPUs at its next tick."""
    record = repo.get_job(session=session, job_id=job_id)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    if record.state not in ACTIVE_STATES:
        raise HTTPException(status_code=409, detail=f"job {job_id!r} is already {record.state}")
    cancelled = repo.request_cancel(session=session, job_id=job_id)
    assert cancelled is not None
    return _public(cancelled)
