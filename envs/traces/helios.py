"""Helios per-minute cluster load (``helios_load``; Hu et al., SC'21): a ``time`` column
(date and time, increasing; gaps are kept as they are) and numeric load columns such as
``gpu_utilization`` (a fraction in [0, 1]), ``total_gpu_num``, ``running_gpu_num`` and
``pending_gpu_num``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from autotune.csvfile import floats, read_csv
from autotune.errors import InputError

__all__ = ["DemandSeries", "LoadSeries", "helios_demand", "helios_load"]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LoadSeries:
    """One column of a cluster-load time series. The arrays are read-only."""

    name: str
    """The file's name without ``.csv`` and ``.gz``."""
    column: str
    minutes: npt.NDArray[np.float64]
    """Minutes since the first row."""
    values: npt.NDArray[np.float64]


def _times(frame: pd.DataFrame, path: Path) -> tuple[pd.Series, pd.Series, npt.NDArray[np.float64]]:
    """The ``time`` column as text, as UTC moments and as seconds since the first row;
    an empty file, a cell that is no date and time, or a row not after the one before
    raises."""
    if frame.empty:
        raise InputError("no data rows", path=str(path))
    text = frame["time"].astype(str).str.strip()
    moments = pd.to_datetime(text, errors="coerce", format="ISO8601", utc=True)
    bad = moments.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(
            f"not a date and time: {text.iloc[i]!r}", path=str(path), row=i + 2, column="time"
        )
    elapsed = (moments - moments.iloc[0]).dt.total_seconds()
    seconds: npt.NDArray[np.float64] = np.asarray(elapsed, dtype=np.float64)
    backwards = np.diff(seconds) <= 0
    if backwards.any():
        i = int(np.argmax(backwards)) + 1
        raise InputError(
            f"time {text.iloc[i]} is not after the previous row's {text.iloc[i - 1]}",
            path=str(path),
            row=i + 2,
            column="time",
        )
    return text, moments, seconds


def helios_load(path: str | Path, column: str = "gpu_utilization") -> LoadSeries:
    """One column of a Helios per-minute load file, against minutes since its first row."""
    path = Path(path)
    frame = read_csv(path, ("time",))
    if column not in frame.columns:
        raise InputError(
            f"no such column; available: {', '.join(map(str, frame.columns))}",
            path=str(path),
            column=column,
        )
    _, _, seconds = _times(frame, path)
    values = floats(frame, column, path)
    if column == "gpu_utilization":
        outside = (values < 0) | (values > 1)
        if outside.any():
            i = int(np.argmax(outside))
            raise InputError(
                f"a utilization is a fraction in [0, 1], got {str(frame[column].iat[i]).strip()}",
                path=str(path),
                row=i + 2,
                column=column,
            )
    minutes = seconds / 60.0
    minutes.flags.writeable = False
    values.flags.writeable = False
    name = path.name.removesuffix(".gz").removesuffix(".csv")
    return LoadSeries(name=name, column=column, minutes=minutes, values=values)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class DemandSeries:
    """GPU demand of one cluster per real minute: D(t) = running + pending GPUs.

    Rows are put on a one-minute grid whatever the file's resolution (the newest row of
    each minute; a minute without a row holds the value before it). The arrays are
    read-only."""

    name: str
    time: npt.NDArray[np.str_]
    """Each minute's ``time`` as in the file (the newest row's, or the minute held)."""
    start: pd.Timestamp
    """The first minute (UTC)."""
    demand: npt.NDArray[np.float64]
    """GPUs running plus GPUs pending, per minute."""
    capacity: float
    """The cluster's GPUs (the largest ``total_gpu_num`` seen)."""

    @property
    def minutes(self) -> int:
        return int(self.demand.size)


def helios_demand(path: str | Path) -> DemandSeries:
    """A Helios-style load file (``time``, ``running_gpu_num``, ``pending_gpu_num``,
    ``total_gpu_num``) as GPU demand per real minute."""
    path = Path(path)
    frame = read_csv(path, ("time", "running_gpu_num", "pending_gpu_num", "total_gpu_num"))
    text, moments, _ = _times(frame, path)
    running = floats(frame, "running_gpu_num", path)
    pending = floats(frame, "pending_gpu_num", path)
    total = floats(frame, "total_gpu_num", path)
    if (running < 0).any() or (pending < 0).any():
        raise InputError("GPU counts cannot be negative", path=str(path))
    capacity = float(total.max())
    if capacity <= 0:
        raise InputError("total_gpu_num: the cluster has no GPUs", path=str(path))
    minute = moments.dt.floor("min")
    grid = pd.DataFrame({"d": running + pending, "t": text.to_numpy()}, index=minute)
    grid = grid[~grid.index.duplicated(keep="last")]
    full = pd.date_range(grid.index[0], grid.index[-1], freq="min")
    grid = grid.reindex(full).ffill()
    demand = grid["d"].to_numpy(dtype=np.float64)
    times = grid["t"].to_numpy(dtype=str)
    demand.flags.writeable = False
    times.flags.writeable = False
    name = path.name.removesuffix(".gz").removesuffix(".csv")
    return DemandSeries(name=name, time=times, start=full[0], demand=demand, capacity=capacity)
