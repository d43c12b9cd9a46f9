"""Tenants: the teams or users sharing the cluster, with their GPU quotas."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from autotune.core import DEFAULT_TENANT, MILLI_PER_GPU, Placement, TenantSpec, utc_now
from autotune.db.repository.decisions import running_placements
from autotune.db.tables import JobRow, NodeRow, TenantRow

__all__ = [
    "TenantRecord",
    "create_tenant",
    "get_tenant",
    "list_tenants",
    "tenant_usage",
    "update_tenant",
]


@dataclass(frozen=True, slots=True)
class TenantRecord:
    spec: TenantSpec
    created_at: datetime
    updated_at: datetime


def _record(row: TenantRow) -> TenantRecord:
    spec = TenantSpec(
        name=row.name,
        gpus=row.gpus,
        gpus_by_model={str(k): int(v) for k, v in row.gpus_by_model.items()},
        borrow=row.borrow,
        lend=row.lend,
        weight=row.weight,
    )
    return TenantRecord(spec=spec, created_at=row.created_at, updated_at=row.updated_at)


def get_tenant(*, session: Session, name: str) -> TenantRecord | None:
    row = session.get(TenantRow, name)
    return None if row is None else _record(row)


def list_tenants(*, session: Session) -> list[TenantRecord]:
    """Every tenant, by name (a cluster has a handful: no paging)."""
    return [_record(row) for row in session.scalars(select(TenantRow).order_by(TenantRow.name))]


def create_tenant(*, session: Session, spec: TenantSpec) -> TenantRecord | None:
    """A new tenant; ``None`` when the name is taken."""
    if session.get(TenantRow, spec.name) is not None:
        return None
    now = utc_now()
    row = TenantRow(
        name=spec.name,
        gpus=spec.gpus,
        gpus_by_model=dict(spec.gpus_by_model),
        borrow=spec.borrow,
        lend=spec.lend,
        weight=spec.weight,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    session.flush()
    return _record(row)


def update_tenant(*, session: Session, spec: TenantSpec) -> TenantRecord | None:
    """Replace a tenant's quota, borrowing, lending and weight; ``None`` when none is
    named so."""
    row = session.get(TenantRow, spec.name)
    if row is None:
        return None
    row.gpus, row.gpus_by_model = spec.gpus, dict(spec.gpus_by_model)
    row.borrow, row.lend, row.weight = spec.borrow, spec.lend, spec.weight
    row.updated_at = utc_now()
    return _record(row)


def tenant_usage(
    *, session: Session, placements: Mapping[str, Placement] | None = None
) -> dict[str, dict[str, float]]:
    """GPUs each tenant's running jobs hold now, per GPU model (fractions count), by the
    placement of each running job's newest decision (``placements``: those, when the
    caller has read them already with ``running_placements``)."""
    if placements is None:
        placements = running_placements(session=session)
    if not placements:
        return {}
    models = {
        node_id: model
        for node_id, model in session.execute(select(NodeRow.node_id, NodeRow.gpu_model))
    }
    owners = {
        job_id: tenant
        for job_id, tenant in session.execute(
            select(JobRow.job_id, JobRow.tenant).where(JobRow.job_id.in_(list(placements)))
        )
    }
    usage: dict[str, dict[str, float]] = {}
    for job_id, placement in placements.items():
        held = usage.setdefault(owners.get(job_id, DEFAULT_TENANT), {})
        for slot in placement.ranks:
            model = models.get(slot.node_id, "unknown")
            held[model] = held.get(model, 0.0) + slot.gpu_milli / MILLI_PER_GPU
    return usage
