"""Schemas of tenants (the teams sharing the cluster, their quotas and use), their
tokens, and the audit log of what each token did."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field

from autotune.api.schemas.common import INTEGRAL, LINE_PATTERN, MAX_GPUS, Paged, StrictRequest
from autotune.core import ID_PATTERN
from autotune.daemon.auth import Role

__all__ = [
    "AuditEntryPublic",
    "AuditPublic",
    "PrincipalPublic",
    "TenantCreate",
    "TenantPublic",
    "TenantUpdate",
    "TenantsPublic",
    "TokenCreate",
    "TokenIssued",
    "TokenPublic",
    "TokensPublic",
]

GpuCount = Annotated[int, Field(ge=0, le=MAX_GPUS), INTEGRAL]
ModelName = Annotated[str, Field(min_length=1, max_length=64)]
"""A GPU model's name, as the nodes report it (``A100``, ``H100``)."""

_GPUS = "Nominal quota: GPUs promised to the tenant over all models when it has work for them"
_BY_MODEL = (
    "Part of the quota promised on given GPU models ({model: count}), kept on those "
    "models: at most gpus in all; where gpus is 0, the whole quota"
)
_BORROW = "Its jobs may use GPUs beyond its quota that others leave idle"
_LEND = "Others may use its idle nominal GPUs, taken back (by preemption) when its jobs arrive"
_WEIGHT = "Its share of what is left over between borrowing tenants (fair share)"


class TenantUpdate(StrictRequest):
    """What an admin may change of a tenant (absent fields keep their value)."""

    gpus: GpuCount | None = Field(default=None, description=_GPUS)
    gpus_by_model: dict[ModelName, GpuCount] | None = Field(
        default=None, max_length=64, description=_BY_MODEL
    )
    borrow: bool | None = Field(default=None, description=_BORROW)
    lend: bool | None = Field(default=None, description=_LEND)
    weight: float | None = Field(default=None, gt=0, le=1e6, description=_WEIGHT)


class TenantCreate(StrictRequest):
    name: str = Field(pattern=ID_PATTERN, description="1-128 characters of [A-Za-z0-9._:-]")
    gpus: GpuCount = Field(default=0, description=_GPUS)
    gpus_by_model: dict[ModelName, GpuCount] = Field(
        default_factory=dict, max_length=64, description=_BY_MODEL
    )
    borrow: bool = Field(default=True, description=_BORROW)
    lend: bool = Field(default=True, description=_LEND)
    weight: float = Field(default=1.0, gt=0, le=1e6, description=_WEIGHT)


class TenantPublic(BaseModel):
    name: str
    gpus: int = Field(description=_GPUS)
    gpus_by_model: dict[str, int] = Field(description=_BY_MODEL)
    nominal_gpus: int = Field(description="GPUs promised in all (gpus, or the sum by model)")
    borrow: bool = Field(description=_BORROW)
    lend: bool = Field(description=_LEND)
    weight: float = Field(description=_WEIGHT)
    gpus_held: float = Field(description="GPUs its running jobs hold now (fractions count)")
    gpus_held_by_model: dict[str, float] = Field(description="gpus_held per GPU model")
    created_at: datetime
    updated_at: datetime


class TenantsPublic(BaseModel):
    data: list[TenantPublic]


class TokenCreate(StrictRequest):
    tenant: str = Field(pattern=ID_PATTERN, description="Whose token it is (must exist)")
    role: Role = Field(
        description="admin: everything, tenants, tokens and policies included; member: "
        "submits, cancels and overrides its tenant's jobs; viewer: reads only"
    )
    name: str = Field(
        default="",
        max_length=128,
        pattern=LINE_PATTERN,
        description="What the token is for, for people and the audit log",
    )
    expires_in_s: Annotated[int, Field(ge=60, le=10 * 365 * 86_400), INTEGRAL] | None = Field(
        default=None, description="Seconds until it stops working (default: never)"
    )


class TokenPublic(BaseModel):
    id: int
    tenant: str
    role: Role
    name: str
    created_at: datetime
    expires_at: datetime | None = Field(description="null: never")
    revoked_at: datetime | None
    rotated_at: datetime | None = Field(description="When its secret was last replaced")
    created_by: int | None = Field(
        description="The token that issued it (null: the daemon or the command line)"
    )
    usable: bool = Field(description="Neither revoked nor expired now")


class TokenIssued(TokenPublic):
    token: str = Field(
        description="The token itself: shown this once, only its SHA-256 hash is stored"
    )


class TokensPublic(BaseModel):
    data: list[TokenPublic]


class AuditEntryPublic(BaseModel):
    id: int
    at: datetime
    token_id: int | None = Field(
        description="Which token (null: none, an unknown one, or AUTOTUNE_TOKEN's)"
    )
    token_name: str | None
    tenant: str | None
    role: Role | None
    method: str
    path: str
    status: int = Field(description="The answer's HTTP status: 401 and 403 are refusals")


class AuditPublic(Paged):
    data: list[AuditEntryPublic]


class PrincipalPublic(BaseModel):
    """Who the presented token is."""

    tenant: str
    role: Role
    token_id: int | None = Field(description="null: the daemon's AUTOTUNE_TOKEN")
    token_name: str
