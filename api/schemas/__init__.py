"""Request schemas (``XCreate``) and response schemas (``XPublic`` for one item,
``XsPublic`` for a page of them).

Request bodies are strict (no type coercion: ``"4"`` is not an integer) and reject
unknown fields, so a typo is a 422 naming the field instead of a silent default.

One module per router, every public name re-exported here (``from autotune.api.schemas
import JobCreate``):

- ``health``: liveness, readiness, the decision loop's health, the leader lease;
- ``cluster``: nodes, hosts' live readings, the cluster's totals;
- ``jobs``: a job to submit and its constraints, jobs, a job's metric samples;
- ``decisions``: decisions and the explanation of one;
- ``overrides``: the pins of an override, overrides;
- ``policies``: a checkpoint to register, policy versions and events, the shadow;
- ``tenants``: tenants with their quotas and use, their tokens, the audit log;
- ``forecast``: GPU demand per minute and its forecasts;
- ``dashboard``: the dashboard's one response;
- ``common``: what several share: the strict request base, whole numbers, one-line
  text, the GPU bound, and ``Paged``, the envelope of a page.
"""

from __future__ import annotations

from autotune.api.schemas.cluster import ClusterPublic, HostPublic, NodePublic
from autotune.api.schemas.common import LINE_PATTERN, Paged
from autotune.api.schemas.dashboard import (
    DashboardCluster,
    DashboardDecision,
    DashboardGpuHold,
    DashboardJobConfig,
    DashboardNode,
    DashboardPublic,
)
from autotune.api.schemas.decisions import DecisionExplanation, DecisionPublic, DecisionsPublic
from autotune.api.schemas.forecast import (
    ArrivalCheck,
    DemandPoint,
    ForecastPublic,
    HorizonForecast,
)
from autotune.api.schemas.health import Health, LeaderPublic, Readiness, TickHealthPublic
from autotune.api.schemas.jobs import (
    JobConstraints,
    JobCreate,
    JobEventPublic,
    JobEventsPublic,
    JobPublic,
    JobsPublic,
    MetricSamplePublic,
    MetricSamplesPublic,
)
from autotune.api.schemas.overrides import (
    CompressionPin,
    LayoutPin,
    OverrideCreate,
    OverridePublic,
    OverridesPublic,
    PrecisionPin,
    RankPin,
)
from autotune.api.schemas.policies import (
    GoodputPair,
    PoliciesPublic,
    PolicyCreate,
    PolicyEventPublic,
    PolicyEventsPublic,
    PolicyPublic,
    ShadowPublic,
)
from autotune.api.schemas.tenants import (
    AuditEntryPublic,
    AuditPublic,
    PrincipalPublic,
    TenantCreate,
    TenantPublic,
    TenantsPublic,
    TenantUpdate,
    TokenCreate,
    TokenIssued,
    TokenPublic,
    TokensPublic,
)

__all__ = [
    "LINE_PATTERN",
    "ArrivalCheck",
    "AuditEntryPublic",
    "AuditPublic",
    "ClusterPublic",
    "CompressionPin",
    "DashboardCluster",
    "DashboardDecision",
    "DashboardGpuHold",
    "DashboardJobConfig",
    "DashboardNode",
    "DashboardPublic",
    "DecisionExplanation",
    "DecisionPublic",
    "DecisionsPublic",
    "DemandPoint",
    "ForecastPublic",
    "GoodputPair",
    "Health",
    "HorizonForecast",
    "HostPublic",
    "JobConstraints",
    "JobCreate",
    "JobEventPublic",
    "JobEventsPublic",
    "JobPublic",
    "JobsPublic",
    "LayoutPin",
    "LeaderPublic",
    "MetricSamplePublic",
    "MetricSamplesPublic",
    "NodePublic",
    "OverrideCreate",
    "OverridePublic",
    "OverridesPublic",
    "Paged",
    "PoliciesPublic",
    "PolicyCreate",
    "PolicyEventPublic",
    "PolicyEventsPublic",
    "PolicyPublic",
    "PrecisionPin",
    "PrincipalPublic",
    "RankPin",
    "Readiness",
    "ShadowPublic",
    "TenantCreate",
    "TenantPublic",
    "TenantUpdate",
    "TenantsPublic",
    "TickHealthPublic",
    "TokenCreate",
    "TokenIssued",
    "TokenPublic",
    "TokensPublic",
]
