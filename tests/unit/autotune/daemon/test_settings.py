from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from autotune.core import utc_now
from autotune.daemon.hosting import retention_loop
from autotune.daemon.settings import load_settings
from autotune.db import Database, sqlite_url
from autotune.db import repository as repo
from autotune.db.retention import RetentionPolicy
from autotune.errors import InputError


def test_precedence_defaults_toml_env_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AUTOTUNE_CONFIG", raising=False)
    defaults = load_settings()
    assert (defaults.host, defaults.port, defaults.tick_s) == ("127.0.0.1", 8000, 2.0)
    assert defaults.database_url.endswith("autotune.db")
    config = tmp_path / "autotune.toml"
    config.write_text('tick_s = 5\nport = 9000\ndb_url = "sqlite:///from-toml.db"\n')
    from_file = load_settings(config)
    assert (from_file.tick_s, from_file.port) == (5.0, 9000)
    monkeypatch.setenv("AUTOTUNE_PORT", "9100")
    monkeypatch.setenv("AUTOTUNE_CONFIG", str(config))
    from_env = load_settings()
    assert (from_env.tick_s, from_env.port) == (5.0, 9100)
    assert load_settings(port=9200).port == 9200
    assert load_settings(port=None).port == 9100


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AUTOTUNE_TICK_S": "-1"}, "setting tick_s='-1'"),
        ({"AUTOTUNE_PORT": "http"}, "setting port='http'"),
        ({"AUTOTUNE_LOG_FORMAT": "xml"}, "setting log_format='xml'"),
    ],
)
def test_bad_values_name_the_setting(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(InputError, match=message):
        load_settings()


def test_unknown_keys_and_missing_files_are_errors(tmp_path: Path) -> None:
    config = tmp_path / "autotune.toml"
    config.write_text("tick = 5\n")
    with pytest.raises(InputError, match="tick"):
        load_settings(config)
    with pytest.raises(InputError, match="config file not found"):
        load_settings(tmp_path / "absent.toml")
    config.write_text("tick_s = [\n")
    with pytest.raises(InputError, match=r"autotune\.toml"):
        load_settings(config)


def test_retention_settings_make_the_policy_and_bad_ones_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = load_settings().retention()
    assert (policy.metrics_full_days, policy.metrics_days, policy.decisions_days) == (1, 30, 90)
    assert policy.transitions_days == 30
    monkeypatch.setenv("AUTOTUNE_RETENTION_DECISIONS_DAYS", "0")
    monkeypatch.setenv("AUTOTUNE_RETENTION_TRANSITIONS_DAYS", "0")
    monkeypatch.setenv("AUTOTUNE_RETENTION_METRICS_FULL_DAYS", "0")
    kept = load_settings().retention()
    assert kept.decisions_days is None
    assert kept.transitions_days is None
    assert kept.metrics_full_days is None
    monkeypatch.setenv("AUTOTUNE_RETENTION_METRICS_FULL_DAYS", "40")
    with pytest.raises(InputError, match="metrics_full_days"):
        load_settings().retention()


def test_the_retention_loop_applies_the_policy_and_stops(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path / "r.db"))
    database.upgrade()
    old = utc_now() - timedelta(days=40)
    with database.session() as session:
        repo.record_metrics(session=session, values=[("gpu_utilization", 0.5, None)], at=old)
        repo.record_metrics(session=session, values=[("gpu_utilization", 0.7, None)])
    stop = threading.Event()
    runner = threading.Thread(
        target=retention_loop, args=(database, RetentionPolicy(), 3600.0, stop)
    )
    runner.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with database.session() as session:
            values = [
                s.value for s in repo.list_metrics(session=session, names=["gpu_utilization"])
            ]
        if values == [0.7]:
            break
        time.sleep(0.05)
    stop.set()
    runner.join(timeout=10)
    assert not runner.is_alive()
    assert values == [0.7]
    database.dispose()


def test_the_simulator_plays_a_slice_of_a_pollux_workload(pollux_dir: Path) -> None:
    from autotune.daemon.backends import build_backend
    from autotune.envs.simulator import SimulatedCluster

    workload = pollux_dir / "workloads" / "workload-2.csv"
    settings = load_settings(sim_workload=workload, sim_workload_jobs="80:160", sim_gpus=32)
    cluster = build_backend(settings)
    assert isinstance(cluster, SimulatedCluster)
    assert cluster.total_gpus == 32
    snapshot = cluster.observe()
    assert {n.gpu_model for n in snapshot.nodes} == {"T4"}
    # The slice's first job arrives at 0 (re-based), whatever its time in the workload.
    assert snapshot.jobs
    assert min(j.spec.submitted_at for j in snapshot.jobs) == 0.0
    with pytest.raises(InputError, match="sim_workload_jobs='80-160'"):
        load_settings(sim_workload=workload, sim_workload_jobs="80-160")
    with pytest.raises(InputError, match="no job of the workload"):
        build_backend(load_settings(sim_workload=workload, sim_workload_jobs="500:"))


@pytest.mark.parametrize(
    ("variable", "argument"),
    [
        ("AUTOTUNE_ADAPTIVE_TOPK", "adaptive_topk"),
        ("AUTOTUNE_BALANCE_BATCH", "balance_batch"),
        ("AUTOTUNE_MIX_GPU_MODELS", "mix_models"),
    ],
)
def test_the_ray_backend_is_built_with_the_settings_executor_switches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, argument: str
) -> None:
    """``adaptive_topk``, ``balance_batch`` and ``mix_gpu_models`` (off by default) reach
    the Ray backend, which hands them to every job's runner (``RunnerConfig``) or its
    snapshots (``ClusterSnapshot.mixes_models``)."""
    import autotune.executor.ray_backend as ray_backend
    from autotune.daemon.backends import build_backend

    made: list[dict[str, object]] = []
    monkeypatch.setattr(ray_backend, "RayBackend", lambda **kwargs: made.append(kwargs))
    monkeypatch.setenv(variable, "true")
    build_backend(load_settings(backend="ray", data_dir=tmp_path))
    monkeypatch.delenv(variable)
    build_backend(load_settings(backend="ray", data_dir=tmp_path))
    assert [m[argument] for m in made] == [True, False]


def test_the_ray_backend_balances_only_the_jobs_that_can() -> None:
    """``balances``: data parallelism only, over two ranks or more, and a task whose
    batches split unevenly."""
    from autotune.core import JobConfig, Layout
    from autotune.executor.runner import balances

    dp2 = JobConfig.data_parallel(2)
    assert balances("gpt-char", 64, dp2)
    assert not balances("gpt-char", 64, JobConfig.data_parallel(1))
    assert not balances("gpt-char", 64, JobConfig(layout=Layout(world_size=4, tp=2)))
    hang = Path(__file__).resolve().parents[3] / "data" / "hang_task.py"
    assert not balances(f"{hang}:HangOnce", 64, dp2)  # its batches() takes no shares
