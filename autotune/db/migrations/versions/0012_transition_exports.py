"""transition_exports: which logged transitions an export covered (retention keeps the
others longer)

Revision ID: 0012_transition_exports
Revises: 0011_leader_lease
Create Date: 2026-12-01 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_transition_exports"
down_revision: str | None = "0011_leader_lease"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "transition_exports",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("first_id", sa.Integer(), nullable=False),
        sa.Column("last_id", sa.Integer(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("exported_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transition_exports")),
    )


def downgrade() -> None:
    op.drop_table("transition_exports")
