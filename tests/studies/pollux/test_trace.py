"""Pollux's simulator physics on the measured traces: batch split, trace lookups,
statistical efficiency and epoch-by-epoch progress, against the artifact's numbers."""

from __future__ import annotations

import csv
import math
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from autotune.errors import InputError
from autotune.studies.pollux.trace import (
    POLLUX_MAX_EPOCHS,
    BatchSplit,
    TraceApp,
    load_trace_app,
    load_trace_apps,
)

ROUND = 60  # Pollux's scheduling interval (s)
RESTART = 30  # Pollux's restart penalty on every (re)allocation (s)


@pytest.fixture
def apps(pollux_dir: Path) -> dict[str, TraceApp]:
    return load_trace_apps(pollux_dir / "traces")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_constants_from_the_files(apps: dict[str, TraceApp]) -> None:
    assert (
        set(apps)
        == set(POLLUX_MAX_EPOCHS)
        == {
            "bert",
            "cifar10",
            "deepspeech2",
            "imagenet",
            "ncf",
            "yolov3",
        }
    )
    cifar = apps["cifar10"]
    assert (cifar.init_batch, cifar.max_batch, cifar.min_local, cifar.max_local) == (
        128,
        4096,
        32,
        1024,
    )
    assert cifar.max_epochs == 100
    assert apps["yolov3"].max_local == 8  # overridden, as the simulator does
    assert (apps["ncf"].init_batch, apps["ncf"].max_batch, apps["ncf"].max_local) == (
        256,
        32768,
        32768,
    )
    # Spec table 2.3: get_progress(max_epochs).
    assert apps["bert"].target_progress == 14774.0
    assert apps["ncf"].target_progress == 194174.0
    assert apps["cifar10"].target_progress == pytest.approx(39062.908, abs=1e-3)
    assert apps["imagenet"].target_progress == pytest.approx(576525.59, abs=1e-2)


def test_cached_per_folder(pollux_dir: Path) -> None:
    first = load_trace_apps(pollux_dir / "traces")
    second = load_trace_apps(pollux_dir / "traces" / ".." / "traces")
    assert first["cifar10"] is second["cifar10"]


def test_epoch_boundaries_are_the_least_progress_of_any_batch(
    apps: dict[str, TraceApp], pollux_dir: Path
) -> None:
    cifar = apps["cifar10"]
    folder = pollux_dir / "traces" / "cifar10"
    first = min(float(_rows(p)[0]["progress"]) for p in folder.glob("validation-*.csv"))
    assert first < 391.0  # batch 128 needs 391, another batch less
    assert cifar.epoch_progress(0) == 0.0
    assert cifar.epoch_progress(1) == first
    assert cifar.epoch_progress(100) == cifar.target_progress
    assert cifar.epoch_of(0.0) == 0
    assert cifar.epoch_of(first - 1e-6) == 0
    assert cifar.epoch_of(first) == 1
    assert cifar.epoch_of(cifar.target_progress) == 99  # capped at max_epochs - 1
    with pytest.raises(ValueError, match="epoch"):
        cifar.epoch_progress(101)


def test_split(apps: dict[str, TraceApp]) -> None:
    assert apps["cifar10"].split(6, 2048) == BatchSplit(atomic=342, accum_steps=0, batch=2052)
    assert apps["ncf"].split(1, 32768) == BatchSplit(atomic=16384, accum_steps=1, batch=32768)
    assert apps["yolov3"].split(4, 64) == BatchSplit(atomic=8, accum_steps=1, batch=64)
    assert apps["bert"].split(6, 384) == BatchSplit(atomic=10, accum_steps=5, batch=360)
    # One GPU above the initial batch accumulates at least once, even when the batch fits.
    assert apps["cifar10"].split(1, 256) == BatchSplit(atomic=128, accum_steps=1, batch=256)
    assert apps["cifar10"].split(1, 128) == BatchSplit(atomic=128, accum_steps=0, batch=128)
    assert apps["cifar10"].split(2, 256) == BatchSplit(atomic=128, accum_steps=0, batch=256)


def test_step_times_of_a_traced_placement(apps: dict[str, TraceApp], pollux_dir: Path) -> None:
    rows = _rows(pollux_dir / "traces" / "cifar10" / "placements.csv")
    row = [r for r in rows if r["placement"] == "24"][3]
    step, sync = apps["cifar10"].step_times((2, 4), int(row["local_bsz"]))
    assert (step, sync) == (float(row["step_time"]), float(row["sync_time"]))
    # The smallest rotation is what is looked up.
    assert apps["cifar10"].step_times((4, 2), 342) == apps["cifar10"].step_times((2, 4), 342)
    assert apps["bert"].step_times((4, 4, 2), 8) == apps["bert"].step_times((2, 4, 4), 8)
    assert apps["bert"].step_times((0, 4, 2, 0), 8) == apps["bert"].step_times((2, 4), 8)
    # Spec 2.7: cifar10 on (4,2) at 342 per GPU.
    assert step == pytest.approx(apps["cifar10"].step_times((2, 4), int(row["local_bsz"]))[0])
    assert apps["cifar10"].step_times((4, 2), 342) == pytest.approx((0.2688, 0.0201), abs=1e-4)


def test_step_times_beyond_four_nodes_interpolate(
    apps: dict[str, TraceApp], pollux_dir: Path
) -> None:
    rows = [
        r
        for r in _rows(pollux_dir / "traces" / "cifar10" / "scalability.csv")
        if (r["num_nodes"], r["num_replicas"]) == ("6", "24")
    ]
    cifar = apps["cifar10"]
    steps = [float(r["step_time"]) for r in rows]
    for r in rows:  # the measured points themselves
        got = cifar.step_times((4,) * 6, int(r["local_bsz"]))
        assert got == pytest.approx((float(r["step_time"]), float(r["sync_time"])), rel=1e-9)
    assert [r["local_bsz"] for r in rows[1:3]] == ["45", "64"]
    step, sync = cifar.step_times((4,) * 6, 54)
    assert min(steps) <= step <= max(steps)
    assert float(rows[1]["step_time"]) >= step >= float(rows[2]["step_time"])
    assert math.isfinite(sync)
    assert sync > 0
    # 22 GPUs on 6 nodes: not measured, between the 20- and 24-GPU rows.
    step22, _ = cifar.step_times((4, 4, 4, 4, 4, 2), 128)
    assert math.isfinite(step22)
    assert step22 > 0
    # Spec 2.7: imagenet 24 GPUs on 6 nodes at 134 per GPU.
    assert apps["imagenet"].step_times((4,) * 6, 134) == pytest.approx((0.7453, 0.0599), abs=1e-4)


def test_step_times_outside_the_traces_raise(apps: dict[str, TraceApp]) -> None:
    with pytest.raises(ValueError, match=r"outside the traced range 32\.\.1024"):
        apps["cifar10"].step_times((4, 2), 2000)
    with pytest.raises(ValueError, match="outside the traced range"):
        apps["cifar10"].step_times((1,), 16)
    with pytest.raises(ValueError, match="no step time"):
        apps["cifar10"].step_times((4,) * 6, 5000)
    with pytest.raises(ValueError, match="placement"):
        apps["cifar10"].step_times((0, 0), 64)


def test_gain(apps: dict[str, TraceApp], pollux_dir: Path) -> None:
    cifar = apps["cifar10"]
    assert cifar.gain(128, 0) == 1.0  # the initial batch: one progress unit per step
    row = _rows(pollux_dir / "traces" / "cifar10" / "validation-1024.csv")[5]
    sqr, var = float(row["grad_sqr"]), float(row["grad_var"])
    assert cifar.gain(1024, 5) == (var + sqr) / (var / 8 + sqr)
    # Between validated batches the statistics interpolate, so the gain does too.
    assert cifar.gain(512, 5) < cifar.gain(768, 5) < cifar.gain(1024, 5) < 1024 / 128
    with pytest.raises(ValueError, match="validated range"):
        cifar.gain(64, 0)
    rate = cifar.rate((4, 2), 2048, 5)
    step, _ = cifar.step_times((4, 2), 342)
    assert rate == cifar.gain(2052, 5) / step  # no accumulation


# Seconds from a job's first allocation to its completion. Obtained by running Pollux's
# Job.step (the reference re-implementation of simulator.py, which reproduces every
# per-job JCT of the artifact's Tiresias results) with 60 s rounds, a 30 s restart on
# each placement, starting at t=0; a placement with a round count moves after that many
# rounds.
REFERENCE = [
    ("cifar10", 2048, [((4, 2), None)], 940),
    ("imagenet", 1600, [((2, 1, 3, 2), None)], 76841),
    ("bert", 384, [((4, 4, 4, 4, 4, 2), None)], 1305),
    ("yolov3", 64, [((4,), 20), ((2, 2), None)], 24019),
    ("ncf", 32768, [((1,), None)], 77),
    ("deepspeech2", 320, [((3, 1, 4), 10), ((1,) * 8, None)], 3066),
]


def _simulate(
    app: TraceApp, batch: int, schedule: Sequence[tuple[tuple[int, ...], int | None]]
) -> tuple[float, int | None]:
    """Run ``app`` in rounds as Pollux's simulator does: (progress, completion time)."""
    progress, now = 0.0, 0
    for placement, rounds in schedule:
        delay, done = RESTART, 0
        while rounds is None or done < rounds:
            wait = min(delay, ROUND)
            delay -= wait
            progress, finished = app.run(progress, placement, batch, ROUND - wait)
            if finished is not None:
                return progress, now + wait + int(finished)
            now += ROUND
            done += 1
    return progress, None


@pytest.mark.parametrize(("app", "batch", "schedule", "expected"), REFERENCE)
def test_run_in_rounds_matches_pollux(
    apps: dict[str, TraceApp],
    app: str,
    batch: int,
    schedule: list[tuple[tuple[int, ...], int | None]],
    expected: int,
) -> None:
    progress, finished = _simulate(apps[app], batch, schedule)
    assert finished == expected
    assert progress == apps[app].target_progress


def test_run_partway(apps: dict[str, TraceApp]) -> None:
    cifar = apps["cifar10"]
    # Reference Job.step after 3 rounds (30 s restart) of cifar10 on (4,2) at 2048.
    progress, finished = _simulate(cifar, 2048, [((4, 2), 3)])
    assert finished is None
    assert progress == 1676.814632948917
    assert cifar.epoch_of(progress) == 4
    # Within an epoch, progress is linear in time.
    start = cifar.epoch_progress(4)
    half, _ = cifar.run(start, (4, 2), 2048, 2)
    assert half == start + 2 * cifar.rate((4, 2), 2048, 4)
    # Completed jobs stay complete; no time means no progress.
    assert cifar.run(cifar.target_progress, (4, 2), 2048, 60) == (cifar.target_progress, 0.0)
    assert cifar.run(start, (4, 2), 2048, 0) == (start, None)


# Spec 2.7, from Pollux's simulator: (app, GPUs, batch, seconds).
STANDALONE = [
    ("bert", 6, 384, 3092),
    ("bert", 8, 384, 2459),
    ("bert", 16, 384, 1324),
    ("cifar10", 6, 2048, 910),
    ("cifar10", 16, 4096, 482),
    ("deepspeech2", 12, 640, 2477),
    ("imagenet", 24, 3200, 31805),
    ("imagenet", 32, 6400, 27431),
    ("imagenet", 48, 6400, 19689),
    ("ncf", 1, 32768, 47),
    ("yolov3", 4, 64, 14102),
]


@pytest.mark.parametrize(("app", "gpus", "batch", "expected"), STANDALONE)
def test_standalone(
    apps: dict[str, TraceApp], app: str, gpus: int, batch: int, expected: int
) -> None:
    assert apps[app].standalone_s(gpus, batch) == expected


def test_missing_folder_and_unknown_app(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="trace folder not found"):
        load_trace_app(tmp_path, "cifar10")
    with pytest.raises(InputError, match="unknown Pollux application"):
        load_trace_app(tmp_path, "gpt")


def _copy(pollux_dir: Path, tmp_path: Path, app: str) -> Path:
    shutil.copytree(pollux_dir / "traces" / app, tmp_path / app)
    return tmp_path / app


def _corrupt(path: Path, row: int, column: str, value: str) -> None:
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[row - 1].split(",")
    cells[header.index(column)] = value
    lines[row - 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def test_bad_cells_name_file_row_and_column(pollux_dir: Path, tmp_path: Path) -> None:
    folder = _copy(pollux_dir, tmp_path, "ncf")
    _corrupt(folder / "placements.csv", 5, "step_time", "abc")
    with pytest.raises(InputError, match="not a finite number") as info:
        load_trace_app(tmp_path, "ncf")
    assert (info.value.row, info.value.column) == (5, "step_time")
    assert info.value.path == str(folder / "placements.csv")

    shutil.copy(pollux_dir / "traces" / "ncf" / "placements.csv", folder / "placements.csv")
    _corrupt(folder / "validation-1024.csv", 3, "grad_var", "")
    with pytest.raises(InputError) as info:
        load_trace_app(tmp_path, "ncf")
    assert (info.value.row, info.value.column) == (3, "grad_var")

    shutil.copy(pollux_dir / "traces" / "ncf" / "validation-1024.csv", folder)
    (folder / "scalability.csv").unlink()
    with pytest.raises(InputError, match="file not found"):
        load_trace_app(tmp_path, "ncf")
