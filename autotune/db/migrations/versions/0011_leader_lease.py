"""leader_lease, leader_terms and decisions.term: several daemons on one database, one of
them deciding (``autotune.db.lease``)

Revision ID: 0011_leader_lease
Revises: 0010_job_performance
Create Date: 2026-12-01 08:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_leader_lease"
down_revision: str | None = "0010_job_performance"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    lease = op.create_table(
        "leader_lease",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=256), nullable=True),
        sa.Column("term", sa.Integer(), nullable=False),
        sa.Column("expires_at_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leader_lease")),
    )
    op.bulk_insert(
        lease, [{"name": "decision-loop", "holder": None, "term": 0, "expires_at_s": 0.0}]
    )
    op.create_table(
        "leader_terms",
        sa.Column("term", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("holder", sa.String(length=256), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("term", name=op.f("pk_leader_terms")),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("term", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_column("term")
    op.drop_table("leader_terms")
    op.drop_table("leader_lease")
