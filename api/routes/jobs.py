from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy.orm import Session

from autotune.api.deps import (
    BODY_ERRORS,
    READ_ERRORS,
    WRITE_ERRORS,
    CursorQuery,
    JobIdPath,
    OffsetQuery,
    ReaderDep,
    SessionDep,
    SinceQuery,
    WriterDep,
    acting_for,
    bad_cursor,
    in_session,
    problem,
    seen_tenant,
    unprocessable,
)
from autotune.api.schemas import (
    LINE_PATTERN,
    JobCreate,
    JobEventPublic,
    JobEventsPublic,
    JobPublic,
    JobsPublic,
    MetricSamplePublic,
    MetricSamplesPublic,
)
from autotune.catalog.tasks import resolve_task
from autotune.core import ACTIVE_STATES, JobSpec, JobState
from autotune.db import repository as repo
from autotune.errors import FieldError
from autotune.serde import to_json

router = APIRouter(prefix="/jobs", tags=["jobs"])

StateQuery = Annotated[JobState | None, Query()]
_NO_JOB: dict[int | str, dict[str, Any]] = {404: problem("No job with that id")}


def _public(record: repo.JobRecord) -> JobPublic:
    return JobPublic(
        job_id=record.spec.job_id,
        tenant=record.spec.tenant,
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
        performance=record.performance,
    )


@router.get("", response_model=JobsPublic, responses=READ_ERRORS)
async def list_jobs(
    request: Request,
    reader: ReaderDep,
    state: StateQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: OffsetQuery = 0,
    cursor: CursorQuery = None,
) -> JobsPublic:
    """Jobs, newest first. Page with ``cursor`` (the previous page's ``next``). With
    ``reads=tenant``, the token's tenant's only (an admin's: every tenant's)."""
    tenant = seen_tenant(reader)
    with bad_cursor():
        page = await in_session(
            request,
            lambda session: repo.list_jobs(
                session=session,
                state=state,
                tenant=tenant,
                limit=limit,
                offset=offset,
                cursor=cursor,
            ),
        )
    return JobsPublic(
        data=[_public(r) for r in page.rows],
        count=page.count,
        count_exact=page.count_exact,
        next=page.next_cursor,
    )


@router.post(
    "",
    response_model=JobPublic,
    status_code=201,
    responses={**BODY_ERRORS, 409: problem("A job with that job_id exists")},
)
def submit_job(
    session: SessionDep, request: Request, body: JobCreate, principal: WriterDep
) -> JobPublic:
    """Submit a job, the token's tenant's (or, with an admin's token, the tenant named);
    the daemon hands it to the cluster at its next tick.

    Besides what the schema says: max_gpus must be at least min_gpus, a fraction of a GPU
    (constraints.gpu_milli below 1000) is for a one-GPU job only, a module task must be
    on the daemon's allow-list, and the tenant must exist (422 naming the field)."""
    tenant = body.tenant or principal.tenant
    acting_for(principal, tenant, "a job of that tenant")
    if repo.get_tenant(session=session, name=tenant) is None:
        raise unprocessable("tenant", f"no tenant {tenant!r} (autotune tenant create)")
    try:
        task = resolve_task(
            body.task, request.app.state.task_modules, trains=request.app.state.trains
        )
    except ValueError as exc:
        raise unprocessable("task", str(exc)) from None
    max_gpus = body.min_gpus if body.max_gpus is None else body.max_gpus
    if max_gpus < body.min_gpus:
        raise unprocessable("max_gpus", f"must be >= min_gpus={body.min_gpus}")
    constraints = body.constraints
    try:
        spec = JobSpec(
            job_id=body.job_id or f"api-{secrets.token_hex(5)}",
            model=task.model,
            global_batch=body.global_batch,
            min_gpus=body.min_gpus,
            max_gpus=max_gpus,
            gpu_milli=constraints.gpu_milli,
            gpu_types=None if constraints.gpu_types is None else tuple(constraints.gpu_types),
            max_nodes=constraints.max_nodes,
            cpu_milli=constraints.cpu_milli,
            memory_mib=constraints.memory_mib,
            priority=body.priority,
            tenant=tenant,
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


@router.get("/{job_id}", response_model=JobPublic, responses={**READ_ERRORS, **_NO_JOB})
async def get_job(request: Request, job_id: JobIdPath, reader: ReaderDep) -> JobPublic:
    """One job, with the newest value of each figure measured on its steps (with
    ``reads=tenant``, another tenant's job is a 404)."""
    tenant = seen_tenant(reader)

    def read(session: Session) -> JobPublic | None:
        record = repo.get_job(session=session, job_id=job_id)
        if record is None or tenant not in (None, record.spec.tenant):
            return None
        public = _public(record)
        public.metrics = repo.job_metrics(session=session, job_id=job_id)
        return public

    public = await in_session(request, read)
    if public is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return public


@router.get(
    "/{job_id}/metrics",
    response_model=MetricSamplesPublic,
    responses={**READ_ERRORS, **_NO_JOB},
)
async def job_metric_samples(
    request: Request,
    job_id: JobIdPath,
    reader: ReaderDep,
    name: Annotated[
        str | None,
        Query(max_length=128, pattern=LINE_PATTERN, description="Only this metric's"),
    ] = None,
    since: SinceQuery = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    cursor: CursorQuery = None,
) -> MetricSamplesPublic:
    """The job's recorded samples (goodput, and what the backend measured on its steps:
    ``job_*``), newest first; filter by metric name and time, page with ``cursor``."""

    tenant = seen_tenant(reader)

    def read(session: Session) -> repo.Page[repo.MetricSample] | None:
        owner = repo.job_tenant(session=session, job_id=job_id)
        if owner is None or tenant not in (None, owner):
            return None
        return repo.list_metric_samples(
            session=session,
            names=[name] if name else [],
            job_id=job_id,
            since=since,
            limit=limit,
            cursor=cursor,
        )

    with bad_cursor():
        page = await in_session(request, read)
    if page is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return MetricSamplesPublic(
        data=[
            MetricSamplePublic(
                name=s.name, value=s.value, job_id=s.job_id, recorded_at=s.recorded_at
            )
            for s in page.rows
        ],
        count=page.count,
        count_exact=page.count_exact,
        next=page.next_cursor,
    )


def event_public(record: repo.JobEventRecord) -> JobEventPublic:
    """A stored job event as the API shows it (here and on the dashboard)."""
    return JobEventPublic(
        event_id=record.event_id,
        job_id=record.job_id,
        kind=record.kind,
        at=record.at,
        detail=record.detail,
    )


@router.get(
    "/{job_id}/events",
    response_model=JobEventsPublic,
    responses={**READ_ERRORS, **_NO_JOB},
)
async def job_events(
    request: Request,
    job_id: JobIdPath,
    reader: ReaderDep,
    kind: Annotated[
        str | None, Query(max_length=64, pattern=LINE_PATTERN, description="Only this kind")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    cursor: CursorQuery = None,
) -> JobEventsPublic:
    """What happened to the job on the backend while it trained, oldest first: nodes
    lost, resumes from a checkpoint, precision raised by the gradient-norm guard, batch
    shares moved, reconfigurations; page with ``cursor``."""

    tenant = seen_tenant(reader)

    def read(session: Session) -> repo.Page[repo.JobEventRecord] | None:
        owner = repo.job_tenant(session=session, job_id=job_id)
        if owner is None or tenant not in (None, owner):
            return None
        return repo.list_job_events(
            session=session, job_id=job_id, kind=kind, limit=limit, cursor=cursor
        )

    with bad_cursor():
        page = await in_session(request, read)
    if page is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return JobEventsPublic(
        data=[event_public(e) for e in page.rows],
        count=page.count,
        count_exact=page.count_exact,
        next=page.next_cursor,
    )


@router.delete(
    "/{job_id}",
    response_model=JobPublic,
    status_code=202,
    responses={**WRITE_ERRORS, **_NO_JOB, 409: problem("The job has ended already")},
)
def cancel_job(session: SessionDep, job_id: JobIdPath, principal: WriterDep) -> JobPublic:
    """Cancel a job (an admin's token: any; a member's: its tenant's): the daemon stops
    it and frees its GPUs at its next tick."""
    record = repo.get_job(session=session, job_id=job_id)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    acting_for(principal, record.spec.tenant, f"job {job_id!r}")
    if record.state not in ACTIVE_STATES:
        raise HTTPException(status_code=409, detail=f"job {job_id!r} is already {record.state}")
    cancelled = repo.request_cancel(session=session, job_id=job_id)
    assert cancelled is not None
    return _public(cancelled)
