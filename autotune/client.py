"""A Python client of the daemon's REST API (``/api/v1``), on ``httpx``.

Every route has a typed method that answers the API's own response schema
(``autotune.api.schemas``), so a program reads ``job.state`` where the CLI prints it.
Listings that page by cursor (jobs, a job's metric samples, decisions, the audit log)
come as iterators that fetch the next page as they go; ``*_page`` methods answer one
page and its cursor.

Errors are exceptions: ``ApiError`` (with ``status`` and the server's ``reason``) for
an answer the API refused, subclassed by status (``UnauthorizedError`` 401,
``ForbiddenError`` 403, ``NotFoundError`` 404, ``ConflictError`` 409,
``InvalidRequestError`` other 4xx, ``UnavailableError`` 5xx), and ``UnreachableError``
when no daemon answers. A 503 with ``Retry-After`` (the database is busy or failing
over) is retried after the time it asks, up to ``retries`` times.

    from autotune.client import Client

    with Client("http://127.0.0.1:8000", token="...") as api:
        job = api.submit_job({"task": "gpt-char", "steps": 500, "max_gpus": 2})
        for decision in api.decisions(job=job.job_id):
            print(decision.id, decision.reason)

``url`` defaults to ``$AUTOTUNE_URL`` (else http://127.0.0.1:8000) and ``token`` to
``$AUTOTUNE_TOKEN``; reads need no token, changes do (the token's role and tenant
must allow them), and the listings of tokens and of the audit log need an admin's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Final, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from autotune.api.schemas import (
    AuditEntryPublic,
    AuditPublic,
    ClusterPublic,
    DashboardPublic,
    DecisionExplanation,
    DecisionPublic,
    DecisionsPublic,
    ForecastPublic,
    Health,
    JobCreate,
    JobEventPublic,
    JobEventsPublic,
    JobPublic,
    JobsPublic,
    MetricSamplePublic,
    MetricSamplesPublic,
    OverrideCreate,
    OverridePublic,
    OverridesPublic,
    PoliciesPublic,
    PolicyCreate,
    PolicyEventPublic,
    PolicyEventsPublic,
    PolicyPublic,
    PrincipalPublic,
    Readiness,
    ShadowPublic,
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
    "DEFAULT_URL",
    "ApiError",
    "Client",
    "ConflictError",
    "ForbiddenError",
    "InvalidRequestError",
    "NotFoundError",
    "UnauthorizedError",
    "UnavailableError",
    "UnreachableError",
]

DEFAULT_URL: Final = "http://127.0.0.1:8000"
API_PREFIX: Final = "/api/v1"
MAX_RETRY_WAIT_S: Final = 30.0
"""The longest ``Retry-After`` honoured: a longer one is waited as this."""

_Model = TypeVar("_Model", bound=BaseModel)
_Row = TypeVar("_Row", bound=BaseModel)


class ApiError(Exception):
    """The API answered with an error: ``status`` and the server's one-line ``reason``
    (for a 422, the first field that is wrong); ``body`` is the whole answer."""

    def __init__(self, status: int, reason: str, body: Any = None) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason
        self.body = body


class UnauthorizedError(ApiError):
    """401: no token, or one the daemon does not accept."""


class ForbiddenError(ApiError):
    """403: the token may not do this."""


class NotFoundError(ApiError):
    """404: no such job, decision, override, policy, tenant or token."""


class ConflictError(ApiError):
    """409: the id or name is taken, or the change clashes with the current state."""


class InvalidRequestError(ApiError):
    """422 (or another 4xx): the request is wrong; ``reason`` says where."""


class UnavailableError(ApiError):
    """5xx: the daemon cannot serve the request now (after the retries a 503 allows)."""


class UnreachableError(Exception):
    """No daemon answered at the URL (refused, timed out, name not found)."""


_BY_STATUS: Final[Mapping[int, type[ApiError]]] = {
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    422: InvalidRequestError,
}


def _reason(body: Any) -> str:
    """The server's reason in one line: ``message`` (validation errors), else ``detail``
    (FastAPI's errors), naming the first wrong field of a list of them."""
    if isinstance(body, dict):
        if isinstance(body.get("message"), str):
            return str(body["message"])
        detail = body.get("detail")
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            where = ".".join(str(p) for p in detail[0].get("loc", []))
            return f"{where}: {detail[0].get('msg')}"
        if detail is not None:
            return str(detail)
    return str(body)


def api_error(response: httpx.Response) -> ApiError:
    """The exception for an error answer."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text or response.reason_phrase
    status = response.status_code
    kind = UnavailableError if status >= 500 else _BY_STATUS.get(status, InvalidRequestError)
    return kind(status, _reason(body), body)


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds a 503 asks to wait (``Retry-After`` in seconds), None without one."""
    value = response.headers.get("Retry-After")
    if response.status_code != 503 or value is None:
        return None
    try:
        return min(max(float(value), 0.0), MAX_RETRY_WAIT_S)
    except ValueError:
        return None  # an HTTP date: not something this API sends


def _body(value: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    """A request body: a schema model as the JSON it stands for (the fields that were
    set), a mapping as it is (the API validates it and says what is wrong)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    return dict(value)


def _query(**params: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, datetime):
            value = value.isoformat()
        out[key] = value
    return out


def _segment(value: str | int) -> str:
    return quote(str(value), safe="")


class Client:
    """The daemon's API. Use it as a context manager, or call ``close()``.

    ``retries``: how many times a 503 with ``Retry-After`` is tried again (0: never);
    ``transport``: an ``httpx`` transport (tests pass ``httpx.ASGITransport`` or a mock).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = (url or os.environ.get("AUTOTUNE_URL") or DEFAULT_URL).rstrip("/")
        # None: $AUTOTUNE_TOKEN; "": no token.
        self.token = (os.environ.get("AUTOTUNE_TOKEN") if token is None else token) or None
        self.retries = retries
        self._sleep = sleep
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- transport --------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        prefix: str = API_PREFIX,
    ) -> Any:
        """The JSON answer of ``method path`` (under ``/api/v1``); raises ``ApiError`` or
        ``UnreachableError``. Changes carry the token; a 503 that asks is retried."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(
                    method, prefix + path, json=json, params=params, headers=headers
                )
            except httpx.TransportError as exc:
                raise UnreachableError(f"cannot reach the daemon at {self.url}: {exc}") from exc
            wait = _retry_after(response)
            if wait is not None and attempt < self.retries:
                self._sleep(wait)
                continue
            if response.is_error:
                raise api_error(response)
            return response.json()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _get(self, model: type[_Model], path: str, **params: Any) -> _Model:
        return model.model_validate(self.request("GET", path, params=_query(**params)))

    def _change(
        self, model: type[_Model], method: str, path: str, body: dict[str, Any] | None = None
    ) -> _Model:
        return model.model_validate(self.request(method, path, json=body))

    def _pages(
        self,
        fetch: Callable[[str | None], tuple[list[_Row], str | None]],
    ) -> Iterator[_Row]:
        cursor: str | None = None
        while True:
            rows, cursor = fetch(cursor)
            yield from rows
            if not cursor:
                return

    # --- health and cluster -----------------------------------------------------------

    def health(self) -> Health:
        """Liveness: the decision loop's health and the leader lease."""
        return self._get(Health, "/healthz")

    def ready(self) -> Readiness:
        """Readiness; a daemon that is not ready answers 503, raised as ``UnavailableError``."""
        return self._get(Readiness, "/readyz")

    def cluster(self) -> ClusterPublic:
        """Nodes, the hosts' live readings and the cluster's totals."""
        return self._get(ClusterPublic, "/cluster")

    def forecast(self, *, minutes: int | None = None, samples: int | None = None) -> ForecastPublic:
        """GPU demand per minute and its forecasts over the newest ``minutes``."""
        return self._get(ForecastPublic, "/forecast", minutes=minutes, samples=samples)

    def dashboard(
        self, *, samples: int | None = None, minutes: int | None = None
    ) -> DashboardPublic:
        """What the dashboard shows, in one answer."""
        return self._get(DashboardPublic, "/dashboard", samples=samples, minutes=minutes)

    def metrics_text(self) -> str:
        """The Prometheus exposition (text)."""
        try:
            response = self._http.get(API_PREFIX + "/metrics")
        except httpx.TransportError as exc:
            raise UnreachableError(f"cannot reach the daemon at {self.url}: {exc}") from exc
        if response.is_error:
            raise api_error(response)
        return response.text

    # --- jobs -------------------------------------------------------------------------

    def submit_job(self, job: JobCreate | Mapping[str, Any]) -> JobPublic:
        """Submit a job (``JobCreate`` or its JSON as a mapping); 409 if the id is taken."""
        return self._change(JobPublic, "POST", "/jobs", _body(job))

    def jobs_page(
        self, *, state: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> JobsPublic:
        """One page of jobs, newest first; ``next`` is the cursor of the page after it."""
        return self._get(JobsPublic, "/jobs", state=state, limit=limit, cursor=cursor)

    def jobs(self, *, state: str | None = None, page_size: int = 100) -> Iterator[JobPublic]:
        """Every job (in ``state``), newest first, page by page."""

        def fetch(cursor: str | None) -> tuple[list[JobPublic], str | None]:
            page = self.jobs_page(state=state, limit=page_size, cursor=cursor)
            return page.data, page.next

        return self._pages(fetch)

    def job(self, job_id: str) -> JobPublic:
        return self._get(JobPublic, f"/jobs/{_segment(job_id)}")

    def cancel_job(self, job_id: str) -> JobPublic:
        """Ask the daemon to stop the job at its next tick."""
        return self._change(JobPublic, "DELETE", f"/jobs/{_segment(job_id)}")

    def job_metrics_page(
        self,
        job_id: str,
        *,
        name: str | None = None,
        since: datetime | None = None,
        limit: int = 500,
        cursor: str | None = None,
    ) -> MetricSamplesPublic:
        return self._get(
            MetricSamplesPublic,
            f"/jobs/{_segment(job_id)}/metrics",
            name=name,
            since=since,
            limit=limit,
            cursor=cursor,
        )

    def job_metrics(
        self,
        job_id: str,
        *,
        name: str | None = None,
        since: datetime | None = None,
        page_size: int = 500,
    ) -> Iterator[MetricSamplePublic]:
        """The job's recorded samples (``job_*``, goodput), newest first."""

        def fetch(cursor: str | None) -> tuple[list[MetricSamplePublic], str | None]:
            page = self.job_metrics_page(
                job_id, name=name, since=since, limit=page_size, cursor=cursor
            )
            return page.data, page.next

        return self._pages(fetch)

    def job_events_page(
        self, job_id: str, *, kind: str | None = None, limit: int = 500, cursor: str | None = None
    ) -> JobEventsPublic:
        return self._get(
            JobEventsPublic,
            f"/jobs/{_segment(job_id)}/events",
            kind=kind,
            limit=limit,
            cursor=cursor,
        )

    def job_events(
        self, job_id: str, *, kind: str | None = None, page_size: int = 500
    ) -> Iterator[JobEventPublic]:
        """What happened to the job on the backend while it trained, oldest first."""

        def fetch(cursor: str | None) -> tuple[list[JobEventPublic], str | None]:
            page = self.job_events_page(job_id, kind=kind, limit=page_size, cursor=cursor)
            return page.data, page.next

        return self._pages(fetch)

    # --- decisions --------------------------------------------------------------------

    def decisions_page(
        self,
        *,
        job: str | None = None,
        source: str | None = None,
        policy_version: str | None = None,
        since: datetime | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> DecisionsPublic:
        return self._get(
            DecisionsPublic,
            "/decisions",
            job=job,
            source=source,
            policy_version=policy_version,
            since=since,
            limit=limit,
            cursor=cursor,
        )

    def decisions(
        self,
        *,
        job: str | None = None,
        source: str | None = None,
        policy_version: str | None = None,
        since: datetime | None = None,
        page_size: int = 100,
    ) -> Iterator[DecisionPublic]:
        """Decisions, newest first (a shadow policy's only with ``source="shadow"``)."""

        def fetch(cursor: str | None) -> tuple[list[DecisionPublic], str | None]:
            page = self.decisions_page(
                job=job,
                source=source,
                policy_version=policy_version,
                since=since,
                limit=page_size,
                cursor=cursor,
            )
            return page.data, page.next

        return self._pages(fetch)

    def decision(self, decision_id: int) -> DecisionPublic:
        return self._get(DecisionPublic, f"/decisions/{int(decision_id)}")

    def explain(self, decision_id: int) -> DecisionExplanation:
        """Why the decision was made: features, the choice, the alternatives."""
        return self._get(DecisionExplanation, f"/decisions/{int(decision_id)}/explain")

    # --- overrides --------------------------------------------------------------------

    def create_override(self, override: OverrideCreate | Mapping[str, Any]) -> OverridePublic:
        """Pin part of a job's configuration or placement for ``ttl_s`` seconds."""
        return self._change(OverridePublic, "POST", "/overrides", _body(override))

    def overrides_page(
        self,
        *,
        job: str | None = None,
        active: bool | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> OverridesPublic:
        return self._get(
            OverridesPublic, "/overrides", job=job, active=active, limit=limit, offset=offset
        )

    def overrides(
        self, *, job: str | None = None, active: bool | None = None, page_size: int = 100
    ) -> Iterator[OverridePublic]:
        """Overrides, newest first (``active``: in force now; ``False``: ended)."""
        offset = 0
        while True:
            page = self.overrides_page(job=job, active=active, limit=page_size, offset=offset)
            yield from page.data
            offset += len(page.data)
            if not page.data or offset >= page.count:
                return

    def override(self, override_id: int) -> OverridePublic:
        return self._get(OverridePublic, f"/overrides/{int(override_id)}")

    def delete_override(self, override_id: int) -> OverridePublic:
        """End an override now."""
        return self._change(OverridePublic, "DELETE", f"/overrides/{int(override_id)}")

    # --- policies ---------------------------------------------------------------------

    def policies(self) -> PoliciesPublic:
        """Every registered policy version."""
        return self._get(PoliciesPublic, "/policies")

    def register_policy(self, policy: PolicyCreate | Mapping[str, Any]) -> PolicyPublic:
        """Register a checkpoint on the daemon's machine (it is loaded to check it)."""
        return self._change(PolicyPublic, "POST", "/policies", _body(policy))

    def active_policy(self) -> PolicyPublic:
        return self._get(PolicyPublic, "/policies/active")

    def policy_events(
        self, *, version: str | None = None, limit: int = 100
    ) -> list[PolicyEventPublic]:
        """What happened to policy versions, newest first."""
        return self._get(PolicyEventsPublic, "/policies/events", version=version, limit=limit).data

    def activate_policy(self, version: str) -> PolicyPublic:
        return self._change(PolicyPublic, "POST", f"/policies/{_segment(version)}/activate")

    def rollback_policy(self) -> PolicyPublic:
        """Activate the version that was active before the current one."""
        return self._change(PolicyPublic, "POST", "/policies/rollback")

    def shadow_policy(self, version: str) -> PolicyPublic:
        """Run ``version`` beside the active policy, deciding without applying."""
        return self._change(PolicyPublic, "POST", f"/policies/{_segment(version)}/shadow")

    def shadow(self) -> ShadowPublic:
        """The shadow policy and how it compares with the active one."""
        return self._get(ShadowPublic, "/policies/shadow")

    def stop_shadow(self) -> PolicyPublic:
        return self._change(PolicyPublic, "DELETE", "/policies/shadow")

    # --- tenants, tokens and the audit log --------------------------------------------

    def tenants(self) -> TenantsPublic:
        """Every tenant with its quota and the GPUs its running jobs hold now."""
        return self._get(TenantsPublic, "/tenants")

    def tenant(self, name: str) -> TenantPublic:
        return self._get(TenantPublic, f"/tenants/{_segment(name)}")

    def create_tenant(self, tenant: TenantCreate | Mapping[str, Any]) -> TenantPublic:
        """Create a tenant with its quota (an admin's token); 409 if the name is taken."""
        return self._change(TenantPublic, "POST", "/tenants", _body(tenant))

    def update_tenant(self, name: str, changes: TenantUpdate | Mapping[str, Any]) -> TenantPublic:
        """Change a tenant's quota, borrowing, lending or weight (an admin's token); the
        fields left out keep their value."""
        return self._change(TenantPublic, "PATCH", f"/tenants/{_segment(name)}", _body(changes))

    def whoami(self) -> PrincipalPublic:
        """Who the client's token is: its tenant, role, id and name."""
        return self._get(PrincipalPublic, "/whoami")

    def tokens(self, *, tenant: str | None = None, revoked: bool = False) -> TokensPublic:
        """Tokens by id, without their secrets (an admin's token); revoked ones too with
        ``revoked``."""
        return self._get(TokensPublic, "/tokens", tenant=tenant, revoked=revoked)

    def create_token(self, token: TokenCreate | Mapping[str, Any]) -> TokenIssued:
        """Issue a token to a tenant with a role (an admin's token); the answer's
        ``token`` is the secret, shown this once."""
        return self._change(TokenIssued, "POST", "/tokens", _body(token))

    def rotate_token(self, token_id: int) -> TokenIssued:
        """Give a token a new secret (same id, tenant, role, expiry); the old one stops
        working at once. 409 if it is revoked."""
        return self._change(TokenIssued, "POST", f"/tokens/{int(token_id)}/rotate")

    def revoke_token(self, token_id: int) -> TokenPublic:
        """Revoke a token: it stops working at once."""
        return self._change(TokenPublic, "DELETE", f"/tokens/{int(token_id)}")

    def audit_page(
        self,
        *,
        tenant: str | None = None,
        token_id: int | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> AuditPublic:
        """One page of the audit log, newest first (an admin's token)."""
        return self._get(
            AuditPublic, "/audit", tenant=tenant, token_id=token_id, limit=limit, cursor=cursor
        )

    def audit(
        self, *, tenant: str | None = None, token_id: int | None = None, page_size: int = 100
    ) -> Iterator[AuditEntryPublic]:
        """Every mutating request, newest first: which token made it and the status it
        got, refusals included (an admin's token)."""

        def fetch(cursor: str | None) -> tuple[list[AuditEntryPublic], str | None]:
            page = self.audit_page(tenant=tenant, token_id=token_id, limit=page_size, cursor=cursor)
            return page.data, page.next

        return self._pages(fetch)
