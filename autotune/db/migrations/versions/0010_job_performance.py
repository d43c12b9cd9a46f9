"""jobs.performance: each job's throughput model fitted online from its measured steps

Revision ID: 0010_job_performance
Revises: 0009_decision_preempt
Create Date: 2026-12-01 02:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_job_performance"
down_revision: str | None = "0009_decision_preempt"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("performance", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("performance")
