"""job events: what happened to each job on the backend while it trained (a node lost,
a resume, precision raised by the guard, batch shares moved), kept as decisions are

Revision ID: 0014_job_events
Revises: 0013_tenants
Create Date: 2026-12-05 19:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_job_events"
down_revision: str | None = "0013_tenants"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_events_job_id_id", "job_events", ["job_id", "id"])
    op.create_index(op.f("ix_job_events_at"), "job_events", ["at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_job_events_at"), table_name="job_events")
    op.drop_index("ix_job_events_job_id_id", table_name="job_events")
    op.drop_table("job_events")
