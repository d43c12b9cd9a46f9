"""transitions as offline learning needs them: one row per decision round with the
compressed observation, each acted slot's entries, mask and log-probabilities, the
exploration floor, the reward filled in at the next round, episode and step (the old
table had no writer; its rows are dropped)

Revision ID: 0006_transitions
Revises: 0005
Create Date: 2026-12-01 00:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_transitions"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.drop_index("ix_transitions_policy_version")
        batch_op.drop_index("ix_transitions_created_at")
    op.drop_table("transitions")
    op.create_table(
        "transitions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("episode", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("policy_version", sa.String(length=128), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=False),
        sa.Column("sim_time_s", sa.Float(), nullable=True),
        sa.Column("observation", sa.LargeBinary(), nullable=False),
        sa.Column("slots", sa.JSON(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("reward_parts", sa.JSON(), nullable=True),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transitions")),
    )
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.create_index("ix_transitions_created_at", ["created_at"], unique=False)
        batch_op.create_index("ix_transitions_policy_version", ["policy_version"], unique=False)
        batch_op.create_index("ix_transitions_episode_step", ["episode", "step"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.drop_index("ix_transitions_episode_step")
        batch_op.drop_index("ix_transitions_policy_version")
        batch_op.drop_index("ix_transitions_created_at")
    op.drop_table("transitions")
    op.create_table(
        "transitions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("policy_version", sa.String(length=128), nullable=False),
        sa.Column("observation", sa.JSON(), nullable=False),
        sa.Column("action", sa.JSON(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=False),
        sa.Column("next_observation", sa.JSON(), nullable=False),
        sa.Column("action_logp", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transitions")),
    )
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.create_index("ix_transitions_created_at", ["created_at"], unique=False)
        batch_op.create_index("ix_transitions_policy_version", ["policy_version"], unique=False)
