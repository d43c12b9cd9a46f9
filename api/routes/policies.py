from __future__ import annotations

from fastapi import APIRouter, HTTPException

from autotune.api.deps import SessionDep
from autotune.api.schemas import PoliciesPublic, PolicyPublic
from autotune.db import repository as repo

router = APIRouter(prefix="/policies", tags=["policies"])


def _public(record: repo.PolicyVersionRecord) -> PolicyPublic:
    return PolicyPublic(
        version=record.version,
        kind=record.kind,
        checkpoint_path=record.checkpoint_path,
        active=record.active,
        metrics=record.metrics,
        created_at=record.created_at,
    )


@router.get("", response_model=PoliciesPublic)
def list_policies(session: SessionDep) -> PoliciesPublic:
    """Every policy version the daemon has run, newest first."""
    records = repo.list_policy_versions(session=session)
    return PoliciesPublic(data=[_public(r) for r in records], count=len(records))


@router.get("/active", response_model=PolicyPublic)
def active_policy(session: SessionDep) -> PolicyPublic:
    """The policy version that decides now."""
    for record in repo.list_policy_versions(session=session):
        if record.active:
            return _public(record)
    raise HTTPException(status_code=404, detail="no active policy: the daemon has not started")
