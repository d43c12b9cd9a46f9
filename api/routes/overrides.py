from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from autotune.api.deps import (
    BODY_ERRORS,
    MAX_ROW_ID,
    READ_ERRORS,
    WRITE_ERRORS,
    IdPath,
    JobQuery,
    OffsetQuery,
    ReaderDep,
    SessionDep,
    WriterDep,
    acting_for,
    problem,
    seen_tenant,
    unprocessable,
)
from autotune.api.schemas import OverrideCreate, OverridePublic, OverridesPublic
from autotune.core import ACTIVE_STATES, DEFAULT_TENANT, JobConfig, utc_now
from autotune.db import repository as repo
from autotune.decision.overrides import PIN_KEYS, check_override
from autotune.errors import FieldError

router = APIRouter(prefix="/overrides", tags=["overrides"])
_NO_OVERRIDE: dict[int | str, dict[str, Any]] = {404: problem("No override with that id")}


def _public(record: repo.OverrideRecord) -> OverridePublic:
    return OverridePublic(
        id=record.override_id,
        job_id=record.job_id,
        pin=record.pin,
        reason=record.reason,
        created_at=record.created_at,
        expires_at=record.expires_at,
        deleted_at=record.deleted_at,
        active=record.active_at(utc_now()),
    )


@router.post(
    "",
    response_model=OverridePublic,
    status_code=201,
    responses={
        **BODY_ERRORS,
        404: problem("No job with that job_id"),
        409: problem("The job has ended"),
    },
)
def create_override(
    session: SessionDep, body: OverrideCreate, principal: WriterDep
) -> OverridePublic:
    """Pin part of a job's configuration or its placement until ``ttl_s`` passes.

    Rejected with 422 and the reason when it cannot run on that job and cluster (what
    the schema cannot say): a layout that does not divide, a world size outside the
    job's GPU range, out of memory, a GPU model the job may not use or that lacks a
    pinned precision, GPUs that do not exist. A newer override of the same job replaces
    the active one. An admin's token may pin any job, a member's its tenant's."""
    pin: dict[str, Any] = body.model_dump(include=set(PIN_KEYS), exclude_none=True)
    if not pin:
        raise unprocessable("layout", f"pin at least one of {', '.join(PIN_KEYS)}")
    job = repo.get_job(session=session, job_id=body.job_id)
    if job is None:
        raise HTTPException(status_code=404, detail=f"no job {body.job_id!r}")
    acting_for(principal, job.spec.tenant, f"job {body.job_id!r}")
    if job.state not in ACTIVE_STATES:
        raise HTTPException(status_code=409, detail=f"job {body.job_id!r} is {job.state}")
    latest = repo.latest_decision_records(session=session, job_ids=[body.job_id])
    base = (
        latest[body.job_id].decision.config
        if body.job_id in latest
        else JobConfig.data_parallel(job.spec.min_gpus)
    )
    try:
        check_override(job.spec, base, pin, repo.list_nodes(session=session))
    except FieldError as exc:  # exc.field: the pin key at fault
        raise unprocessable(exc.field, str(exc)) from None
    except ValueError as exc:  # a check that names no field: the first key pinned
        raise unprocessable(next(iter(pin)), str(exc)) from None
    record = repo.create_override(
        session=session,
        job_id=body.job_id,
        pin=pin,
        reason=body.reason,
        expires_at=utc_now() + timedelta(seconds=body.ttl_s),
    )
    return _public(record)


@router.get("", response_model=OverridesPublic, responses=READ_ERRORS)
def list_overrides(
    session: SessionDep,
    reader: ReaderDep,
    job: JobQuery = None,
    active: bool | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: OffsetQuery = 0,
) -> OverridesPublic:
    """Overrides, newest first; ``active=true`` for those in force now, ``false`` for
    those that ended."""
    now = utc_now()
    records, count = repo.list_overrides(
        session=session,
        job_id=job,
        active_at=now if active else None,
        ended_at=now if active is False else None,
        limit=limit,
        offset=offset,
        tenant=seen_tenant(reader),
    )
    return OverridesPublic(data=[_public(r) for r in records], count=count)


@router.get(
    "/{override_id}", response_model=OverridePublic, responses={**READ_ERRORS, **_NO_OVERRIDE}
)
def get_override(session: SessionDep, override_id: IdPath, reader: ReaderDep) -> OverridePublic:
    """One override (with ``reads=tenant``, one on another tenant's job is a 404)."""
    record = None
    if override_id <= MAX_ROW_ID:  # none has a larger id (a query for one is an error)
        record = repo.get_override(session=session, override_id=override_id)
    tenant = seen_tenant(reader)
    if (
        record is not None
        and tenant is not None
        and repo.job_tenant(session=session, job_id=record.job_id) != tenant
    ):
        record = None
    if record is None:
        raise HTTPException(status_code=404, detail=f"no override {override_id}")
    return _public(record)


@router.delete(
    "/{override_id}",
    response_model=OverridePublic,
    responses={**WRITE_ERRORS, **_NO_OVERRIDE},
)
def delete_override(
    session: SessionDep, override_id: IdPath, principal: WriterDep
) -> OverridePublic:
    """End an override now (an admin's token: any; a member's: one on its tenant's
    job); the policy takes the job over at the next tick."""
    record = None
    if override_id <= MAX_ROW_ID:  # none has a larger id (a query for one is an error)
        record = repo.get_override(session=session, override_id=override_id)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no override {override_id}")
    job = repo.get_job(session=session, job_id=record.job_id)
    acting_for(principal, DEFAULT_TENANT if job is None else job.spec.tenant, "its job")
    ended = repo.delete_override(session=session, override_id=override_id)
    assert ended is not None
    return _public(ended)
