"""The transition log and its export: what the daemon logs of the learned policy's rounds
comes back as RLlib offline rows that say exactly what the policy saw, did, with which
probability, and what it got."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from replay_log import EPISODE_ROUNDS, TICKS, run_daemon
from sqlalchemy import func, select

from autotune.core import utc_now
from autotune.daemon.tick import Daemon
from autotune.db import Database
from autotune.db import repository as repo
from autotune.db.retention import RetentionPolicy, run_retention
from autotune.db.tables import TransitionExportRow, TransitionRow
from autotune.envs.workloads import load_workload
from autotune.errors import InputError
from autotune.policies.serving import PolicyServer
from autotune.replay.export import MAX_FILES, export
from autotune.rl.acting import entry_probabilities
from autotune.rl.action import ACTION_DIMS
from autotune.rl.observation import HEADER, SLOT


def test_every_round_of_the_learned_policy_is_logged_with_its_reward(
    logged_export: tuple[str, Path, Daemon],
) -> None:
    url, _, daemon = logged_export
    db = Database(url)
    with db.session() as session:
        rows = session.scalars(select(TransitionRow).order_by(TransitionRow.id)).all()
        assert len(rows) == TICKS == daemon.transitions.rows  # type: ignore[union-attr]
        # Episodes of EPISODE_ROUNDS consecutive rounds, the last cut by the stop.
        assert [r.step for r in rows] == [i % EPISODE_ROUNDS for i in range(TICKS)]
        assert rows[EPISODE_ROUNDS - 1].truncated
        assert rows[-1].truncated
        assert sum(r.truncated for r in rows) == 2
        for row in rows[:-1]:
            assert row.reward is not None
            assert row.reward_parts is not None
            parts = row.reward_parts
            cluster = sum(parts["cluster"].values())
            assert row.reward == pytest.approx(cluster)
            mine = sum(j["reward"] for j in parts["jobs"].values())
            # The jobs' own rewards leave only the idle GPUs' energy to the cluster.
            # (parts are stored to 7 significant digits)
            assert cluster - mine == pytest.approx(0.0, abs=1e-4) or (
                parts["cluster"]["energy"] - 1e-4 <= cluster - mine <= 1e-4
            )
        assert rows[-1].reward is None  # never measured: the daemon stopped
        slots = rows[0].slots
        assert len(slots["jobs"]) == 10  # the stream's ten waiting jobs
        assert all(m == [0, 1, 1, 1, 1, 1, 1] for m in slots["mask"])  # waiting jobs
        obs = repo.unpack_observation(rows[0].observation, HEADER + len(SLOT) * 32)
        assert obs.shape == (HEADER + len(SLOT) * 32,)
        assert obs[HEADER + len(SLOT) * 10 :].sum() == 0
    db.dispose()


def test_the_export_holds_rllib_columns_and_the_logged_probabilities(
    logged_export: tuple[str, Path, Daemon],
) -> None:
    _, out, _ = logged_export
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "autotune-replay/1"
    assert manifest["round_s"] == 300.0
    assert manifest["energy_weight"] == 0.05
    assert manifest["epsilon"] == [0.1]
    assert manifest["observation_size"] == HEADER + len(SLOT)
    assert 1 <= len(manifest["files"]) <= MAX_FILES
    table = pq.read_table(out / manifest["files"][0])
    assert table.num_rows == manifest["rows"] > 100
    for name in (
        "obs",
        "actions",
        "rewards",
        "new_obs",
        "terminateds",
        "truncateds",
        "eps_id",
        "t",
    ):
        assert name in table.column_names
    frame = table.to_pandas()
    obs = np.stack(frame["obs"].to_numpy()).astype(np.float32)
    entries = np.stack(frame["actions"].to_numpy())
    mask = np.stack(frame["action_mask"].to_numpy())
    logp_dims = np.stack(frame["action_logp_dims"].to_numpy())
    # The logged log-probabilities are the acting policy's, epsilon-greedy over its
    # module's most likely values: recompute them from the observation alone.
    server = PolicyServer(slots=1)
    probs = entry_probabilities(server.logits(obs), 0.1)
    rows = np.arange(len(frame))
    for d in range(len(ACTION_DIMS)):
        expected = np.where(mask[:, d], np.log(probs[d][rows, entries[:, d]]), 0.0)
        np.testing.assert_allclose(logp_dims[:, d], expected, atol=1e-5)
    np.testing.assert_allclose(frame["action_logp"], logp_dims.sum(1), atol=1e-9)
    assert (frame["action_logp"] < 0).all()  # never probability 1 with epsilon > 0
    # Each episode is one job's consecutive decisions, t from 0; new_obs is the next obs.
    for _, episode in frame.groupby("eps_id"):
        assert list(episode["t"]) == list(range(len(episode)))
        assert episode["job_id"].nunique() == 1
        following = np.stack(episode["obs"].to_numpy())[1:]
        earlier = np.stack(episode["new_obs"].to_numpy())[:-1]
        np.testing.assert_array_equal(following, earlier)
        ends = episode["terminateds"] | episode["truncateds"]
        assert not ends.iloc[:-1].any()
        assert ends.iloc[-1]  # every job episode ends with a flag
    parts = frame[[f"reward_{p}" for p in ("goodput", "oom", "nan", "restart", "energy")]]
    np.testing.assert_allclose(frame["rewards"], parts.sum(axis=1), rtol=1e-5, atol=1e-6)


def test_the_workload_replays_the_logged_jobs(logged_export: tuple[str, Path, Daemon]) -> None:
    _, out, daemon = logged_export
    nodes, arrivals, round_s = load_workload(out)
    sim = daemon.backend
    assert round_s == 300.0
    assert {n.node_id for n in nodes} == {n.node_id for n in sim.snapshot().nodes}  # type: ignore[attr-defined]
    assert len(arrivals) == 14
    factors = {
        j["spec"]["job_id"]: j["speed_factor"]
        for j in json.loads((out / "workload.json").read_text())["jobs"]
    }
    # Jobs that ran were measured: a straggler tail above or below the median makes a
    # job slower or faster than the model's noise-free speed, and its replay trains that
    # much more or less work at the model's speed.
    measured = [f for f in factors.values() if f != 1.0]
    assert len(measured) >= 8
    assert all(0.5 < f < 1.5 for f in measured)
    assert len(set(measured)) > 1
    for arrival in arrivals:
        job = sim.jobs[arrival.spec.job_id]  # type: ignore[attr-defined]
        assert arrival.work == pytest.approx(job.work / factors[arrival.spec.job_id])
        assert arrival.reference_gpus == job.arrival.reference_gpus
        assert arrival.spec.submitted_at == pytest.approx(job.arrival.spec.submitted_at)


def test_export_refuses_what_it_cannot_do(
    tmp_path: Path, logged_export: tuple[str, Path, Daemon]
) -> None:
    url, out, _ = logged_export
    with pytest.raises(InputError, match="not empty"):
        export(url, out)
    empty = Database(f"sqlite:///{tmp_path / 'empty.db'}")
    empty.upgrade()
    with pytest.raises(InputError, match="no logged transitions"):
        export(empty.url, tmp_path / "out")
    empty.dispose()


def test_a_daemon_that_restarts_closes_the_round_it_left_open(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    db = Database(url)
    db.upgrade()
    with db.session() as session:
        repo.create_transition(
            session=session,
            episode="old-0000",
            step=0,
            policy_version="ppo-x",
            epsilon=0.05,
            observation=repo.pack_observation(np.zeros(HEADER), HEADER),
            slots={"jobs": [], "running": [], "entries": [], "mask": [], "logp": [], "applied": []},
        )
    run_daemon(url, ticks=2)
    with db.session() as session:
        first = session.scalars(select(TransitionRow).order_by(TransitionRow.id)).first()
        assert first is not None
        assert first.truncated
        assert first.reward is None
        assert session.scalar(select(func.count()).select_from(TransitionRow)) == 3
    db.dispose()


def test_the_export_benchmark_writes_one_row_per_job_decision(tmp_path: Path) -> None:
    """``bench/replay_export.py`` at a small size: every logged job decision is a row, in
    at most ``MAX_FILES`` files (its timing is in bench/RESULTS.md, not asserted here)."""
    from autotune.benchmarks import replay_export as bench

    result = bench.main(["--rounds", "600", "--jobs", "7", "--json-out", str(tmp_path / "r.json")])
    assert result["rows"] == 600 * 7
    assert 1 <= result["files"] <= MAX_FILES
    assert json.loads((tmp_path / "r.json").read_text()) == result


def test_compacted_transitions_export_the_same_rows(tmp_path: Path) -> None:
    """Retention compacts old logged rounds (their JSON as one compressed blob), a few per
    step, oldest first; the export reads them back to the same rows."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    run_daemon(url, ticks=14)
    before = export(url, tmp_path / "before")
    db = Database(url)
    with db.session() as session:
        plain = sum(
            len(json.dumps(r.slots)) + len(json.dumps(r.reward_parts))
            for r in session.scalars(select(TransitionRow))
        )
    policy = RetentionPolicy(transitions_days=None, transitions_compact_days=1.0, batch_rows=4)
    report = run_retention(db, policy, utc_now() + timedelta(days=2))
    assert report.transitions_compacted == 14
    assert report.steps >= 4  # four rounds per step: the search resumes past the prefix
    assert report.deleted["transitions"] == 0
    with db.session() as session:
        rows = session.scalars(select(TransitionRow)).all()
        assert all(r.packed is not None and r.slots == {} and r.reward_parts is None for r in rows)
        packed = sum(len(r.packed or b"") for r in rows)
    assert packed < plain / 2
    # Nothing younger than a day is compacted.
    assert run_retention(db, policy, utc_now()).transitions_compacted == 0
    db.dispose()
    after = export(url, tmp_path / "after")
    assert (after.rows, after.rounds) == (before.rows, before.rounds)
    old = pq.read_table(tmp_path / "before" / before.files[0])
    new = pq.read_table(tmp_path / "after" / after.files[0])
    assert new.equals(old)


def test_an_export_lets_retention_delete_what_it_covered(tmp_path: Path) -> None:
    """Logged rounds past transitions_days stay until an export has read them (or until
    transitions_unexported_days); the export records the ids it read."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    run_daemon(url, ticks=6)
    db = Database(url)
    policy = RetentionPolicy(transitions_days=1.0, transitions_unexported_days=90.0)
    later = utc_now() + timedelta(days=2)
    assert run_retention(db, policy, later).deleted["transitions"] == 0  # not exported
    report = export(url, tmp_path / "out")
    with db.session() as session:
        exports = session.scalars(select(TransitionExportRow)).all()
        ids = sorted(session.scalars(select(TransitionRow.id)))
    assert [(e.first_id, e.last_id, e.rounds) for e in exports] == [
        (ids[0], ids[-1], report.rounds)
    ]
    assert exports[0].path == str((tmp_path / "out").resolve())
    assert run_retention(db, policy, later).deleted["transitions"] == len(ids)
    db.dispose()


def test_a_round_someone_else_decided_breaks_the_chain(tmp_path: Path) -> None:
    """A round the learned policy did not decide (the rules did, as the fallback would)
    is not logged, and no transition links across it: the round before it is truncated
    and its new_obs is not the round after it."""
    url = f"sqlite:///{tmp_path / 'd.db'}"
    run_daemon(url, ticks=8, rules_ticks=frozenset({4}))
    db = Database(url)
    with db.session() as session:
        rows = session.scalars(select(TransitionRow).order_by(TransitionRow.id)).all()
        assert [r.sim_time_s for r in rows] == [300.0 * t for t in (0, 1, 2, 3, 5, 6, 7)]
        assert [r.truncated for r in rows] == [False, False, False, True, False, False, True]
        assert rows[3].reward is not None  # measured all the same
    db.dispose()
    export(url, tmp_path / "out")
    frame = pq.read_table(tmp_path / "out" / "transitions-00000.parquet").to_pandas()
    before = frame[frame["tick"] == 3]
    assert before["truncateds"].all() or before["terminateds"].all()
    slots = np.stack(before["new_obs"].to_numpy())[:, HEADER:]
    assert (slots == 0).all()  # the round after it was not the policy's
    # The logged rounds' steps; the last one was never measured (the daemon stopped).
    assert set(frame["tick"]) == {0, 1, 2, 3, 4, 5}
