"""Errors a user can fix: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """Bad input from the user: a missing file, a missing column, a malformed value.

    The message is one line and names the file, the row (1-based, counting the header
    as row 1, as an editor shows it) and the column where that applies.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        row: int | None = None,
        column: str | None = None,
    ) -> None:
        where = ", ".join(
            part
            for part in (
                path,
                f"row {row}" if row is not None else None,
                f"column {column!r}" if column is not None else None,
            )
            if part
        )
        super().__init__(f"{where}: {message}" if where else message)
        self.path = path
        self.row = row
        self.column = column
