"""transitions.packed: old logged rounds compacted by retention (their JSON columns as
one zlib-compressed blob)

Revision ID: 0008_transition_compaction
Revises: 0007_policy_lifecycle
Create Date: 2026-12-01 01:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_transition_compaction"
down_revision: str | None = "0007_policy_lifecycle"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("packed", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.drop_column("packed")
