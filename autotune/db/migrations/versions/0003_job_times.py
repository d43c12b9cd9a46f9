"""job times: when a job started and finished, by the daemon's clock and the backend's

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("started_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("finished_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("sim_submitted_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("sim_started_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("sim_finished_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("sim_finished_s")
        batch_op.drop_column("sim_started_s")
        batch_op.drop_column("sim_submitted_s")
        batch_op.drop_column("finished_at")
        batch_op.drop_column("started_at")
