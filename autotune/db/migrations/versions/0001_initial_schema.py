"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 09:53:04.608362
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("state_reason", sa.Text(), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_state"), ["state"], unique=False)

    op.create_table(
        "metrics",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metrics")),
    )
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_metrics_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_metrics_name"), ["name"], unique=False)
        batch_op.create_index(batch_op.f("ix_metrics_recorded_at"), ["recorded_at"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("node_id", sa.String(length=128), nullable=False),
        sa.Column("gpu_model", sa.String(length=64), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_nodes")),
    )
    op.create_table(
        "policy_versions",
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("checkpoint_path", sa.Text(), nullable=True),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_policy_versions")),
    )
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
        batch_op.create_index(batch_op.f("ix_transitions_created_at"), ["created_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_transitions_policy_version"), ["policy_version"], unique=False
        )

    op.create_table(
        "overrides",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("pin", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"], name=op.f("fk_overrides_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_overrides")),
    )
    with op.batch_alter_table("overrides", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_overrides_job_id"), ["job_id"], unique=False)

    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=128), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("policy_version", sa.String(length=128), nullable=False),
        sa.Column("decided_at", sa.DateTime(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=True),
        sa.Column("override_id", sa.Integer(), nullable=True),
        sa.Column("applied_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"], name=op.f("fk_decisions_job_id_jobs")),
        sa.ForeignKeyConstraint(
            ["override_id"], ["overrides.id"], name=op.f("fk_decisions_override_id_overrides")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decisions")),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_decisions_decided_at"), ["decided_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_decisions_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_decisions_source"), ["source"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_decisions_source"))
        batch_op.drop_index(batch_op.f("ix_decisions_job_id"))
        batch_op.drop_index(batch_op.f("ix_decisions_decided_at"))

    op.drop_table("decisions")
    with op.batch_alter_table("overrides", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_overrides_job_id"))

    op.drop_table("overrides")
    with op.batch_alter_table("transitions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_transitions_policy_version"))
        batch_op.drop_index(batch_op.f("ix_transitions_created_at"))

    op.drop_table("transitions")
    op.drop_table("policy_versions")
    op.drop_table("nodes")
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_metrics_recorded_at"))
        batch_op.drop_index(batch_op.f("ix_metrics_name"))
        batch_op.drop_index(batch_op.f("ix_metrics_job_id"))

    op.drop_table("metrics")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_state"))

    op.drop_table("jobs")
