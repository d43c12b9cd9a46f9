"""listing indexes: each filter of a listing together with its order, so a page is one
index range whatever the history's length; decisions by override, for retention

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 21:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, old single-column index, its column, new index, its columns)
_REPLACED = [
    (
        "jobs",
        "ix_jobs_state",
        "state",
        "ix_jobs_state_submitted_at_job_id",
        ["state", "submitted_at", "job_id"],
    ),
    ("decisions", "ix_decisions_job_id", "job_id", "ix_decisions_job_id_id", ["job_id", "id"]),
    ("decisions", "ix_decisions_source", "source", "ix_decisions_source_id", ["source", "id"]),
    ("metrics", "ix_metrics_name", "name", "ix_metrics_name_id", ["name", "id"]),
    ("metrics", "ix_metrics_job_id", "job_id", "ix_metrics_job_id_id", ["job_id", "id"]),
]


def upgrade() -> None:
    for table, old, _column, new, columns in _REPLACED:
        op.create_index(new, table, columns, unique=False)
        op.drop_index(old, table_name=table)
    op.create_index("ix_jobs_submitted_at_job_id", "jobs", ["submitted_at", "job_id"], unique=False)
    op.create_index("ix_decisions_override_id", "decisions", ["override_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_decisions_override_id", table_name="decisions")
    op.drop_index("ix_jobs_submitted_at_job_id", table_name="jobs")
    for table, old, column, new, _columns in reversed(_REPLACED):
        op.create_index(old, table, [column], unique=False)
        op.drop_index(new, table_name=table)
