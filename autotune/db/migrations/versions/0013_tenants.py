"""tenants, scoped API tokens and the audit log: every token belongs to a tenant with a
role; the tokens stored before become the admins of the ``default`` tenant, which owns
every job submitted before

Revision ID: 0013_tenants
Revises: 0012_transition_exports
Create Date: 2026-12-04 16:00:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0013_tenants"
down_revision: str | None = "0012_transition_exports"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    tenants = op.create_table(
        "tenants",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpus_by_model", sa.JSON(), nullable=False),
        sa.Column("borrow", sa.Boolean(), nullable=False),
        sa.Column("lend", sa.Boolean(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_tenants")),
    )
    now = datetime.now(UTC).replace(tzinfo=None)
    op.bulk_insert(
        tenants,
        [
            {
                "name": "default",
                "gpus": 0,
                "gpus_by_model": {},
                "borrow": True,
                "lend": True,
                "weight": 1.0,
                "created_at": now,
                "updated_at": now,
            }
        ],
    )
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("tenant", sa.String(length=128), server_default="default", nullable=False)
        )
        batch_op.add_column(
            sa.Column("role", sa.String(length=16), server_default="admin", nullable=False)
        )
        batch_op.add_column(
            sa.Column("name", sa.String(length=128), server_default="", nullable=False)
        )
        batch_op.add_column(sa.Column("expires_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("revoked_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("rotated_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("created_by", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_api_tokens_tenant_tenants"), "tenants", ["tenant"], ["name"]
        )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("tenant", sa.String(length=128), server_default="default", nullable=False)
        )
        batch_op.create_index(
            "ix_jobs_tenant_submitted_at_job_id", ["tenant", "submitted_at", "job_id"]
        )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("token_name", sa.String(length=128), nullable=True),
        sa.Column("tenant", sa.String(length=128), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=True),
        sa.Column("method", sa.String(length=8), nullable=False),
        sa.Column("path", sa.String(length=512), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index("ix_audit_log_token_id_id", ["token_id", "id"])
        batch_op.create_index("ix_audit_log_tenant_id", ["tenant", "id"])


def downgrade() -> None:
    op.drop_table("audit_log")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_tenant_submitted_at_job_id")
        batch_op.drop_column("tenant")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_api_tokens_tenant_tenants"), type_="foreignkey")
        for column in (
            "created_by",
            "rotated_at",
            "revoked_at",
            "expires_at",
            "name",
            "role",
            "tenant",
        ):
            batch_op.drop_column(column)
    op.drop_table("tenants")
