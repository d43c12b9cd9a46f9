"""Tenants and scoped tokens, through the API over a real database.

The security test walks the OpenAPI schema: every mutating route (so a route added later
cannot be missed: it fails here until it has an example) is tried with no token, a
revoked token, an expired one, a viewer's, and another tenant's member's, each with a
request that the right token would get through (a valid body, the other tenant's job):
401 or 403 every time, nothing changed, and every refusal in the audit log."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autotune.api.app import create_app
from autotune.api.cache import TickCache
from autotune.core import Decision, JobConfig, Placement, RankSlot, utc_now
from autotune.daemon.auth import StoredTokenCheck, ensure_token, issue_token
from autotune.db import Database
from autotune.db import repository as repo
from autotune.envs.presets import small_nodes

MUTATING = ("post", "put", "patch", "delete")


class Tenancy:
    """An API with tenants ``a`` and ``b``, the first admin's token, and tokens of
    ``a``: a member's, a viewer's, a revoked member's and an expired member's; and of
    ``b``: a member's. ``a`` has a running-to-be job with an override."""

    def __init__(self, database: Database, reads: str = "open") -> None:
        self.db = database
        check, admin = ensure_token(database, None)
        assert admin is not None
        assert isinstance(check, StoredTokenCheck)
        self.app = create_app(
            db=database,
            telemetry="simulator",
            token_check=check,
            reads=reads,  # type: ignore[arg-type]
        )
        self.client = TestClient(self.app)
        self.tokens = {"admin": admin}
        for tenant in ("a", "b"):
            self.call("post", "/tenants", "admin", {"name": tenant, "gpus": 4}, expect=201)
        for who, tenant, role in [
            ("a-member", "a", "member"),
            ("a-viewer", "a", "viewer"),
            ("a-revoked", "a", "member"),
            ("b-member", "b", "member"),
        ]:
            body = {"tenant": tenant, "role": role, "name": who}
            issued = self.call("post", "/tokens", "admin", body, expect=201)
            self.tokens[who] = issued["token"]
            if who == "a-revoked":
                self.call("delete", f"/tokens/{issued['id']}", "admin", expect=200)
        with database.session() as session:  # expired a minute ago
            _, self.tokens["a-expired"] = issue_token(
                session,
                tenant="a",
                role="member",
                name="a-expired",
                expires_at=utc_now() - timedelta(minutes=1),
            )
        with database.session() as session:
            repo.upsert_nodes(session=session, nodes=small_nodes())
        job = {"task": "gpt-char", "job_id": "a-job", "steps": 10**6}
        assert self.call("post", "/jobs", "a-member", job, expect=201)["tenant"] == "a"
        override = {"job_id": "a-job", "precision": {"ffn": "fp32"}, "ttl_s": 600, "reason": "r"}
        self.override_id = self.call("post", "/overrides", "a-member", override, expect=201)["id"]
        self.member_token_id = self.whoami("b-member")["token_id"]

    def call(
        self,
        method: str,
        path: str,
        who: str | None,
        body: Any = None,
        *,
        expect: int | None = None,
    ) -> Any:
        headers = {} if who is None else {"Authorization": f"Bearer {self.tokens[who]}"}
        answer = self.client.request(method, f"/api/v1{path}", json=body, headers=headers)
        if expect is not None:
            assert answer.status_code == expect, (method, path, who, answer.text)
        return answer.json() if answer.content else None

    def whoami(self, who: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("get", "/whoami", who, expect=200)
        return result

    def state(self) -> dict[str, Any]:
        """What a refused request must not change."""
        return {
            path: self.call("get", path, "admin", expect=200)
            for path in ("/jobs", "/overrides", "/tenants", "/tokens?revoked=true", "/policies")
        }


@pytest.fixture
def tenancy(database: Database) -> Iterator[Tenancy]:
    setup = Tenancy(database)
    with setup.client:
        yield setup


def examples(t: Tenancy) -> dict[tuple[str, str], tuple[str, Any]]:
    """For every mutating route of the schema: a request (path, body) that tenant ``a``'s
    member or the admin would get through, aimed at ``a``'s job and override."""
    token_id = t.member_token_id
    return {
        ("post", "/api/v1/jobs"): ("/jobs", {"task": "gpt-char", "tenant": "a"}),
        ("delete", "/api/v1/jobs/{job_id}"): ("/jobs/a-job", None),
        ("post", "/api/v1/overrides"): (
            "/overrides",
            {"job_id": "a-job", "precision": {"ffn": "bf16"}, "ttl_s": 60, "reason": "r"},
        ),
        ("delete", "/api/v1/overrides/{override_id}"): (f"/overrides/{t.override_id}", None),
        ("post", "/api/v1/policies"): (
            "/policies",
            {"checkpoint": "/nonexistent", "name": "n"},
        ),
        ("delete", "/api/v1/policies/shadow"): ("/policies/shadow", None),
        ("post", "/api/v1/policies/rollback"): ("/policies/rollback", None),
        ("post", "/api/v1/policies/{version}/activate"): ("/policies/ppo-1/activate", None),
        ("post", "/api/v1/policies/{version}/shadow"): ("/policies/ppo-1/shadow", None),
        ("post", "/api/v1/tenants"): ("/tenants", {"name": "c"}),
        ("patch", "/api/v1/tenants/{name}"): ("/tenants/a", {"gpus": 64}),
        ("post", "/api/v1/tokens"): ("/tokens", {"tenant": "a", "role": "admin"}),
        ("post", "/api/v1/tokens/{token_id}/rotate"): (f"/tokens/{token_id}/rotate", None),
        ("delete", "/api/v1/tokens/{token_id}"): (f"/tokens/{token_id}", None),
    }


def test_every_mutating_route_refuses_every_token_that_may_not_use_it(
    tenancy: Tenancy,
) -> None:
    routes = [
        (method, path)
        for path, item in tenancy.app.openapi()["paths"].items()
        for method in item
        if method in MUTATING
    ]
    requests = examples(tenancy)
    assert sorted(routes) == sorted(requests), "a mutating route without an example"
    before = tenancy.state()
    refused: list[tuple[str, str, int]] = []
    for method, route in routes:
        path, body = requests[(method, route)]
        for who, status in [
            (None, 401),
            ("a-revoked", 401),
            ("a-expired", 401),
            ("a-viewer", 403),
            ("b-member", 403),
        ]:
            answer = tenancy.call(method, path, who, body, expect=status)
            assert "detail" in answer
            refused.append((method.upper(), f"/api/v1{path}", status))
    assert tenancy.state() == before
    # Every refusal is in the audit log, the known tokens' by id
    entries = []
    cursor = None
    while True:
        query = "/audit?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        page = tenancy.call("get", query, "admin", expect=200)
        entries += page["data"]
        cursor = page["next"]
        if cursor is None:
            break
    logged = [(e["method"], e["path"], e["status"]) for e in reversed(entries)]
    assert logged[-len(refused) :] == refused
    by_member = [e for e in entries if e["token_id"] == tenancy.member_token_id]
    assert len(by_member) == len(routes)
    assert {(e["tenant"], e["role"], e["status"]) for e in by_member} == {("b", "member", 403)}


def test_a_member_acts_on_its_own_tenants_jobs_and_an_admin_on_any(tenancy: Tenancy) -> None:
    t = tenancy
    job = t.call("post", "/jobs", "b-member", {"task": "gpt-char"}, expect=201)
    assert job["tenant"] == "b"
    t.call("delete", f"/jobs/{job['job_id']}", "b-member", expect=202)
    t.call("delete", "/jobs/a-job", "b-member", expect=403)
    # an admin may submit for any existing tenant, and cancel anyone's job
    other = t.call("post", "/jobs", "admin", {"task": "gpt-char", "tenant": "b"}, expect=201)
    assert other["tenant"] == "b"
    answer = t.call("post", "/jobs", "admin", {"task": "gpt-char", "tenant": "zz"}, expect=422)
    assert "no tenant 'zz'" in answer["message"]
    t.call("delete", "/jobs/a-job", "admin", expect=202)
    # a viewer reads, and says who it is
    assert t.whoami("a-viewer")["role"] == "viewer"
    assert t.call("get", "/jobs/a-job", "a-viewer", expect=200)["cancel_requested"]


def test_tokens_rotate_revoke_and_expire_at_once(tenancy: Tenancy) -> None:
    t = tenancy
    me = t.whoami("b-member")
    rotated = t.call("post", f"/tokens/{me['token_id']}/rotate", "admin", expect=200)
    assert rotated["id"] == me["token_id"]
    assert rotated["rotated_at"] is not None
    t.call("get", "/whoami", "b-member", expect=401)  # the old secret: at once
    t.tokens["b-member"] = rotated["token"]
    assert t.whoami("b-member") == me
    t.call("delete", f"/tokens/{me['token_id']}", "admin", expect=200)
    t.call("get", "/whoami", "b-member", expect=401)
    t.call("post", f"/tokens/{me['token_id']}/rotate", "admin", expect=409)
    listed = t.call("get", "/tokens?tenant=b&revoked=true", "admin", expect=200)["data"]
    assert [(x["id"], x["usable"]) for x in listed] == [(me["token_id"], False)]
    assert t.call("get", "/tokens?tenant=b", "admin", expect=200)["data"] == []
    # stored by hash only, with its creator
    with t.db.session() as session:
        record = repo.get_token(session=session, token_id=me["token_id"])
    assert record is not None
    assert record.created_by == t.whoami("admin")["token_id"]
    issued = t.call(
        "post",
        "/tokens",
        "admin",
        {"tenant": "b", "role": "viewer", "expires_in_s": 60},
        expect=201,
    )
    assert issued["expires_at"] is not None
    assert issued["usable"]
    t.call("post", "/tokens", "admin", {"tenant": "nope", "role": "viewer"}, expect=422)


def test_tenants_carry_their_quota_and_an_admin_changes_it(tenancy: Tenancy) -> None:
    t = tenancy
    names = [x["name"] for x in t.call("get", "/tenants", None, expect=200)["data"]]
    assert names == ["a", "b", "default"]
    changed = t.call(
        "patch",
        "/tenants/a",
        "admin",
        {"gpus": 0, "gpus_by_model": {"A100": 8, "V100": 2}, "borrow": False},
        expect=200,
    )
    assert (changed["nominal_gpus"], changed["borrow"], changed["lend"]) == (10, False, True)
    assert t.call("get", "/tenants/a", None, expect=200) == changed
    t.call("patch", "/tenants/nope", "admin", {"gpus": 1}, expect=404)
    # use against quota: a's job runs on two GPUs of the first node
    node = small_nodes()[0]
    _decide_for_a_job(t)
    with t.db.session() as session:
        job = repo.get_job(session=session, job_id="a-job")
        assert job is not None
        repo.upsert_job(session=session, spec=job.spec, state="running")
    held = {x["name"]: x for x in t.call("get", "/tenants", None, expect=200)["data"]}
    assert held["a"]["gpus_held"] == 2
    assert held["a"]["gpus_held_by_model"] == {node.gpu_model: 2}
    assert held["b"]["gpus_held"] == 0
    t.call("post", "/tenants", "admin", {"name": "a"}, expect=409)
    t.call("post", "/tenants", "admin", {"name": "c", "weight": 0}, expect=422)
    # promises on given models are part of the quota in all: never more than it
    over = {"name": "c", "gpus": 8, "gpus_by_model": {"A100": 8, "V100": 2}}
    t.call("post", "/tenants", "admin", over, expect=422)
    t.call("patch", "/tenants/a", "admin", {"gpus": 4}, expect=422)  # a promises 10


def _decide_for_a_job(t: Tenancy) -> int:
    """A stored decision for ``a``'s job, on two GPUs of the first node; its id."""
    node = small_nodes()[0]
    slots = tuple(RankSlot(rank=i, node_id=node.node_id, gpu_index=i) for i in range(2))
    decision = Decision(
        job_id="a-job",
        config=JobConfig.data_parallel(2),
        placement=Placement(job_id="a-job", ranks=slots),
        source="policy",
        policy_version="rules",
        reason="test",
    )
    with t.db.session() as session:
        stored = repo.create_decision(session=session, decision=decision)
    assert stored.decision_id is not None
    return stored.decision_id


def test_reads_per_tenant_show_each_token_its_own_tenants_jobs(database: Database) -> None:
    t = Tenancy(database, reads="tenant")
    # the per-tick cache of the busiest reads, as beside a decision loop: it must keep
    # no answer of one reader for another
    t.app.state.tick_cache = TickCache()
    with t.client:
        decision_id = _decide_for_a_job(t)
        b_job = t.call("post", "/jobs", "b-member", {"task": "gpt-char"}, expect=201)["job_id"]
        job_scoped = [
            "/jobs",
            "/jobs/a-job",
            "/jobs/a-job/metrics",
            "/decisions",
            f"/decisions/{decision_id}",
            f"/decisions/{decision_id}/explain",
            "/overrides",
            f"/overrides/{t.override_id}",
            "/jobs/a-job/events",
        ]
        for path in job_scoped:
            t.call("get", path, None, expect=401)
            t.call("get", path, "a-expired", expect=401)
            t.call("get", path, "a-viewer", expect=200)  # a's own
            t.call("get", path, "admin", expect=200)
        for path in job_scoped[1:3] + job_scoped[4:6] + job_scoped[7:]:
            t.call("get", path, "b-member", expect=404)  # as if there were none
        # listings: each tenant its own, an admin every tenant's
        for who, jobs in [("a-viewer", {"a-job"}), ("b-member", {b_job})]:
            listed = t.call("get", "/jobs", who, expect=200)
            assert {j["job_id"] for j in listed["data"]} == jobs
            assert listed["count"] == len(jobs)
        assert {j["job_id"] for j in t.call("get", "/jobs", "admin")["data"]} == {"a-job", b_job}
        assert t.call("get", "/decisions", "b-member", expect=200)["data"] == []
        assert [d["id"] for d in t.call("get", "/decisions", "a-viewer")["data"]] == [decision_id]
        assert t.call("get", "/overrides", "b-member", expect=200)["data"] == []
        assert len(t.call("get", "/overrides", "a-viewer")["data"]) == 1
        # views of every tenant's jobs at once: an admin's token only
        for path in ("/dashboard", "/metrics"):
            t.call("get", path, "b-member", expect=403)
            t.call("get", path, None, expect=401)
            assert (
                t.client.get(
                    f"/api/v1{path}", headers={"Authorization": f"Bearer {t.tokens['admin']}"}
                ).status_code
                == 200
            )
        # aggregates stay open
        t.call("get", "/cluster", None, expect=200)
        t.call("get", "/tenants", None, expect=200)
