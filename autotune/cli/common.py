"""What every command of the ``autotune`` command line shares: bad input ends a command
with one line and exit code 2, progress bars go to stderr (only on a terminal), and the
options several commands take are declared once."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from autotune.core import CompressionSpec
from autotune.errors import InputError

__all__ = [
    "ConfigOption",
    "DataDirOption",
    "DbOption",
    "JsonOption",
    "err",
    "fail",
    "parse_compression",
    "progress_bar",
    "user_errors",
]

err = Console(stderr=True)
"""Progress and notes for people; results go to stdout."""

P = ParamSpec("P")
R = TypeVar("R")


def fail(message: str, code: int = 2) -> NoReturn:
    """End the command: ``error: message`` on stderr and exit ``code`` (2: bad input)."""
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code=code)


def user_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Bad input (``InputError``) ends the command with one line on stderr and exit code 2."""

    @wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except InputError as exc:
            fail(str(exc))

    return wrapper


def progress_bar(
    label: str, detail: str = "{task.completed}/{task.total}", *, enabled: bool = True
) -> Progress:
    """A progress bar on stderr, drawn only when stderr is a terminal and ``enabled`` (off
    under ``--json``). ``label`` and ``detail`` are rich ``TextColumn`` formats: they may
    name the task's ``description``, ``completed``, ``total`` and fields."""
    return Progress(
        TextColumn(label),
        BarColumn(),
        TextColumn(detail),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not (enabled and err.is_terminal),
    )


def parse_compression(text: str) -> CompressionSpec:
    """A ``--compression`` value: ``none``, ``topk:RATIO``, ``int8``, ``fp8`` or
    ``powersgd:RANK`` (``CompressionSpec.parse``); ``InputError`` saying why not."""
    try:
        return CompressionSpec.parse(text)
    except ValueError as exc:
        raise InputError(f"--compression {exc}") from None


ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="TOML settings file (default: $AUTOTUNE_CONFIG, if set)."),
]
DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="SQLAlchemy database URL (default: $AUTOTUNE_DB_URL, else SQLite in the data dir).",
    ),
]
DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="Directory for the default SQLite database.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
