"""Trace loaders: the public traces as jobs and load series, and their answers to bad input."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autotune.catalog.profiles import MODEL_CATALOG
from autotune.envs.traces import (
    MODEL_TIERS,
    POLLUX_APPLICATIONS,
    TraceJob,
    alibaba_jobs,
    assign_model,
    helios_load,
    load_pods,
    philly_jobs,
    pollux_workload,
)
from autotune.errors import InputError

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def tier_of(num_gpus: int) -> tuple[str, ...]:
    return next(names for most, names in MODEL_TIERS if most is None or num_gpus <= most)


def expect_error(call: Callable[[], object], path: Path, row: int | None, column: str) -> str:
    """Run ``call``, which must fail naming ``path``, ``row`` and ``column``; its message."""
    with pytest.raises(InputError) as caught:
        call()
    message = str(caught.value)
    assert str(path) in message
    assert f"column {column!r}" in message
    assert (caught.value.row, caught.value.column) == (row, column)
    if row is not None:
        assert f"row {row}," in message
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------------------
# Model assignment
# --------------------------------------------------------------------------------------


def test_every_tier_model_is_in_the_catalog() -> None:
    assert [most for most, _ in MODEL_TIERS] == [1, 4, 8, None]
    for _, names in MODEL_TIERS:
        assert names
        assert set(names) <= set(MODEL_CATALOG)


@pytest.mark.parametrize(
    ("num_gpus", "expected"),
    [
        (1, {"resnet-50", "bert-large", "gpt-125m"}),
        (2, {"bert-large", "gpt-125m", "gpt-350m"}),
        (4, {"bert-large", "gpt-125m", "gpt-350m"}),
        (5, {"gpt-350m", "gpt-1.3b"}),
        (8, {"gpt-350m", "gpt-1.3b"}),
        (9, {"gpt-1.3b", "gpt-7b"}),
        (256, {"gpt-1.3b", "gpt-7b"}),
    ],
)
def test_assign_model_picks_every_model_of_the_size_tier(num_gpus: int, expected: set[str]) -> None:
    picked = {assign_model(f"job-{i}", num_gpus, seed=0) for i in range(200)}
    assert picked == expected


@pytest.mark.subprocess
def test_assign_model_depends_on_seed_and_id_only_not_on_the_interpreter(tmp_path: Path) -> None:
    ids = [f"job-{i}" for i in range(50)]
    here = [assign_model(i, 1, seed=3) for i in ids]
    assert here == [assign_model(i, 1, seed=3) for i in ids]
    assert here != [assign_model(i, 1, seed=4) for i in ids]
    code = (
        "from autotune.envs.traces import assign_model\n"
        f"print(','.join(assign_model(i, 1, seed=3) for i in {ids!r}))\n"
    )
    for hash_seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip().split(",") == here


@pytest.mark.parametrize("num_gpus", [0, -1])
def test_assign_model_refuses_a_job_without_gpus(num_gpus: int) -> None:
    with pytest.raises(ValueError, match="num_gpus"):
        assign_model("job", num_gpus, seed=0)


def test_trace_job_checks_its_fields() -> None:
    good = {"job_id": "a", "submit_s": 0.0, "num_gpus": 1, "duration_s": 5.0, "model": "m"}
    assert TraceJob(**good, global_batch=None).duration_s == 5.0
    for field, value in [
        ("num_gpus", 0),
        ("duration_s", 0.0),
        ("duration_s", float("nan")),
        ("submit_s", -1.0),
        ("job_id", ""),
    ]:
        with pytest.raises(ValueError, match=field):
            TraceJob(**{**good, field: value}, global_batch=None)


# --------------------------------------------------------------------------------------
# Alibaba v2023
# --------------------------------------------------------------------------------------


def test_alibaba_default_replays_every_gpu_pod_that_lived(alibaba_dir: Path) -> None:
    path = alibaba_dir / "openb_pod_list_default.csv.gz"
    started = time.perf_counter()
    jobs = alibaba_jobs(path)
    elapsed = time.perf_counter() - started
    assert elapsed < 5.0, f"loading {path.name} took {elapsed:.2f} s"

    pods = pd.read_csv(path)
    gpu = pods[pods.num_gpu > 0]
    lived = gpu[gpu.deletion_time > gpu.creation_time].sort_values("creation_time", kind="stable")
    # One GPU pod of the trace was deleted the second it was created.
    assert len(gpu) - len(lived) == 1
    assert len(jobs) == len(lived)
    assert [j.job_id for j in jobs] == lived.name.tolist()
    assert [j.num_gpus for j in jobs] == lived.num_gpu.tolist()
    durations = np.array([j.duration_s for j in jobs], dtype=float)
    assert np.array_equal(durations, (lived.deletion_time - lived.creation_time).to_numpy())
    assert (durations > 0).all()
    submits = [j.submit_s for j in jobs]
    assert submits[0] == 0.0
    assert submits == sorted(submits)
    assert submits[-1] == lived.creation_time.max() - lived.creation_time.min()
    assert all(j.max_nodes == 1 and j.global_batch is None for j in jobs)


def test_alibaba_gpu_sharing_pods_become_one_gpu_jobs(alibaba_dir: Path) -> None:
    pods = pd.read_csv(alibaba_dir / "openb_pod_list_gpushare40.csv.gz")
    shared = set(pods.name[(pods.gpu_milli < 1000) & (pods.num_gpu > 0)])
    jobs = alibaba_jobs(alibaba_dir / "openb_pod_list_gpushare40.csv.gz")
    sharing = [j for j in jobs if j.job_id in shared]
    assert len(sharing) > 1000
    assert {j.num_gpus for j in sharing} == {1}


def test_alibaba_models_are_seeded_and_sized(alibaba_dir: Path) -> None:
    path = alibaba_dir / "openb_pod_list_default.csv.gz"
    first = alibaba_jobs(path, seed=0)
    again = alibaba_jobs(path, seed=0)
    other = alibaba_jobs(path, seed=1)
    assert [j.model for j in first] == [j.model for j in again]
    changed = sum(a.model != b.model for a, b in zip(first, other, strict=True))
    assert 0 < changed < len(first)
    assert {j.num_gpus for j in first} == {1, 2, 4, 8}
    for job in first:
        assert job.model in tier_of(job.num_gpus)
    assert {j.model for j in first if j.num_gpus == 1} == set(tier_of(1))


def test_alibaba_gpu_spec_becomes_gpu_types(alibaba_dir: Path) -> None:
    path = alibaba_dir / "openb_pod_list_gpuspec33.csv.gz"
    pods = pd.read_csv(path, keep_default_na=False)
    specs = dict(zip(pods.name, pods.gpu_spec, strict=True))
    jobs = alibaba_jobs(path)
    constrained = [j for j in jobs if j.gpu_types is not None]
    assert len(constrained) > 100
    for job in jobs:
        spec = specs[job.job_id]
        assert job.gpu_types == (tuple(sorted(set(spec.split("|")))) if spec else None)


def test_alibaba_limit_keeps_the_first_jobs(alibaba_dir: Path) -> None:
    path = alibaba_dir / "openb_pod_list_default.csv.gz"
    assert alibaba_jobs(path, limit=25) == alibaba_jobs(path)[:25]


def test_alibaba_resampling_without_times_cannot_be_replayed(alibaba_dir: Path) -> None:
    path = alibaba_dir / "openb_pod_list_multigpu20.csv.gz"
    message = expect_error(lambda: alibaba_jobs(path), path, None, "creation_time")
    assert "cannot be replayed" in message


def test_alibaba_jobs_from_a_small_pod_list(tmp_path: Path) -> None:
    path = write(
        tmp_path / "pods.csv.gz",
        POD_HEADER
        + "p-late,1000,1024,2,1000,V100M16|T4,LS,Running,500,800,510\n"
        + "p-cpu,1000,1024,0,0,,BE,Running,50,60,50\n"
        + "p-first,1000,1024,1,250,,BE,Succeeded,100,160,101\n"
        + "p-instant,1000,1024,1,1000,,BE,Pending,300,300,\n",
    )
    jobs = alibaba_jobs(path, seed=7)
    assert [(j.job_id, j.submit_s, j.duration_s, j.num_gpus) for j in jobs] == [
        ("p-first", 0.0, 60.0, 1),
        ("p-late", 400.0, 300.0, 2),
    ]
    assert jobs[1].gpu_types == ("T4", "V100M16")
    assert [j.model for j in jobs] == [assign_model(j.job_id, j.num_gpus, 7) for j in jobs]
    assert load_pods(path).rows == [4, 5, 2]  # creation order, file lines


@pytest.mark.parametrize(
    ("line", "column", "words"),
    [
        ("p2,1000,1024,-1,1000,,LS,Running,10,20,10\n", "num_gpu", ">= 0"),
        ("p2,1000,1024,1,1000,,LS,Running,10,soon,10\n", "deletion_time", "'soon'"),
        ("p2,1000,1024,1,1000,,LS,Running,10,,10\n", "deletion_time", "not a finite number"),
        ("p2,1000,1024,1,1000,,LS,Running,10,5,10\n", "deletion_time", "before creation_time"),
        ("p2,1000,1024,1,1500,,LS,Running,10,20,10\n", "gpu_milli", "1-1000"),
    ],
)
def test_alibaba_bad_cell_names_file_row_and_column(
    tmp_path: Path, line: str, column: str, words: str
) -> None:
    path = write(
        tmp_path / "pods.csv", POD_HEADER + "p1,1000,1024,1,1000,,LS,Running,0,9,0\n" + line
    )
    assert words in expect_error(lambda: alibaba_jobs(path), path, 3, column)


def test_alibaba_missing_file_and_missing_column(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(InputError, match=r"nope\.csv: file not found"):
        alibaba_jobs(missing)
    path = write(tmp_path / "pods.csv", "name,cpu_milli,memory_mib,num_gpu\np1,1,1,1\n")
    with pytest.raises(InputError, match=r"pods\.csv: missing column\(s\) gpu_milli"):
        alibaba_jobs(path)


# --------------------------------------------------------------------------------------
# Pollux
# --------------------------------------------------------------------------------------


def test_pollux_workload_6(pollux_dir: Path) -> None:
    path = pollux_dir / "workloads" / "workload-6.csv"
    jobs = pollux_workload(path)
    assert len(jobs) == 160
    assert {j.model for j in jobs} == set(POLLUX_APPLICATIONS)
    frame = pd.read_csv(path)
    by_name = {j.job_id: j for j in jobs}
    for row in frame.itertuples():
        job = by_name[str(row.name)]
        assert job.submit_s == row.time - frame.time.min()
        assert (job.num_gpus, job.global_batch, job.model) == (
            row.num_replicas,
            row.batch_size,
            row.application,
        )
    assert jobs[0].submit_s == 0.0
    assert [j.submit_s for j in jobs] == sorted(j.submit_s for j in jobs)
    assert all(j.duration_s is None and j.gpu_types is None for j in jobs)


@pytest.mark.parametrize("number", range(1, 9))
def test_every_pollux_workload_loads(pollux_dir: Path, number: int) -> None:
    jobs = pollux_workload(pollux_dir / "workloads" / f"workload-{number}.csv")
    assert len(jobs) == 160
    assert {j.model for j in jobs} <= set(POLLUX_APPLICATIONS)
    assert min(j.num_gpus for j in jobs) >= 1


POLLUX_HEADER = "name,time,application,num_replicas,batch_size\n"


@pytest.mark.parametrize(
    ("line", "column", "words"),
    [
        ("b,20,gpt2,1,64\n", "application", "unknown application 'gpt2'"),
        ("b,20,ncf,0,64\n", "num_replicas", ">= 1"),
        ("b,20,ncf,1,big\n", "batch_size", "not an integer"),
        ("b,later,ncf,1,64\n", "time", "not a finite number"),
        ("a,20,ncf,1,64\n", "name", "already on row 2"),
    ],
)
def test_pollux_bad_cell_names_file_row_and_column(
    tmp_path: Path, line: str, column: str, words: str
) -> None:
    path = write(tmp_path / "workload.csv", POLLUX_HEADER + "a,10,bert,2,32\n" + line)
    assert words in expect_error(lambda: pollux_workload(path), path, 3, column)


def test_pollux_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path / "workload.csv", "name,time,application,num_replicas\na,1,ncf,1\n")
    with pytest.raises(InputError, match=r"workload\.csv: missing column\(s\) batch_size"):
        pollux_workload(path)


# --------------------------------------------------------------------------------------
# Philly-style job lists
# --------------------------------------------------------------------------------------


def test_philly_seconds_sorted_and_named_by_row(tmp_path: Path) -> None:
    path = write(
        tmp_path / "philly.csv.gz",
        "timestamp,duration,num_gpus\n1000,60,1\n400,3600.5,8\n1000,10,16\n700,5,2\n",
    )
    jobs = philly_jobs(path, seed=2)
    assert [(j.job_id, j.submit_s, j.duration_s, j.num_gpus) for j in jobs] == [
        ("philly-1", 0.0, 3600.5, 8),
        ("philly-3", 300.0, 5.0, 2),
        ("philly-0", 600.0, 60.0, 1),  # a tie keeps file order
        ("philly-2", 600.0, 10.0, 16),
    ]
    assert [j.model for j in jobs] == [assign_model(j.job_id, j.num_gpus, 2) for j in jobs]
    assert all(j.global_batch is None and j.max_nodes is None for j in jobs)


def test_philly_iso_timestamps_and_job_ids(tmp_path: Path) -> None:
    path = write(
        tmp_path / "philly.csv",
        "job_id,timestamp,duration,num_gpus\n"
        "application_2,2017-10-03 12:01:30,100,4\n"
        "application_1,2017-10-03T12:00:00,50,1\n"
        "application_3,2017-10-03T14:00:00+02:00,20,2\n",
    )
    jobs = philly_jobs(path)
    assert [(j.job_id, j.submit_s) for j in jobs] == [
        ("application_1", 0.0),
        ("application_3", 0.0),  # 14:00 at +02:00 is 12:00 UTC
        ("application_2", 90.0),
    ]


@pytest.mark.parametrize(
    ("line", "column", "words"),
    [
        ("2,ten,1\n", "duration", "not a finite number: 'ten'"),
        ("2,0,1\n", "duration", "must be > 0"),
        ("2,10,-2\n", "num_gpus", "must be >= 1, got -2"),
        ("2,10,1.5\n", "num_gpus", "not an integer"),
        ("yesterday,10,1\n", "timestamp", "not a finite number"),
    ],
)
def test_philly_bad_cell_names_file_row_and_column(
    tmp_path: Path, line: str, column: str, words: str
) -> None:
    path = write(tmp_path / "philly.csv", "timestamp,duration,num_gpus\n1,10,1\n" + line)
    assert words in expect_error(lambda: philly_jobs(path), path, 3, column)


def test_philly_timestamps_must_keep_the_first_rows_kind(tmp_path: Path) -> None:
    path = write(
        tmp_path / "philly.csv",
        "timestamp,duration,num_gpus\n2017-10-03 12:00:00,10,1\n1507032000,10,1\n",
    )
    assert "ISO 8601" in expect_error(lambda: philly_jobs(path), path, 3, "timestamp")


def test_philly_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path / "philly.csv", "timestamp,duration\n1,10\n")
    with pytest.raises(InputError, match=r"philly\.csv: missing column\(s\) num_gpus"):
        philly_jobs(path)


# --------------------------------------------------------------------------------------
# Helios
# --------------------------------------------------------------------------------------


def test_helios_gpu_utilization_per_minute(helios_dir: Path) -> None:
    series = helios_load(helios_dir / "earth_vc3sl.csv.gz")
    assert (series.name, series.column) == ("earth_vc3sl", "gpu_utilization")
    assert len(series.values) == 44_640
    assert np.array_equal(series.minutes, np.arange(44_640, dtype=np.float64))
    assert series.values.dtype == np.float64
    assert ((series.values >= 0) & (series.values <= 1)).all()
    assert not series.values.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        series.values[0] = 2.0


def test_helios_any_numeric_column(helios_dir: Path) -> None:
    path = helios_dir / "earth_vc3sl.csv.gz"
    series = helios_load(path, column="pending_gpu_num")
    assert np.array_equal(series.values, pd.read_csv(path).pending_gpu_num.to_numpy(float))
    message = expect_error(lambda: helios_load(path, column="gpu_util"), path, None, "gpu_util")
    assert "total_gpu_num" in message  # the available columns


@pytest.mark.parametrize(
    "name",
    [
        "earth_vc3sl",
        "earth_vc6YE",
        "earth_vc8Sj",
        "earth_vcJLV",
        "earth_vcJkd",
        "earth_vcLJZ",
        "earth_vcMod",
        "earth_vcSoL",
        "earth_vcTJs",
        "earth_vccaA",
    ],
)
def test_every_helios_cluster_loads(helios_dir: Path, name: str) -> None:
    series = helios_load(helios_dir / f"{name}.csv.gz")
    assert series.name == name
    assert series.minutes[-1] == 44_639.0
    assert 0.0 <= series.values.min() <= series.values.max() <= 1.0


HELIOS_HEADER = "time,total_gpu_num,gpu_utilization\n"


def test_helios_keeps_gaps(tmp_path: Path) -> None:
    path = write(
        tmp_path / "vc.csv",
        HELIOS_HEADER
        + "2020-05-01 00:00:00,8,0.5\n2020-05-01 00:01:00,8,0.25\n2020-05-01 00:05:30,8,1\n",
    )
    series = helios_load(path)
    assert series.name == "vc"
    assert series.minutes.tolist() == [0.0, 1.0, 5.5]
    assert series.values.tolist() == [0.5, 0.25, 1.0]


@pytest.mark.parametrize(
    ("line", "column", "words"),
    [
        ("2020-05-01 00:01:00,8,1.5\n", "gpu_utilization", "[0, 1], got 1.5"),
        ("2020-05-01 00:01:00,8,-0.1\n", "gpu_utilization", "[0, 1], got -0.1"),
        ("2020-05-01 00:01:00,8,high\n", "gpu_utilization", "not a finite number"),
        ("2020-05-01 00:01:00,8,nan\n", "gpu_utilization", "not a finite number"),
        ("2020-05-01 00:00:00,8,0.5\n", "time", "not after the previous row's"),
        ("2020-04-30 23:59:00,8,0.5\n", "time", "not after the previous row's"),
        ("May the first,8,0.5\n", "time", "not a date and time"),
    ],
)
def test_helios_bad_cell_names_file_row_and_column(
    tmp_path: Path, line: str, column: str, words: str
) -> None:
    path = write(tmp_path / "vc.csv", HELIOS_HEADER + "2020-05-01 00:00:00,8,0.5\n" + line)
    assert words in expect_error(lambda: helios_load(path), path, 3, column)


def test_helios_file_without_rows(tmp_path: Path) -> None:
    path = write(tmp_path / "vc.csv", HELIOS_HEADER)
    with pytest.raises(InputError, match=r"vc\.csv: no data rows"):
        helios_load(path)


def test_helios_demand_is_put_on_real_minutes(tmp_path: Path) -> None:
    """Rows every 30 s keep the newest of each minute; a minute without a row holds the
    one before; demand is running + pending GPUs, capacity the largest total."""
    from autotune.envs.traces import helios_demand

    csv = tmp_path / "vc.csv"
    csv.write_text(
        "time,running_gpu_num,pending_gpu_num,total_gpu_num\n"
        "2020-05-01 00:00:00,1,0,8\n"
        "2020-05-01 00:00:30,2,1,8\n"
        "2020-05-01 00:01:00,2,2,8\n"
        "2020-05-01 00:03:15,4,0,16\n"
    )
    series = helios_demand(csv)
    assert series.demand.tolist() == [3.0, 4.0, 4.0, 4.0]
    assert series.capacity == 16.0
    assert series.time.tolist()[0] == "2020-05-01 00:00:30"
    assert series.start == pd.Timestamp("2020-05-01 00:00:00", tz="UTC")
    bad = tmp_path / "bad.csv"
    bad.write_text("time,running_gpu_num,pending_gpu_num,total_gpu_num\nx,1,0,8\n")
    with pytest.raises(InputError, match="not a date"):
        helios_demand(bad)
