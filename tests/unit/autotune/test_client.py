"""``autotune.client`` on a mock transport: 503s with ``Retry-After`` retried after the
time they ask, the server's reason carried by the exception, the token sent; the
methods of tenants, tokens and the audit log (method, path, body, the answer's model);
and the command line, which makes no HTTP request of its own."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import httpx
import pytest

import autotune.cli
from autotune.api.schemas import TenantUpdate, TokenCreate
from autotune.client import (
    MAX_RETRY_WAIT_S,
    ApiError,
    Client,
    ConflictError,
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    UnavailableError,
)

HEALTHY = {"status": "ok", "version": "0"}


def _client(
    answers: list[httpx.Response], seen: list[httpx.Request], waits: list[float], **kwargs: object
) -> Client:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    return Client(
        "http://daemon", transport=httpx.MockTransport(handle), sleep=waits.append, **kwargs
    )


def _busy(retry_after: str | None = "2") -> httpx.Response:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return httpx.Response(503, json={"detail": "the database cannot answer now"}, headers=headers)


def test_a_503_with_retry_after_is_retried_after_the_time_it_asks() -> None:
    seen: list[httpx.Request] = []
    waits: list[float] = []
    answers = [_busy("2"), _busy("3600"), httpx.Response(200, json=HEALTHY)]
    with _client(answers, seen, waits) as api:
        assert api.health().status == "ok"
    assert waits == [2.0, MAX_RETRY_WAIT_S]
    assert len(seen) == 3
    assert seen[0].url.path == "/api/v1/healthz"


def test_retries_end_with_the_servers_reason() -> None:
    seen: list[httpx.Request] = []
    waits: list[float] = []
    with (
        _client([_busy(), _busy(), _busy()], seen, waits, retries=2) as api,
        pytest.raises(UnavailableError, match="503: the database cannot answer now") as raised,
    ):
        api.health()
    assert raised.value.status == 503
    assert len(seen) == 3
    assert waits == [2.0, 2.0]


def test_a_503_without_retry_after_is_not_retried() -> None:
    seen: list[httpx.Request] = []
    with _client([_busy(None)], seen, []) as api, pytest.raises(UnavailableError):
        api.ready()
    assert len(seen) == 1


@pytest.mark.parametrize(
    ("status", "body", "kind", "reason"),
    [
        (403, {"detail": "viewers read only"}, ForbiddenError, "viewers read only"),
        (
            422,
            {"message": "body.steps: Input should be an integer", "detail": []},
            InvalidRequestError,
            "body.steps: Input should be an integer",
        ),
        (
            422,
            {"detail": [{"loc": ["query", "limit"], "msg": "too large"}]},
            InvalidRequestError,
            "query.limit: too large",
        ),
        (400, "not json", InvalidRequestError, "not json"),
    ],
)
def test_error_answers_become_exceptions_with_the_reason(
    status: int, body: object, kind: type[Exception], reason: str
) -> None:
    answer = (
        httpx.Response(status, json=body)
        if not isinstance(body, str)
        else httpx.Response(status, text=body)
    )
    with _client([answer], [], []) as api, pytest.raises(kind) as raised:
        api.job("x")
    assert isinstance(raised.value, ApiError)
    assert raised.value.reason == reason


def test_the_token_and_query_are_sent_as_the_api_expects() -> None:
    seen: list[httpx.Request] = []
    page = {"data": [], "count": 0, "count_exact": True, "next": None}
    with _client([httpx.Response(200, json=page)], seen, [], token="secret") as api:
        assert list(api.overrides(job="j", active=False)) == []
    assert seen[0].headers["Authorization"] == "Bearer secret"
    assert dict(seen[0].url.params) == {
        "job": "j",
        "active": "false",
        "limit": "100",
        "offset": "0",
    }


def test_path_segments_are_quoted() -> None:
    seen: list[httpx.Request] = []
    answer = httpx.Response(404, json={"detail": "no job"})
    with _client([answer], seen, []) as api, pytest.raises(NotFoundError, match="404: no job"):
        api.job("a/b")
    assert seen[0].url.raw_path == b"/api/v1/jobs/a%2Fb"


NOW = "2026-01-02T03:04:05Z"
TENANT = {
    "name": "team-a",
    "gpus": 0,
    "gpus_by_model": {"A100": 4},
    "nominal_gpus": 4,
    "borrow": True,
    "lend": False,
    "weight": 2.0,
    "gpus_held": 1.5,
    "gpus_held_by_model": {"A100": 1.5},
    "created_at": NOW,
    "updated_at": NOW,
}
TOKEN = {
    "id": 7,
    "tenant": "team-a",
    "role": "member",
    "name": "ci",
    "created_at": NOW,
    "expires_at": None,
    "revoked_at": None,
    "rotated_at": None,
    "created_by": 1,
    "usable": True,
}


def _sent(request: httpx.Request) -> object:
    return json.loads(request.content)


def test_tenants_are_created_read_and_patched() -> None:
    seen: list[httpx.Request] = []
    answers = [
        httpx.Response(201, json=TENANT),
        httpx.Response(200, json={"data": [TENANT]}),
        httpx.Response(200, json=TENANT),
        httpx.Response(200, json={**TENANT, "weight": 3.0}),
        httpx.Response(409, json={"detail": "tenant 'team-a' exists"}),
    ]
    with _client(answers, seen, [], token="secret") as api:
        created = api.create_tenant({"name": "team-a", "gpus_by_model": {"A100": 4}})
        assert created.nominal_gpus == 4
        assert created.gpus_held_by_model == {"A100": 1.5}
        assert [t.name for t in api.tenants().data] == ["team-a"]
        assert api.tenant("team-a").lend is False
        assert api.update_tenant("team-a", TenantUpdate(weight=3.0)).weight == 3.0
        with pytest.raises(ConflictError, match="exists"):
            api.create_tenant({"name": "team-a"})
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/api/v1/tenants"),
        ("GET", "/api/v1/tenants"),
        ("GET", "/api/v1/tenants/team-a"),
        ("PATCH", "/api/v1/tenants/team-a"),
        ("POST", "/api/v1/tenants"),
    ]
    assert _sent(seen[0]) == {"name": "team-a", "gpus_by_model": {"A100": 4}}
    assert _sent(seen[3]) == {"weight": 3.0}  # only the fields that were set
    assert all(r.headers["Authorization"] == "Bearer secret" for r in seen)


def test_tokens_are_issued_listed_rotated_revoked_and_asked_who_they_are() -> None:
    seen: list[httpx.Request] = []
    answers = [
        httpx.Response(201, json={**TOKEN, "token": "s3cret"}),
        httpx.Response(200, json={"data": [TOKEN]}),
        httpx.Response(200, json={**TOKEN, "rotated_at": NOW, "token": "n3w"}),
        httpx.Response(200, json={**TOKEN, "revoked_at": NOW, "usable": False}),
        httpx.Response(
            200, json={"tenant": "team-a", "role": "member", "token_id": 7, "token_name": "ci"}
        ),
    ]
    with _client(answers, seen, [], token="admin") as api:
        issued = api.create_token(TokenCreate(tenant="team-a", role="member", name="ci"))
        assert (issued.id, issued.token) == (7, "s3cret")
        assert [t.id for t in api.tokens(tenant="team-a", revoked=True).data] == [7]
        assert api.rotate_token(7).token == "n3w"
        revoked = api.revoke_token(7)
        assert revoked.usable is False
        assert not hasattr(revoked, "token")  # a revoked token's answer has no secret
        me = api.whoami()
        assert (me.tenant, me.role, me.token_id) == ("team-a", "member", 7)
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/api/v1/tokens"),
        ("GET", "/api/v1/tokens"),
        ("POST", "/api/v1/tokens/7/rotate"),
        ("DELETE", "/api/v1/tokens/7"),
        ("GET", "/api/v1/whoami"),
    ]
    assert _sent(seen[0]) == {"tenant": "team-a", "role": "member", "name": "ci"}
    assert dict(seen[1].url.params) == {"tenant": "team-a", "revoked": "true"}


def test_the_audit_log_is_read_page_by_page() -> None:
    def entry(entry_id: int) -> dict[str, object]:
        return {
            "id": entry_id,
            "at": NOW,
            "token_id": 7,
            "token_name": "ci",
            "tenant": "team-a",
            "role": "member",
            "method": "POST",
            "path": "/api/v1/jobs",
            "status": 201 if entry_id % 2 else 403,
        }

    def page(ids: list[int], cursor: str | None) -> httpx.Response:
        body = {"data": [entry(i) for i in ids], "count": 3, "count_exact": True, "next": cursor}
        return httpx.Response(200, json=body)

    seen: list[httpx.Request] = []
    answers = [page([3, 2], "c2"), page([1], None)]
    with _client(answers, seen, [], token="admin") as api:
        entries = list(api.audit(tenant="team-a", token_id=7, page_size=2))
    assert [e.id for e in entries] == [3, 2, 1]
    assert entries[1].status == 403
    assert [dict(r.url.params) for r in seen] == [
        {"tenant": "team-a", "token_id": "7", "limit": "2"},
        {"tenant": "team-a", "token_id": "7", "limit": "2", "cursor": "c2"},
    ]
    assert {r.url.path for r in seen} == {"/api/v1/audit"}


_HTTP_MODULES = {"urllib.request", "http.client", "httpx", "requests", "aiohttp", "urllib3"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_command_line_makes_no_http_request_of_its_own() -> None:
    """Every command that talks to the daemon goes through ``autotune.client``."""
    folder = Path(autotune.cli.__file__).parent
    offenders: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        found = {name for name in _imports(path) if name in _HTTP_MODULES}
        if found:
            offenders[path.name] = found
    assert offenders == {}
    assert "autotune.client.Client" in _imports(folder / "jobs.py")
