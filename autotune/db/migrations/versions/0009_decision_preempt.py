"""decisions.preempt: a decision that stops a running job to wait again (Tiresias'
least-attained-service queues preempt)

Revision ID: 0009_decision_preempt
Revises: 0008_transition_compaction
Create Date: 2026-12-01 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_decision_preempt"
down_revision: str | None = "0008_transition_compaction"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("preempt", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_column("preempt")
