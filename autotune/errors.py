"""Errors a user can fix: the CLI prints them as one line and exits with code 2; the API
answers them with a 422 naming the field."""

from __future__ import annotations

__all__ = ["FieldError", "InputError"]


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


class FieldError(ValueError):
    """A value that is wrong for one named field.

    ``field`` names the field (``max_gpus``, ``layout``); the message is the whole line,
    field and value included (``JobSpec.max_gpus=2: must be >= min_gpus=4``). Callers
    read ``field`` instead of parsing the message: the API builds its 422 from it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[type[FieldError], tuple[str, str]]:
        # Exceptions pickle as ``cls(*args)``; ``field`` is not in ``args``. Ray sends
        # exceptions raised in actors back to the driver pickled.
        return type(self), (self.field, str(self))
