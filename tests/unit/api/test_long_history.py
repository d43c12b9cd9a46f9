"""Reads that do not grow with history: cursors, bounded counts and offsets, and a
request that cannot get a database connection in time gets 503, never 500."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autotune.api.app import attach_daemon, create_app
from autotune.core import Decision, JobConfig, JobSpec, utc_now
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database, sqlite_url
from autotune.db import repository as repo
from autotune.db.repository import encode_cursor
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.policies.rules import RulesPolicy


@pytest.fixture
def ticked(database: Database) -> Iterator[tuple[Daemon, TestClient]]:
    daemon = Daemon(
        DaemonParts(db=database, backend=SimulatedCluster(SimConfig(seed=3)), policy=RulesPolicy())
    )
    daemon.start()
    for _ in range(10):
        daemon.tick()
    with TestClient(create_app(db=database, telemetry="simulator")) as client:
        yield daemon, client


def _pages(client: TestClient, path: str, **params: object) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        body = client.get(path, params=query).json()
        rows += body["data"]
        cursor = body["next"]
        if cursor is None:
            return rows


def test_decision_cursors_neither_skip_nor_repeat_while_ticks_add_rows(
    ticked: tuple[Daemon, TestClient],
) -> None:
    daemon, client = ticked
    first = client.get("/api/v1/decisions", params={"limit": 3}).json()
    assert first["count_exact"]
    assert first["count"] >= 6
    seen = [d["id"] for d in first["data"]]
    cursor = first["next"]
    daemon.tick()  # new decisions arrive on top: the cursor's pages do not shift
    daemon.tick()
    while cursor is not None:
        page = client.get("/api/v1/decisions", params={"limit": 3, "cursor": cursor}).json()
        seen += [d["id"] for d in page["data"]]
        cursor = page["next"]
    assert seen == sorted(seen, reverse=True)
    assert len(seen) == len(set(seen)) == first["count"]
    assert min(seen) == 1


def test_filtered_cursors_and_job_cursors_cover_everything(
    ticked: tuple[Daemon, TestClient],
) -> None:
    _, client = ticked
    job = client.get("/api/v1/decisions", params={"limit": 1}).json()["data"][0]["job_id"]
    by_job = _pages(client, "/api/v1/decisions", job=job, limit=1)
    assert by_job
    assert {d["job_id"] for d in by_job} == {job}
    assert len(by_job) == client.get("/api/v1/decisions", params={"job": job}).json()["count"]
    jobs = _pages(client, "/api/v1/jobs", limit=2)
    everything = client.get("/api/v1/jobs", params={"limit": 1000}).json()
    assert [j["job_id"] for j in jobs] == [j["job_id"] for j in everything["data"]]
    assert everything["next"] is None


def test_a_jobs_metric_samples_page_newest_first(ticked: tuple[Daemon, TestClient]) -> None:
    _, client = ticked
    job = client.get("/api/v1/jobs", params={"state": "running", "limit": 1}).json()["data"][0]
    samples = _pages(client, f"/api/v1/jobs/{job['job_id']}/metrics", name="job_goodput", limit=2)
    assert len(samples) >= 2
    assert {s["name"] for s in samples} == {"job_goodput"}
    times = [s["recorded_at"] for s in samples]
    assert times == sorted(times, reverse=True)
    assert len(set(times)) == len(times)  # one goodput per tick: the daemon's, not also the sim's
    assert client.get("/api/v1/jobs/nope/metrics").status_code == 404


def test_bad_cursors_and_deep_offsets_are_422_and_huge_ids_404(
    ticked: tuple[Daemon, TestClient],
) -> None:
    _, client = ticked
    for cursor in ("nope", "W10", "WyJhIiwiYiJd"):  # not base64 JSON; []; a jobs cursor
        response = client.get("/api/v1/decisions", params={"cursor": cursor})
        assert response.status_code == 422, cursor
        assert "cursor" in response.json()["message"]
    assert client.get("/api/v1/jobs", params={"cursor": "WzFd"}).status_code == 422
    assert client.get("/api/v1/decisions", params={"offset": 10_001}).status_code == 422
    assert client.get("/api/v1/jobs", params={"offset": 2**70}).status_code == 422
    assert client.get(f"/api/v1/decisions/{2**70}").status_code == 422
    assert client.get(f"/api/v1/decisions/{2**63 - 1}/explain").status_code == 404
    # Cursors no listing hands out, well formed otherwise: a key beyond 64 bits, text with
    # NUL, a time with no zone.
    odd = [
        ("/api/v1/decisions", encode_cursor(10**23)),
        ("/api/v1/decisions", encode_cursor(2**64)),
        ("/api/v1/jobs", encode_cursor("2026-01-01T00:00:00+00:00", "a\x00b")),
        ("/api/v1/jobs", encode_cursor("0001-01-01T00:00:00", "")),
    ]
    for path, cursor in odd:
        response = client.get(path, params={"cursor": cursor})
        assert response.status_code == 422, (path, cursor, response.text)
        assert "cursor" in response.json()["message"]


def test_counts_stop_at_the_cap_and_say_so(
    any_database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cap is read where the bounded count is: the paging module.
    monkeypatch.setattr("autotune.db.repository.paging.COUNT_CAP", 5)
    spec = JobSpec(job_id="j")
    decision = Decision(
        job_id="j",
        config=JobConfig.data_parallel(1),
        placement=None,
        source="policy",
        policy_version="v",
        reason="r",
    )
    with any_database.session() as session:
        repo.upsert_job(session=session, spec=spec, state="running")
        session.flush()
        repo.create_decisions(session=session, decisions=[(decision, None, None)] * 8)
    with any_database.session() as session:
        page = repo.list_decisions(session=session, limit=2)
        assert (page.count, page.count_exact) == (5, False)
        assert page.next_cursor is not None
        assert not repo.list_decisions(session=session, job_id="j").count_exact
        later = repo.list_decisions(session=session, since=utc_now() + timedelta(days=1))
        assert (later.count, later.count_exact, later.next_cursor) == (0, True, None)
        ids = []
        cursor = None
        while True:
            page = repo.list_decisions(session=session, limit=3, cursor=cursor)
            ids += [r.decision.decision_id for r in page.rows]
            if (cursor := page.next_cursor) is None:
                break
        assert ids == sorted(ids, reverse=True)
        assert len(set(ids)) == 8


def test_no_free_connection_in_time_is_503_with_retry_after(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "pool.db")
    Database(url).upgrade()
    api_db = Database(url, pool_size=1, pool_timeout_s=0.2)
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with api_db.engine.connect():
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    try:
        with TestClient(create_app(db=api_db, telemetry="simulator")) as client:
            for path in ("/api/v1/decisions", "/api/v1/jobs", "/api/v1/cluster"):
                response = client.get(path)
                assert response.status_code == 503, path
                assert response.headers["Retry-After"] == "1"
                assert "no database connection free" in response.json()["detail"]
            release.set()
            holder.join()
            assert client.get("/api/v1/decisions").status_code == 200
    finally:
        release.set()
        holder.join()
        api_db.dispose()


def test_busy_reads_are_kept_until_the_next_tick(database: Database) -> None:
    daemon = Daemon(
        DaemonParts(db=database, backend=SimulatedCluster(SimConfig(seed=4)), policy=RulesPolicy())
    )
    daemon.start()
    daemon.tick()
    app = create_app(db=database, telemetry="simulator")
    attach_daemon(app, daemon)
    cache = app.state.tick_cache
    with TestClient(app) as client:
        first = client.get("/api/v1/decisions", params={"limit": 5}).json()
        again = client.get("/api/v1/decisions", params={"limit": 5}).json()
        assert again == first
        assert (cache.hits, cache.misses) == (1, 1)
        timed = app.state.metrics.render().decode()
        assert 'route="/decisions",status="200"} 2.0' in timed  # the kept one too
        assert "unmatched" not in timed
        client.get("/api/v1/decisions", params={"limit": 6})  # another query: its own entry
        assert cache.misses == 2
        one = first["data"][0]["id"]
        client.get(f"/api/v1/decisions/{one}")  # one decision: never kept
        assert cache.misses == 2
        for _ in range(3):  # ticks commit new decisions: the next read shows them
            daemon.tick()
        after = client.get("/api/v1/decisions", params={"limit": 5}).json()
        assert after["data"][0]["id"] > one
        assert cache.misses == 3
