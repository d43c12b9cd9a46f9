"""node state: a node the backend reports gone is kept as lost, with when

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 18:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("state", sa.String(length=16), nullable=False, server_default="alive")
        )
        batch_op.add_column(sa.Column("lost_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("lost_at")
        batch_op.drop_column("state")
