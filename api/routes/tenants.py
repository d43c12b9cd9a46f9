"""Tenants: the teams sharing the cluster, their GPU quotas and what they hold now. Read
by anyone (as jobs are); created and changed by an admin's token."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request
from sqlalchemy.orm import Session

from autotune.api.deps import (
    BODY_ERRORS,
    READ_ERRORS,
    AdminTokenDep,
    SessionDep,
    in_session,
    problem,
    unprocessable,
)
from autotune.api.schemas import TenantCreate, TenantPublic, TenantsPublic, TenantUpdate
from autotune.core import ID_PATTERN, Placement, TenantSpec
from autotune.db import repository as repo
from autotune.errors import FieldError
from autotune.serde import to_json

router = APIRouter(prefix="/tenants", tags=["tenants"])

TenantPath = Annotated[
    str, Path(pattern=ID_PATTERN, description="A tenant's name: 1-128 of [A-Za-z0-9._:-]")
]
_NO_TENANT: dict[int | str, dict[str, Any]] = {404: problem("No tenant with that name")}


def _public(record: repo.TenantRecord, held: dict[str, float]) -> TenantPublic:
    spec = record.spec
    return TenantPublic(
        name=spec.name,
        gpus=spec.gpus,
        gpus_by_model=dict(spec.gpus_by_model),
        nominal_gpus=spec.nominal_gpus,
        borrow=spec.borrow,
        lend=spec.lend,
        weight=spec.weight,
        gpus_held=round(sum(held.values()), 3),
        gpus_held_by_model={model: round(n, 3) for model, n in sorted(held.items())},
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


def read_tenants(
    session: Session, placements: Mapping[str, Placement] | None = None
) -> list[TenantPublic]:
    """Every tenant, by name, with the GPUs its running jobs hold now (``GET /tenants``
    and the dashboard; ``placements``: the running jobs', when read already)."""
    usage = repo.tenant_usage(session=session, placements=placements)
    return [_public(r, usage.get(r.spec.name, {})) for r in repo.list_tenants(session=session)]


def _spec(**fields: Any) -> TenantSpec:
    try:
        spec = TenantSpec(**fields)
    except FieldError as exc:
        raise unprocessable(exc.field.split("[")[0], str(exc)) from None
    why = spec.overpromised()
    if why is not None:
        raise unprocessable("gpus_by_model", f"TenantSpec.gpus_by_model: {why}")
    return spec


@router.get("", response_model=TenantsPublic, responses=READ_ERRORS)
async def list_tenants(request: Request) -> TenantsPublic:
    """Every tenant with its quota and the GPUs its running jobs hold now."""

    def read(session: Session) -> TenantsPublic:
        return TenantsPublic(data=read_tenants(session))

    return await in_session(request, read)


@router.get("/{name}", response_model=TenantPublic, responses={**READ_ERRORS, **_NO_TENANT})
def get_tenant(session: SessionDep, name: TenantPath) -> TenantPublic:
    """One tenant, with the GPUs its running jobs hold now."""
    record = repo.get_tenant(session=session, name=name)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no tenant {name!r}")
    return _public(record, repo.tenant_usage(session=session).get(name, {}))


@router.post(
    "",
    response_model=TenantPublic,
    status_code=201,
    dependencies=[AdminTokenDep],
    responses={**BODY_ERRORS, 409: problem("A tenant with that name exists")},
)
def create_tenant(session: SessionDep, body: TenantCreate) -> TenantPublic:
    """Create a tenant (an admin's token): its nominal GPU quota, whether it borrows
    idle GPUs and lends its own, its fair-share weight. Then issue its tokens
    (``POST /tokens``)."""
    spec = _spec(**body.model_dump())
    record = repo.create_tenant(session=session, spec=spec)
    if record is None:
        raise HTTPException(status_code=409, detail=f"tenant {body.name!r} exists")
    return _public(record, {})


@router.patch(
    "/{name}",
    response_model=TenantPublic,
    dependencies=[AdminTokenDep],
    responses={**BODY_ERRORS, **_NO_TENANT},
)
def update_tenant(session: SessionDep, name: TenantPath, body: TenantUpdate) -> TenantPublic:
    """Change a tenant's quota, borrowing, lending or weight (an admin's token); fields
    left out keep their value. The decision step uses the new values from its next
    tick."""
    record = repo.get_tenant(session=session, name=name)
    if record is None:
        raise HTTPException(status_code=404, detail=f"no tenant {name!r}")
    changes = body.model_dump(exclude_none=True)
    spec = _spec(**{**to_json(record.spec), **changes})
    updated = repo.update_tenant(session=session, spec=spec)
    assert updated is not None
    return _public(updated, repo.tenant_usage(session=session).get(name, {}))
