"""Metric downsampling, the first phase of a retention step (``autotune.db.retention``
says when it runs and what it keeps): full-resolution samples folded into one row per
series and bucket, their mean exact however many steps a bucket takes, and the binary
search over ``recorded_at`` that finds the oldest sample left to fold. Also the two
small helpers retention's other phases share with it: ``chunks`` of keys for
``IN (...)`` lists, and ``is_number``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import (
    JSON,
    Table,
    Text,
    TypeDecorator,
    bindparam,
    delete,
    func,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from autotune.db.tables import MetricRow

__all__ = ["DOWNSAMPLED_N", "DOWNSAMPLED_S", "chunks", "downsample", "is_number"]

DOWNSAMPLED_S = "downsampled_s"
"""Label of a downsampled metric row: the bucket, in seconds."""
DOWNSAMPLED_N = "downsampled_n"
"""Label of a downsampled metric row: how many samples its value averages."""

_IN_CHUNK = 500
"""Ids per ``IN (...)`` list: well under every backend's limit on bound parameters."""
_MAX_MARKERS_SKIPPED = 20_000
"""Downsampled rows one step reads past looking for samples to fold, at most."""
_MAX_PROBES = 64

_K = TypeVar("_K")


def chunks(items: Sequence[_K], size: int = _IN_CHUNK) -> Iterator[Sequence[_K]]:
    """``items`` a slice at a time, each one ``IN (...)`` list."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def is_number(value: object) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


_metrics = cast(Table, MetricRow.__table__)
_labels_text = sql_cast(_metrics.c.labels, Text)
"""The labels as stored: parsed here once per distinct text (there are few), not once per
row, and the same on both backends (psycopg would otherwise parse every row's JSON)."""
_SAMPLE_COLUMNS = (
    _metrics.c.id,
    _metrics.c.name,
    _metrics.c.value,
    _metrics.c.job_id,
    _labels_text,
    _metrics.c.recorded_at,
)


class _JsonText(TypeDecorator[str]):
    """JSON handed over already serialized (``CAST(... AS JSON)`` on PostgreSQL, the text
    itself on SQLite): a step's downsampled rows share a few label texts, serialized once
    each rather than once a row."""

    impl = JSON
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> None:
        return None


_FOLD = (
    update(_metrics)
    .where(_metrics.c.id == bindparam("pk"))
    .values(
        value=bindparam("v"),
        labels=bindparam("l", type_=_JsonText()),
        recorded_at=bindparam("at"),
    )
)
"""Write a bucket's downsampled row over one of its samples' rows (or over the bucket's
row of an earlier step): an update by primary key, no insert."""


@dataclass(frozen=True, slots=True)
class _Labels:
    labels: dict[str, Any]
    """Without the downsampling keys."""
    key: str
    """``labels`` as canonical JSON: the series' labels, whatever their stored order."""
    bucket_s: float | None
    """``downsampled_s`` of a downsampled row; ``None`` for a full-resolution sample."""
    count: int | None
    """``downsampled_n`` of a downsampled row."""

    @property
    def marked(self) -> bool:
        return self.bucket_s is not None


class _LabelCache:
    def __init__(self) -> None:
        self._parsed: dict[str | None, _Labels] = {}

    def parse(self, raw: str | None) -> _Labels:
        found = self._parsed.get(raw)
        if found is None:
            found = self._parsed[raw] = _parse_labels(raw)
        return found


def _parse_labels(raw: str | None) -> _Labels:
    try:
        value = json.loads(raw) if raw is not None else {}
    except ValueError:
        value = {}
    labels: dict[str, Any] = value if isinstance(value, dict) else {}
    if DOWNSAMPLED_S not in labels:
        return _Labels(labels, _labels_key(labels), None, None)
    base = {k: v for k, v in labels.items() if k not in (DOWNSAMPLED_S, DOWNSAMPLED_N)}
    bucket, n = labels[DOWNSAMPLED_S], labels.get(DOWNSAMPLED_N)
    # A row marked downsampled is never folded again, even one this module did not write
    # (then it is not merged with either: ``bucket_s`` nan, ``count`` None).
    bucket_s = float(bucket) if is_number(bucket) else math.nan
    count = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None
    return _Labels(base, _labels_key(base), bucket_s, count)


def _labels_key(labels: dict[str, Any]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"), default=str)


def _bucket_floor(at: datetime, s: float) -> datetime:
    return datetime.fromtimestamp(math.floor(at.timestamp() / s) * s, UTC)


def _bucket_ceil(at: datetime, s: float) -> datetime:
    return datetime.fromtimestamp(math.ceil(at.timestamp() / s) * s, UTC)


def _probe(
    session: Session, at: datetime, end: datetime, cache: _LabelCache
) -> tuple[datetime, bool] | None:
    """The time of the oldest row in ``[at, end)``, and whether (a row of that time) is a
    downsampled row: one index probe."""
    row = session.execute(
        select(_metrics.c.recorded_at, _labels_text)
        .where(_metrics.c.recorded_at >= at, _metrics.c.recorded_at < end)
        .order_by(_metrics.c.recorded_at)
        .limit(1)
    ).first()
    return None if row is None else (row[0], cache.parse(row[1]).marked)


def _fold_start(
    session: Session, start: datetime, end: datetime, s: float, cache: _LabelCache
) -> datetime | None:
    """A time no later than the oldest sample still to fold in ``[start, end)``, with at
    most one bucket's downsampled rows between the two; ``None`` if the window is empty.

    Binary search (samples are folded oldest first, so every downsampled row is at most
    as old as every sample left): a downsampled row at ``t`` means no sample is left
    before ``t``; a sample, or nothing, as the first row at or after ``t`` means the scan
    from ``t`` meets no downsampled row before the oldest sample left."""
    first = _probe(session, start, end, cache)
    if first is None:
        return None
    lo, marked = first
    if not marked:
        return lo
    hi = end
    tolerance = timedelta(seconds=s / 2)
    for _ in range(_MAX_PROBES):
        if hi - lo <= tolerance:
            break
        mid = lo + (hi - lo) / 2
        found = _probe(session, mid, end, cache)
        if found is not None and found[1]:
            lo = min(found[0], hi)
        else:
            hi = mid
    return lo


def downsample(
    session: Session,
    *,
    full_before: datetime,
    deleted_before: datetime | None,
    bucket_s: float,
    budget: int,
) -> tuple[int, int]:
    """Fold up to ``budget`` of the oldest full-resolution samples recorded before
    ``full_before`` into one row per series and ``bucket_s`` bucket: whole buckets only,
    and only those after ``deleted_before`` (the rows before it are deleted instead;
    ``None``: from the oldest row). Returns ``(samples folded, rows written)``."""
    s = bucket_s
    end = _bucket_floor(full_before, s)  # whole buckets only
    if deleted_before is not None:
        # Buckets wholly inside the kept window: the rows before it are deleted instead.
        start = _bucket_ceil(deleted_before, s)
    else:
        oldest = session.scalar(select(func.min(_metrics.c.recorded_at)))
        if oldest is None:
            return 0, 0
        start = _bucket_floor(oldest, s)
    if start >= end:
        return 0, 0
    cache = _LabelCache()
    at = _fold_start(session, start, end, s, cache)
    if at is None:
        return 0, 0

    # The oldest samples left to fold, in (recorded_at, id) order, reading past the few
    # downsampled rows the search leaves before them.
    samples: list[tuple[int, str, float, str | None, _Labels, datetime]] = []
    skipped = 0
    after: tuple[datetime, int] | None = None
    while len(samples) < budget and skipped < _MAX_MARKERS_SKIPPED:
        page = max(budget - len(samples), 256)
        query = select(*_SAMPLE_COLUMNS).where(
            _metrics.c.recorded_at >= at, _metrics.c.recorded_at < end
        )
        if after is not None:
            query = query.where(
                _metrics.c.recorded_at >= after[0],
                or_(_metrics.c.recorded_at > after[0], _metrics.c.id > after[1]),
            )
        rows = session.execute(
            query.order_by(_metrics.c.recorded_at, _metrics.c.id).limit(page)
        ).all()
        for row_id, name, value, job_id, raw, recorded_at in rows:
            labels = cache.parse(raw)
            if labels.marked:
                skipped += 1
            elif len(samples) < budget:
                samples.append((row_id, name, value, job_id, labels, recorded_at))
        if len(rows) < page:
            break
        after = (rows[-1][5], rows[-1][0])
    if not samples:
        return 0, 0

    # One group per bucket and series: its samples' (id, value).
    groups: dict[tuple[datetime, str, str | None, str], tuple[_Labels, list[tuple[int, float]]]]
    groups = {}
    bucket_of: dict[datetime, datetime] = {}  # a tick's samples share their time
    for row_id, name, value, job_id, labels, recorded_at in samples:
        bucket = bucket_of.get(recorded_at)
        if bucket is None:
            bucket = bucket_of[recorded_at] = _bucket_floor(recorded_at, s)
        key = (bucket, name, job_id, labels.key)
        groups.setdefault(key, (labels, []))[1].append((row_id, value))

    # Rows already downsampled into these buckets (a bucket folded over several steps).
    existing: dict[tuple[datetime, str, str | None, str], tuple[int, float, int]] = {}
    buckets = sorted({key[0] for key in groups})
    for chunk in chunks(buckets):
        rows = session.execute(
            select(*_SAMPLE_COLUMNS).where(_metrics.c.recorded_at.in_(chunk))
        ).all()
        for row_id, name, value, job_id, raw, recorded_at in rows:
            labels = cache.parse(raw)
            if labels.bucket_s == s and labels.count is not None:
                key = (recorded_at, name, job_id, labels.key)
                existing.setdefault(key, (row_id, value, labels.count))

    bucket_label: float | int = int(s) if s.is_integer() else s
    texts: dict[tuple[str, int], str] = {}
    deletes: list[int] = []
    writes: list[dict[str, Any]] = []
    for key, (labels, group) in groups.items():
        total, n = math.fsum(v for _, v in group), len(group)
        merged = existing.get(key)
        if merged is not None:
            row_id, mean, count = merged
            total, n = total + mean * count, n + count
            deletes.extend(i for i, _ in group)
        else:
            row_id = group[0][0]
            deletes.extend(i for i, _ in group[1:])
        text = texts.get((labels.key, n))
        if text is None:
            marked = {**labels.labels, DOWNSAMPLED_S: bucket_label, DOWNSAMPLED_N: n}
            text = texts[(labels.key, n)] = json.dumps(marked)
        writes.append({"pk": row_id, "v": total / n, "l": text, "at": key[0]})
    # The update first: SQLAlchemy prepares its parameters (the costly part in Python)
    # before the statement runs, so before the step's first write takes SQLite's lock.
    session.execute(_FOLD, writes)
    for ids in chunks(deletes):
        session.execute(delete(_metrics).where(_metrics.c.id.in_(ids)))
    return len(samples), len(writes)
