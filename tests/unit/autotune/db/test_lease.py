"""The leader lease: one holder at a time, terms that only grow, and a fencing check that
rolls back the writes of a daemon whose term has ended (on SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select

from autotune.core import Decision, JobConfig, JobSpec
from autotune.db import Database
from autotune.db import lease as leases
from autotune.db import repository as repo
from autotune.db.tables import DecisionRow


def test_one_holder_at_a_time_and_the_term_grows_at_each_change(any_database: Database) -> None:
    with any_database.session() as session:
        assert leases.current(session).holder is None
        assert leases.acquire(session, holder="a", lease_s=0.5) == 1
    with any_database.session() as session:
        assert leases.acquire(session, holder="b", lease_s=0.5) is None  # a holds it
        assert leases.renew(session, holder="a", term=1, lease_s=0.5)
        state = leases.current(session)
    assert state.holder == "a"
    assert state.term == 1
    assert 0 < state.expires_in_s <= 0.5
    time.sleep(0.6)
    with any_database.session() as session:
        assert not leases.current(session).held
        assert leases.acquire(session, holder="b", lease_s=0.5) == 2
    with any_database.session() as session:
        # a's term ended: it can neither renew nor write as the leader
        assert not leases.renew(session, holder="a", term=1, lease_s=0.5)
        assert leases.release(session, holder="b", term=2)
        assert leases.acquire(session, holder="a", lease_s=0.5) == 3  # released: at once
        assert [t[:2] for t in leases.terms(session)] == [(1, "a"), (2, "b"), (3, "a")]


def test_a_leader_whose_lease_expired_unclaimed_renews_its_own_term(
    any_database: Database,
) -> None:
    with any_database.session() as session:
        assert leases.acquire(session, holder="a", lease_s=0.2) == 1
    time.sleep(0.3)  # the database was gone, say; nobody took the lease meanwhile
    with any_database.session() as session:
        assert leases.renew(session, holder="a", term=1, lease_s=0.2)
        assert leases.current(session).term == 1


def _decision(job_id: str) -> Decision:
    return Decision(
        job_id=job_id,
        config=JobConfig.data_parallel(1),
        placement=None,
        source="policy",
        policy_version="rules-test",
        reason="test",
    )


def test_the_fence_rolls_back_a_deposed_leaders_writes(any_database: Database) -> None:
    spec = JobSpec(job_id="job-1")
    with any_database.session() as session:
        repo.upsert_job(session=session, spec=spec, state="pending")
        assert leases.acquire(session, holder="a", lease_s=0.2) == 1
    with any_database.session() as session:
        leases.fence(session, holder="a", term=1, lease_s=0.2)
        repo.create_decisions(session=session, decisions=[(_decision("job-1"), None, None)], term=1)
    time.sleep(0.3)
    with any_database.session() as session:
        assert leases.acquire(session, holder="b", lease_s=5) == 2
    deposed = pytest.raises(leases.LeaseLostError, match="term 2 of b, not term 1 of a")
    with deposed, any_database.session() as session:
        leases.fence(session, holder="a", term=1, lease_s=0.2)
        repo.create_decisions(session=session, decisions=[(_decision("job-1"), None, None)], term=1)
    with any_database.session() as session:
        rows = session.execute(select(DecisionRow.term, func.count()).group_by(DecisionRow.term))
        assert dict(rows.all()) == {1: 1}
        assert leases.terms(session)[0][2:] == (1, 1, 1)  # term 1: one decision, id 1


def test_racing_daemons_take_an_expired_lease_once(any_database: Database) -> None:
    """Eight daemons try at the same moment: exactly one gets the term."""
    won: list[tuple[str, int]] = []
    barrier = threading.Barrier(8)

    def contend(name: str) -> None:
        barrier.wait()
        with any_database.session() as session:
            term = leases.acquire(session, holder=name, lease_s=30)
        if term is not None:
            won.append((name, term))

    threads = [threading.Thread(target=contend, args=(f"d{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(won) == 1
    assert won[0][1] == 1
    with any_database.session() as session:
        assert leases.current(session).holder == won[0][0]
