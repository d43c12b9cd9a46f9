"""The policy lifecycle in the decision loop, with policies that load in no time (the
rules under other version names): the active version is swapped in at the next tick, a
shadow decides beside it, and nothing the shadow does, failing included, fails a tick
or is applied."""

from __future__ import annotations

import logging

import pytest

from autotune.daemon.lifecycle import CheckpointInfo, PolicyLifecycle, round_agreement
from autotune.daemon.tick import Daemon, DaemonParts
from autotune.db import Database
from autotune.db import repository as repo
from autotune.decision.step import decide_for
from autotune.envs.simulator import SimConfig, SimulatedCluster
from autotune.interfaces import ClusterSnapshot, Policy, PolicyChoice, PolicyRound
from autotune.policies.rules import RulesPolicy


class Named(RulesPolicy):
    """The rules under another version name."""

    def __init__(self, version: str) -> None:
        super().__init__()
        self.version = version


class Failing(Named):
    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        raise RuntimeError("the shadow's module blew up")


class Waiting(Named):
    """Keeps every job as it is: running jobs run on, waiting jobs wait."""

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        return PolicyRound(
            choices={
                j.spec.job_id: PolicyChoice(config=None, reason="waits")
                for j in snapshot.by_state("pending")
            }
        )


class Loader:
    """Builds ``Named`` policies: a version's "checkpoint" is its own name; names starting
    with ``broken`` do not load, ``failing`` ones raise when deciding, ``waiting`` ones
    decide nothing."""

    def __init__(self) -> None:
        self.built: list[tuple[str, bool]] = []

    def inspect(self, checkpoint: str, kind: str) -> CheckpointInfo:
        return CheckpointInfo(path=checkpoint, content_hash="0" * 64, kind=kind, version=checkpoint)

    def build(
        self, kind: str, checkpoint: str | None, *, shadow: bool, follow: Policy | None
    ) -> Policy:
        assert checkpoint is not None
        self.built.append((checkpoint, shadow))
        if checkpoint.startswith("broken"):
            raise ValueError(f"cannot load {checkpoint}")
        if checkpoint.startswith("failing"):
            return Failing(checkpoint)
        if checkpoint.startswith("waiting"):
            return Waiting(checkpoint)
        return Named(checkpoint)

    def describe(self, policy: Policy) -> CheckpointInfo | None:
        return None


@pytest.fixture
def daemon(database: Database) -> Daemon:
    daemon = Daemon(
        DaemonParts(
            db=database,
            backend=SimulatedCluster(SimConfig(seed=3, initial_jobs=6, max_jobs=12)),
            policy=Named("base"),
            lifecycle=PolicyLifecycle(Loader(), database),
        )
    )
    daemon.start()
    with database.session() as session:
        for version in ("other", "same", "waiting", "failing", "broken"):
            repo.register_policy_version(
                session=session, version=version, kind="fake", checkpoint_path=version
            )
    return daemon


def _set(daemon: Daemon, *, shadow: str | None = None, activate: str | None = None) -> None:
    with daemon.db.session() as session:
        if shadow is not None:
            repo.set_shadow_policy(session=session, version=shadow)
        if activate is not None:
            repo.activate_policy(session=session, version=activate)


def _shadow_rows(daemon: Daemon) -> list[repo.DecisionRecord]:
    with daemon.db.session() as session:
        return repo.list_decisions(session=session, source="shadow", limit=1000).rows


def _metric(daemon: Daemon, name: str) -> list[float]:
    with daemon.db.session() as session:
        return [s.value for s in repo.list_metrics(session=session, names=[name])]


def test_the_active_version_is_swapped_in_at_the_next_tick(daemon: Daemon) -> None:
    daemon.tick()
    _set(daemon, activate="other")
    assert daemon.policy.version == "base"
    report = daemon.tick()
    assert daemon.policy.version == "other"
    assert all(d.policy_version == "other" for d in report.decisions)
    loader = daemon.lifecycle.loader  # type: ignore[union-attr]
    daemon.tick()
    assert loader.built == [("other", False)]  # loaded once


def test_an_identical_shadow_agrees_on_every_job_and_predicts_the_same(daemon: Daemon) -> None:
    _set(daemon, shadow="same")
    for _ in range(3):
        daemon.tick()
    assert _metric(daemon, "shadow_agreement") == [1.0, 1.0, 1.0]
    assert _metric(daemon, "shadow_predicted_goodput") == _metric(
        daemon, "active_predicted_goodput"
    )
    rows = _shadow_rows(daemon)
    assert rows
    assert all(r.applied_at is None and r.decision.policy_version == "same" for r in rows)
    with daemon.db.session() as session:
        taken = repo.list_decisions(session=session, limit=1000).rows
    # The same choices, side by side: one shadow row per decision taken while shadowing.
    assert sorted(r.decision.job_id for r in rows) == sorted(r.decision.job_id for r in taken)


def test_a_shadow_that_keeps_every_job_disagrees_where_the_active_decided(
    daemon: Daemon,
) -> None:
    _set(daemon, shadow="waiting")
    report = daemon.tick()
    (agreement,) = _metric(daemon, "shadow_agreement")
    assert report.decisions
    assert 0.0 <= agreement < 1.0
    assert _shadow_rows(daemon) == []  # it decided nothing
    (kept,) = _metric(daemon, "shadow_predicted_goodput")
    (active,) = _metric(daemon, "active_predicted_goodput")
    assert kept < active  # the jobs the active policy started add to its round only


def test_round_agreement_is_the_share_of_jobs_both_treated_alike(database: Database) -> None:
    cluster = SimulatedCluster(SimConfig(seed=5, initial_jobs=8, max_jobs=8))
    snapshot = cluster.observe()
    jobs = snapshot.by_state("pending", "running")
    rules = decide_for(snapshot, RulesPolicy(), {}, honoured={})
    assert round_agreement(jobs, rules, rules) == 1.0
    nothing = decide_for(snapshot, Waiting("w"), {}, honoured={})
    decided = {d.job_id for d in rules.decisions}
    assert decided
    expected = sum(1 for j in jobs if j.spec.job_id not in decided) / len(jobs)
    assert round_agreement(jobs, rules, nothing) == pytest.approx(expected)
    assert round_agreement([], rules, nothing) is None


def test_a_shadow_that_fails_to_decide_never_fails_the_tick(
    daemon: Daemon, caplog: pytest.LogCaptureFixture
) -> None:
    _set(daemon, shadow="failing")
    with caplog.at_level(logging.WARNING, logger="autotune"):
        for _ in range(2):
            report = daemon.tick()
    assert report.decisions is not None
    assert daemon.health.ok
    assert _shadow_rows(daemon) == []
    assert "policy.shadow_error" in [r.getMessage() for r in caplog.records]


def test_a_shadow_that_does_not_load_is_dropped_and_says_why(daemon: Daemon) -> None:
    _set(daemon, shadow="broken")
    daemon.tick()
    daemon.tick()
    assert daemon.health.ok
    assert daemon.lifecycle.shadow is None  # type: ignore[union-attr]
    with daemon.db.session() as session:
        _active, shadow = repo.policy_state(session=session)
        broken = repo.get_policy_version(session=session, version="broken")
        events = repo.list_policy_events(session=session, version="broken")
    assert shadow is None
    assert broken is not None
    assert broken.last_error == "ValueError: cannot load broken"
    assert [e.action for e in events].count("shadow_failed") == 1  # tried once


def test_an_active_version_that_does_not_load_leaves_the_policy(daemon: Daemon) -> None:
    daemon.tick()
    _set(daemon, activate="broken")
    daemon.tick()
    daemon.tick()
    assert daemon.policy.version == "base"
    assert daemon.health.ok
    with daemon.db.session() as session:
        active, _shadow = repo.policy_state(session=session)
        events = repo.list_policy_events(session=session, version="broken")
    assert active is not None
    assert active.version == "base"
    assert [e.action for e in events][:2] == ["activate_failed", "activate"]
    assert events[0].detail == {"reason": "ValueError: cannot load broken", "kept": "base"}


def test_a_tick_that_fails_stores_nothing_of_its_shadow(daemon: Daemon) -> None:
    _set(daemon, shadow="same")
    backend = daemon.backend
    apply = backend.apply

    def broken(decisions: object) -> None:
        raise ConnectionError("the cluster did not answer")

    backend.apply = broken  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        daemon.tick()
    assert _shadow_rows(daemon) == []
    assert _metric(daemon, "shadow_agreement") == []
    backend.apply = apply  # type: ignore[method-assign]
    daemon.tick()
    assert _metric(daemon, "shadow_agreement") == [1.0]


def test_stopping_the_shadow_drops_it_at_the_next_tick(daemon: Daemon) -> None:
    _set(daemon, shadow="same")
    daemon.tick()
    with daemon.db.session() as session:
        assert repo.clear_shadow_policy(session=session) is not None
    daemon.tick()
    assert daemon.lifecycle.shadow is None  # type: ignore[union-attr]
    assert len(_metric(daemon, "shadow_agreement")) == 1
