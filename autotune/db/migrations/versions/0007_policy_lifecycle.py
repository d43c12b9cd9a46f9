"""policy lifecycle: versions get a name, their checkpoint's content hash, a shadow flag
and when they were last activated; policy_events records what happened to them (so a
rollback knows the version active before); decisions by policy version, for the filter

Revision ID: 0007_policy_lifecycle
Revises: 0006_transitions
Create Date: 2026-12-01 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_policy_lifecycle"
down_revision: str | None = "0006_transitions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("policy_versions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("name", sa.String(length=128), nullable=False, server_default="")
        )
        batch_op.add_column(sa.Column("content_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(
            sa.Column("shadow", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("activated_at", sa.DateTime(), nullable=True))
        batch_op.create_index("ix_policy_versions_content_hash", ["content_hash"], unique=False)
    # Versions recorded before names existed are named after themselves.
    op.execute("UPDATE policy_versions SET name = version WHERE name = ''")
    op.create_table(
        "policy_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_policy_events")),
    )
    op.create_index("ix_policy_events_version_id", "policy_events", ["version", "id"], unique=False)
    op.create_index(
        "ix_decisions_policy_version_id", "decisions", ["policy_version", "id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_decisions_policy_version_id", table_name="decisions")
    op.drop_index("ix_policy_events_version_id", table_name="policy_events")
    op.drop_table("policy_events")
    with op.batch_alter_table("policy_versions", schema=None) as batch_op:
        batch_op.drop_index("ix_policy_versions_content_hash")
        batch_op.drop_column("activated_at")
        batch_op.drop_column("shadow")
        batch_op.drop_column("content_hash")
        batch_op.drop_column("name")
