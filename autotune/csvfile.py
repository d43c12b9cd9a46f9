"""Reading CSV files a user hands in (traces, measurements): one place that says which
file, row and column is wrong.

Every file is CSV, ``.csv`` or ``.csv.gz``, with a header line. Rows are numbered as lines
of the file: the header is row 1, so the first data row is row 2. Errors are
``autotune.errors.InputError``. pandas is imported when a file is read, not before, so
importing this module stays cheap.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from autotune.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["floats", "integers", "job_ids", "read_csv", "seconds"]


def read_csv(path: Path, required: tuple[str, ...], *, dtype: Any = str) -> pd.DataFrame:
    """The file as a frame (every cell a string unless ``dtype`` says otherwise); a missing
    file, an unreadable one or a missing column raises."""
    import pandas as pd

    if not path.is_file():
        raise InputError("file not found", path=str(path))
    try:
        frame = pd.read_csv(path, dtype=dtype, keep_default_na=False, na_filter=False)
    except Exception as exc:  # pandas raises many types for unreadable files
        raise InputError(f"cannot read as CSV: {exc}".splitlines()[0], path=str(path)) from exc
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputError(
            f"missing column(s) {', '.join(missing)}; found {', '.join(map(str, frame.columns))}",
            path=str(path),
        )
    return frame


def integers(frame: pd.DataFrame, column: str, path: Path, minimum: int = 0) -> list[int]:
    """A column as integers (``12.0`` accepted); the first bad cell raises ``InputError``."""
    values: list[int] = []
    for i, raw in enumerate(frame[column].tolist()):
        text = str(raw).strip()
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number != int(number):
            raise InputError(f"not an integer: {text!r}", path=str(path), row=i + 2, column=column)
        if number < minimum:
            raise InputError(
                f"must be >= {minimum}, got {text}", path=str(path), row=i + 2, column=column
            )
        values.append(int(number))
    return values


def floats(
    frame: pd.DataFrame, column: str, path: Path, *, positive: bool = False
) -> npt.NDArray[np.float64]:
    """A column as finite floats (``> 0`` if ``positive``); the first bad cell raises."""
    import pandas as pd

    raw = frame[column].astype(str).str.strip()
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(
            f"not a finite number: {raw.iloc[i]!r}", path=str(path), row=i + 2, column=column
        )
    if positive and (values <= 0).any():
        i = int(np.argmax(values <= 0))
        raise InputError(
            f"must be > 0, got {raw.iloc[i]}", path=str(path), row=i + 2, column=column
        )
    return values


def job_ids(names: list[str], path: Path, column: str) -> list[str]:
    """Job ids, stripped; an empty or repeated one raises."""
    seen: dict[str, int] = {}
    ids: list[str] = []
    for i, raw in enumerate(names):
        name = str(raw).strip()
        if not name:
            raise InputError("empty job id", path=str(path), row=i + 2, column=column)
        if name in seen:
            raise InputError(
                f"job id {name!r} already on row {seen[name]}",
                path=str(path),
                row=i + 2,
                column=column,
            )
        seen[name] = i + 2
        ids.append(name)
    return ids


def seconds(frame: pd.DataFrame, column: str, path: Path) -> list[float]:
    """Timestamps in seconds: numbers, or ISO 8601 dates and times, as the first row is."""
    cells = [str(raw).strip() for raw in frame[column].tolist()]
    if not cells:
        return []
    try:
        float(cells[0])
    except ValueError:
        pass
    else:
        return [float(x) for x in floats(frame, column, path)]
    out: list[float] = []
    for i, text in enumerate(cells):
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise InputError(
                f"not an ISO 8601 date and time like row 2's: {text!r}",
                path=str(path),
                row=i + 2,
                column=column,
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        out.append(moment.timestamp())
    return out
