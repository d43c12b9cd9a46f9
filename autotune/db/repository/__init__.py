"""Repository functions: the only way the daemon, the API and replay touch the tables.

Keyword-only, one session per call site (the caller owns the transaction), core types
in and out where one exists.

One module per resource; every public name is re-exported here, so callers write
``from autotune.db import repository as repo`` and ``repo.create_decisions(...)``:

- ``jobs``: job records, their states and times, submission, cancellation, listings;
- ``nodes``: the backend's machines, alive, parked, waking or lost;
- ``decisions``: decisions stored a round at a time, applied, listed, the newest taken;
- ``overrides``: pins on a job's configuration until they expire;
- ``policies``: the policy registry, versions and the events of every change;
- ``metrics``: metric samples, recorded per tick, summarised, listed;
- ``transitions``: logged decision rounds for replay, their rewards and exports;
- ``tenants``: the teams sharing the cluster and their quotas;
- ``tokens``: API token digests, with tenant, role and expiry;
- ``audit``: who did what through the API;
- ``events``: what happened to each job on the backend while it trained;
- ``observations``: how a transition packs its observation;
- ``cursor``: the codec of pagination cursors;
- ``paging``: ``Page`` and the count bounded by ``COUNT_CAP`` every listing shares.
"""

from __future__ import annotations

from autotune.core import ACTIVE_STATES, JOB_STATES
from autotune.db.repository.audit import AuditRecord, list_audit, record_audit
from autotune.db.repository.cursor import CursorError, decode_cursor, encode_cursor
from autotune.db.repository.decisions import (
    DecisionRecord,
    create_decision,
    create_decisions,
    decision_counts,
    get_decision,
    latest_decision_records,
    latest_decisions,
    list_decision_rows,
    list_decisions,
    mark_decision_applied,
    running_placements,
)
from autotune.db.repository.events import (
    JobEventRecord,
    list_job_events,
    recent_job_events,
    record_job_events,
)
from autotune.db.repository.jobs import (
    JobRecord,
    active_jobs,
    cancel_requests,
    get_job,
    job_counts,
    job_ids,
    job_tenant,
    list_jobs,
    request_cancel,
    set_job_performance,
    set_job_state,
    submit_job,
    submitted_job_ids,
    upsert_job,
)
from autotune.db.repository.metrics import (
    MetricSample,
    MetricSummary,
    job_metrics,
    latest_metric_samples,
    list_metric_samples,
    list_metrics,
    record_metrics,
    summarize_metric,
)
from autotune.db.repository.nodes import NodeRecord, list_nodes, node_records, upsert_nodes
from autotune.db.repository.observations import pack_observation, unpack_observation
from autotune.db.repository.overrides import (
    OverrideRecord,
    active_overrides,
    create_override,
    delete_override,
    get_override,
    list_overrides,
)
from autotune.db.repository.paging import COUNT_CAP, Page
from autotune.db.repository.policies import (
    POLICY_ACTIONS,
    PolicyConflictError,
    PolicyEventRecord,
    PolicyNotFoundError,
    PolicyVersionRecord,
    activate_policy,
    active_policy_version,
    clear_shadow_policy,
    get_policy_version,
    latest_policy_event,
    list_policy_events,
    list_policy_versions,
    policy_state,
    record_policy_failure,
    register_policy,
    register_policy_version,
    rollback_policy,
    set_shadow_policy,
)
from autotune.db.repository.tenants import (
    TenantRecord,
    create_tenant,
    get_tenant,
    list_tenants,
    tenant_usage,
    update_tenant,
)
from autotune.db.repository.tokens import (
    TokenRecord,
    add_token,
    first_admin_token,
    get_token,
    list_tokens,
    revoke_token,
    rotate_token_hash,
    usable_tokens,
)
from autotune.db.repository.transitions import (
    create_transition,
    pack_transition,
    record_transition_export,
    set_transition_reward,
    transition_payload,
    truncate_open_transitions,
)

__all__ = [
    "ACTIVE_STATES",
    "COUNT_CAP",
    "JOB_STATES",
    "POLICY_ACTIONS",
    "AuditRecord",
    "CursorError",
    "DecisionRecord",
    "JobEventRecord",
    "JobRecord",
    "MetricSample",
    "MetricSummary",
    "NodeRecord",
    "OverrideRecord",
    "Page",
    "PolicyConflictError",
    "PolicyEventRecord",
    "PolicyNotFoundError",
    "PolicyVersionRecord",
    "TenantRecord",
    "TokenRecord",
    "activate_policy",
    "active_jobs",
    "active_overrides",
    "active_policy_version",
    "add_token",
    "cancel_requests",
    "clear_shadow_policy",
    "create_decision",
    "create_decisions",
    "create_override",
    "create_tenant",
    "create_transition",
    "decision_counts",
    "decode_cursor",
    "delete_override",
    "encode_cursor",
    "first_admin_token",
    "get_decision",
    "get_job",
    "get_override",
    "get_policy_version",
    "get_tenant",
    "get_token",
    "job_counts",
    "job_ids",
    "job_metrics",
    "job_tenant",
    "latest_decision_records",
    "latest_decisions",
    "latest_metric_samples",
    "latest_policy_event",
    "list_audit",
    "list_decision_rows",
    "list_decisions",
    "list_job_events",
    "list_jobs",
    "list_metric_samples",
    "list_metrics",
    "list_nodes",
    "list_overrides",
    "list_policy_events",
    "list_policy_versions",
    "list_tenants",
    "list_tokens",
    "mark_decision_applied",
    "node_records",
    "pack_observation",
    "pack_transition",
    "policy_state",
    "recent_job_events",
    "record_audit",
    "record_job_events",
    "record_metrics",
    "record_policy_failure",
    "record_transition_export",
    "register_policy",
    "register_policy_version",
    "request_cancel",
    "revoke_token",
    "rollback_policy",
    "rotate_token_hash",
    "running_placements",
    "set_job_performance",
    "set_job_state",
    "set_shadow_policy",
    "set_transition_reward",
    "submit_job",
    "submitted_job_ids",
    "summarize_metric",
    "tenant_usage",
    "transition_payload",
    "truncate_open_transitions",
    "unpack_observation",
    "update_tenant",
    "upsert_job",
    "upsert_nodes",
    "usable_tokens",
]
