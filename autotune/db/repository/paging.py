"""What every listing shares: ``Page`` (one page, newest first, with its count and the
cursor of the next) and the count bounded by ``COUNT_CAP``, so no request's cost grows
with the history."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

__all__ = ["COUNT_CAP", "Page", "bounded_count"]


T = TypeVar("T")

COUNT_CAP = 10_000
"""Listings count the rows that match up to this many: beyond it the count is a lower
bound (``Page.count_exact`` is false), so no request's cost grows with the history."""


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing, newest first.

    ``next_cursor`` continues right after the page's last row (keyset pagination: the
    cost of a page does not depend on how deep it is, and rows written meanwhile never
    shift it); ``None`` on the last page. ``count`` is how many rows match, exact when
    ``count_exact``, else at least ``COUNT_CAP``."""

    rows: list[T]
    count: int
    count_exact: bool
    next_cursor: str | None


def bounded_count(
    session: Session, key: Any, conditions: Sequence[ColumnElement[bool]]
) -> tuple[int, bool]:
    """How many rows match ``conditions``, reading at most ``COUNT_CAP + 1`` entries of
    an index that holds ``key``: ``(count, exact)``."""
    sub = select(key).where(*conditions).limit(COUNT_CAP + 1).subquery()
    n = int(session.scalar(select(func.count()).select_from(sub)) or 0)
    return (COUNT_CAP, False) if n > COUNT_CAP else (n, True)
