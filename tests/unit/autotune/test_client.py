"""``autotune.client`` on a mock transport: 503s with ``Retry-After`` retried after the
time they ask, the server's reason carried by the exception, the token sent; and the
command line, which makes no HTTP request of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import httpx
import pytest

import autotune.cli
from autotune.client import (
    MAX_RETRY_WAIT_S,
    ApiError,
    Client,
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
