"""service: job tasks and cancellation, decision explanations, API token hash

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 11:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("task", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("cancel_requested_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("explanation", sa.JSON(), nullable=True))
    with op.batch_alter_table("overrides", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_overrides_expires_at"), ["expires_at"], unique=False)
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_api_tokens_token_sha256")),
    )


def downgrade() -> None:
    op.drop_table("api_tokens")
    with op.batch_alter_table("overrides", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_overrides_expires_at"))
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_column("explanation")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("cancel_requested_at")
        batch_op.drop_column("task")
