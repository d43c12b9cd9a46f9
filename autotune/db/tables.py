"""Database tables (SQLAlchemy 2.0 typed models). Schema changes go through Alembic
(``autotune/db/migrations``); ``tests/unit/autotune/db/test_storage.py`` checks the two agree."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "ApiTokenRow",
    "AuditRow",
    "Base",
    "DecisionRow",
    "JobRow",
    "LeaderLeaseRow",
    "LeaderTermRow",
    "MetricRow",
    "NodeRow",
    "OverrideRow",
    "PolicyEventRow",
    "PolicyVersionRow",
    "TenantRow",
    "TransitionExportRow",
    "TransitionRow",
]

JsonDict = dict[str, Any]


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite keeps no zone: store naive
    UTC, hand back aware UTC)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: autotune stores UTC-aware times")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map: ClassVar[dict[Any, Any]] = {JsonDict: JSON, datetime: UTCDateTime}


class NodeRow(Base):
    """A node of the cluster as the daemon last saw it."""

    __tablename__ = "nodes"

    node_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpu_model: Mapped[str] = mapped_column(String(64))
    gpu_count: Mapped[int] = mapped_column(Integer)
    info: Mapped[JsonDict]
    """The ``NodeInfo``, as ``autotune.serde.to_json`` writes it."""
    updated_at: Mapped[datetime]
    state: Mapped[str] = mapped_column(String(16), default="alive", server_default="alive")
    """``alive``; ``parked`` or ``waking`` (provisioning powered it down, or powers it up);
    ``lost``: the backend reports the node gone. Jobs are placed on alive nodes only."""
    lost_at: Mapped[datetime | None]
    """When the daemon first saw the node lost; ``None`` while it is alive."""


class JobRow(Base):
    __tablename__ = "jobs"
    # The listing's order (newest first), alone and within a state.
    __table_args__ = (
        Index("ix_jobs_submitted_at_job_id", "submitted_at", "job_id"),
        Index("ix_jobs_state_submitted_at_job_id", "state", "submitted_at", "job_id"),
        Index("ix_jobs_tenant_submitted_at_job_id", "tenant", "submitted_at", "job_id"),
    )

    job_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    spec: Mapped[JsonDict]
    """The ``JobSpec``."""
    tenant: Mapped[str] = mapped_column(String(128), default="default", server_default="default")
    """``JobSpec.tenant``, as a column: listings filter by it."""
    state: Mapped[str] = mapped_column(String(16))
    """pending, running, finished, failed or cancelled."""
    state_reason: Mapped[str] = mapped_column(Text, default="")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    """Fraction of the job's work done, 0 to 1."""
    submitted_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    task: Mapped[JsonDict | None]
    """What the job trains: ``{"name": task, "steps": n, "origin": "api" | backend}``;
    ``None`` when the backend did not say (then the job cannot resume after a restart)."""
    cancel_requested_at: Mapped[datetime | None]
    """Set by ``DELETE /jobs/{id}``; the daemon cancels the job at its next tick."""
    started_at: Mapped[datetime | None]
    """When the daemon first saw the job running (or decided it so)."""
    finished_at: Mapped[datetime | None]
    """When the daemon first saw the job in a final state: finished, failed, cancelled."""
    sim_submitted_s: Mapped[float | None] = mapped_column(Float)
    """Submission time on the backend's clock (``JobSpec.submitted_at``)."""
    sim_started_s: Mapped[float | None] = mapped_column(Float)
    """When the job first ran, on the backend's clock (``JobStatus.started_s``)."""
    sim_finished_s: Mapped[float | None] = mapped_column(Float)
    """When the job reached a final state, on the backend's clock (``JobStatus.finished_s``)."""
    performance: Mapped[JsonDict | None]
    """The job's throughput model fitted online from its measured steps (points, fit
    error, coefficients, source: ``autotune.daemon.performance``); ``None``: no step
    measured yet."""


class DecisionRow(Base):
    __tablename__ = "decisions"
    # Each filter of the listing with its order (newest first): a page is one index range.
    __table_args__ = (
        Index("ix_decisions_job_id_id", "job_id", "id"),
        Index("ix_decisions_source_id", "source", "id"),
        Index("ix_decisions_policy_version_id", "policy_version", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"))
    source: Mapped[str] = mapped_column(String(16))
    policy_version: Mapped[str] = mapped_column(String(128))
    decided_at: Mapped[datetime] = mapped_column(index=True)
    reason: Mapped[str] = mapped_column(Text)
    config: Mapped[JsonDict]
    placement: Mapped[JsonDict | None]
    override_id: Mapped[int | None] = mapped_column(ForeignKey("overrides.id"), index=True)
    """Indexed: retention checks that no decision refers to an override it deletes."""
    applied_at: Mapped[datetime | None]
    """Set once the backend has applied the decision; committed before that."""
    explanation: Mapped[JsonDict | None]
    """Features that mattered, alternatives with predicted goodput, why this one won."""
    preempt: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """The job was stopped to wait again (``Decision.preempt``)."""
    term: Mapped[int | None] = mapped_column(Integer)
    """The leader term (fencing token, ``autotune.db.lease``) of the daemon that stored it;
    ``None``: stored without a lease (a decision loop run on its own, in tests or tools)."""


class OverrideRow(Base):
    __tablename__ = "overrides"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.job_id"), index=True)
    pin: Mapped[JsonDict]
    """The subset of the job's config or placement the user pinned."""
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime] = mapped_column(index=True)
    deleted_at: Mapped[datetime | None]


class TransitionRow(Base):
    """One decision round of the acting policy, as offline learning needs it
    (``autotune.replay.log`` writes it, ``autotune.replay.export`` reads it).

    The round's observation is stored once (float32, compressed, trimmed to the header and
    the occupied slots); ``slots`` holds, per acted slot, the job, whether it ran, the
    entries taken, which mattered, their log-probabilities under the acting policy, and
    whether the policy's choice was the one applied (not an override's or a fallback's).
    The reward of a round is what the round after it produced: it is filled in at the
    next tick, with each job's own part and whether the job ended."""

    __tablename__ = "transitions"
    __table_args__ = (Index("ix_transitions_episode_step", "episode", "step", unique=True),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    episode: Mapped[str] = mapped_column(String(64))
    """A stretch of consecutive rounds of one daemon run (``<run>-<number>``)."""
    step: Mapped[int] = mapped_column(Integer)
    """The round's number within its episode, from 0."""
    policy_version: Mapped[str] = mapped_column(String(128), index=True)
    epsilon: Mapped[float] = mapped_column(Float)
    """The acting policy's exploration floor."""
    sim_time_s: Mapped[float | None] = mapped_column(Float)
    """The backend's clock at the decision, where it keeps one."""
    observation: Mapped[bytes] = mapped_column(LargeBinary)
    """zlib-compressed float32: the header and the occupied slots of the observation."""
    slots: Mapped[JsonDict]
    """``{"jobs", "running", "entries", "mask", "logp", "applied"}``, one item per slot."""
    reward: Mapped[float | None] = mapped_column(Float)
    """The round's reward (``autotune.envs.cluster_env.reward``); ``None`` until the next
    tick measures it."""
    reward_parts: Mapped[JsonDict | None]
    """``{"cluster": parts, "jobs": {job_id: {"reward", parts..., "ended"}}}``."""
    packed: Mapped[bytes | None] = mapped_column(LargeBinary)
    """A compacted row (retention, after ``transitions_compact_days``): ``slots`` and
    ``reward_parts`` as zlib-compressed JSON, ``{"slots", "reward_parts"}``; ``slots`` is
    then ``{}`` and ``reward_parts`` ``None`` (``repository.transition_payload`` reads
    either form)."""
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    """The episode ends here without the next round measured (the daemon stopped, or the
    episode reached its length)."""
    created_at: Mapped[datetime] = mapped_column(index=True)
    """When the round was decided."""


class TransitionExportRow(Base):
    """A range of logged transitions written out by ``autotune replay export``:
    retention deletes a transition past ``transitions_days`` only once an export covered
    it (and any past ``transitions_unexported_days``)."""

    __tablename__ = "transition_exports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    first_id: Mapped[int] = mapped_column(Integer)
    """The first and last transition ids the export read (every one in between)."""
    last_id: Mapped[int] = mapped_column(Integer)
    rounds: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    exported_at: Mapped[datetime]


class MetricRow(Base):
    __tablename__ = "metrics"
    __table_args__ = (
        Index("ix_metrics_name_id", "name", "id"),
        Index("ix_metrics_job_id_id", "job_id", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    value: Mapped[float] = mapped_column(Float)
    job_id: Mapped[str | None] = mapped_column(String(128))
    labels: Mapped[JsonDict]
    recorded_at: Mapped[datetime] = mapped_column(index=True)


class PolicyVersionRow(Base):
    """A policy the daemon can decide with: the registry of versions
    (``autotune.daemon.lifecycle``). At most one is active (it decides) and at most one
    is the shadow (it decides the same rounds beside it; its decisions are stored, never
    applied)."""

    __tablename__ = "policy_versions"

    version: Mapped[str] = mapped_column(String(128), primary_key=True)
    """``<kind>-<first 12 hex digits of content_hash>`` for a checkpoint; the rules' own."""
    kind: Mapped[str] = mapped_column(String(32))
    """rules, ppo, bc, ..."""
    checkpoint_path: Mapped[str | None] = mapped_column(Text)
    active: Mapped[bool] = mapped_column(Boolean, default=False)
    metrics: Mapped[JsonDict]
    created_at: Mapped[datetime]
    name: Mapped[str] = mapped_column(String(128), default="", server_default="")
    """A person's name for it ("ppo-march-retrain"); the version when none was given."""
    content_hash: Mapped[str | None] = mapped_column(String(64), index=True)
    """SHA-256 of the checkpoint's content (``policies.serving.checkpoint_hash``): the
    same weights register once, wherever they are stored. ``None``: no checkpoint."""
    shadow: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    activated_at: Mapped[datetime | None]
    """When it last became the active version."""


class PolicyEventRow(Base):
    """What happened to policy versions, oldest first: registered, activated, shadowed,
    unshadowed, rolled back, or failed to load (with the reason). An activation's
    ``detail["previous"]`` is the version active before it, so a rollback knows where to
    go back to."""

    __tablename__ = "policy_events"
    __table_args__ = (Index("ix_policy_events_version_id", "version", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))
    """register, activate, rollback, shadow, unshadow, activate_failed, shadow_failed."""
    at: Mapped[datetime]
    detail: Mapped[JsonDict]


class TenantRow(Base):
    """A team or user sharing the cluster (``autotune.core.TenantSpec``): its GPU quota,
    whether it borrows and lends, its fair-share weight. ``default`` exists from the
    start (migration 0013): the operators', owner of every earlier job."""

    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpus: Mapped[int] = mapped_column(Integer)
    """Nominal quota over all GPU models."""
    gpus_by_model: Mapped[JsonDict]
    """``{gpu model: count}``: the part of the quota promised on given models."""
    borrow: Mapped[bool] = mapped_column(Boolean)
    lend: Mapped[bool] = mapped_column(Boolean)
    weight: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class ApiTokenRow(Base):
    """An API token, stored only as its SHA-256 hash (the token itself is shown once):
    whose it is (``tenant``), what it may do (``role``: admin, member, viewer), until
    when. A revoked token keeps its row, so the audit log can still say whose it was."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    tenant: Mapped[str] = mapped_column(
        ForeignKey("tenants.name"), default="default", server_default="default"
    )
    role: Mapped[str] = mapped_column(String(16), default="admin", server_default="admin")
    name: Mapped[str] = mapped_column(String(128), default="", server_default="")
    """What the token is for, in the admin's words (``ci``, ``alice's laptop``)."""
    expires_at: Mapped[datetime | None]
    """``None``: never."""
    revoked_at: Mapped[datetime | None]
    rotated_at: Mapped[datetime | None]
    """When the secret was last replaced (``POST /tokens/{id}/rotate``)."""
    created_by: Mapped[int | None] = mapped_column(Integer)
    """The token that issued this one (``None``: the daemon or the command line)."""


class AuditRow(Base):
    """One mutating API request: which token (and so tenant and role) asked what, and
    the answer's status; refused requests too (``token_id`` ``None``: no valid token)."""

    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_token_id_id", "token_id", "id"),
        Index("ix_audit_log_tenant_id", "tenant", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    token_id: Mapped[int | None] = mapped_column(Integer)
    """``api_tokens.id``; ``None`` for no token, an unknown one, or ``AUTOTUNE_TOKEN``."""
    token_name: Mapped[str | None] = mapped_column(String(128))
    tenant: Mapped[str | None] = mapped_column(String(128))
    role: Mapped[str | None] = mapped_column(String(16))
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(512))
    status: Mapped[int] = mapped_column(Integer)


class JobEventRow(Base):
    """Something that happened to a job on the backend while it trained, as the backend
    reported it (``autotune.interfaces.JobEvents``): a node lost, a resume from a
    checkpoint, precision raised by the gradient-norm guard, batch shares moved, ..."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(128))
    """No foreign key: like a metric sample, an event outlives its job's row until
    retention deletes it."""
    kind: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(index=True)
    """When it happened, on the backend's clock."""
    detail: Mapped[JsonDict]
    """The event's other fields (``step``, ``nodes``, ``shares``, ...)."""


class LeaderLeaseRow(Base):
    """Who runs the decision loop (``autotune.db.lease``): one row per lease, renewed by
    its holder every second or so. ``term`` grows by one at every change of holder and is
    the fencing token every decision write checks; ``expires_at_s`` is on the database's
    clock, so daemons on different hosts agree on it."""

    __tablename__ = "leader_lease"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(256))
    """``host:pid:random`` of the daemon holding it; ``None``: never held."""
    term: Mapped[int] = mapped_column(Integer)
    expires_at_s: Mapped[float] = mapped_column(Float)
    """Seconds since the epoch on the database's clock; 0 once released."""


class LeaderTermRow(Base):
    """Every term of the lease, oldest first: which daemon led from when."""

    __tablename__ = "leader_terms"

    term: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str] = mapped_column(String(256))
    started_at: Mapped[datetime]
