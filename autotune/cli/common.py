"""What every command of the ``autotune`` command line shares: bad input ends a command
with one line and exit code 2, progress bars go to stderr (only on a terminal), and the
options several commands take are declared once."""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache, wraps
from pathlib import Path
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

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
    "TenantsOption",
    "err",
    "fail",
    "field_docs",
    "parse_compression",
    "print_tenant_table",
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


@contextmanager
def runs_progress(total: int, *, enabled: bool) -> Iterator[Callable[[str, int], None]]:
    """A progress bar over ``total`` evaluation runs (``progress_bar``); yields the
    callback an evaluation calls after each run of a policy under a seed."""
    progress = progress_bar(
        "{task.description}", "{task.completed}/{task.total} runs", enabled=enabled
    )
    with progress:
        task = progress.add_task("evaluating", total=total)
        yield lambda name, seed: progress.update(task, advance=1, description=f"{name} seed {seed}")


def print_policy_table(
    out: Console,
    rows: Mapping[str, Mapping[str, float]],
    columns: Sequence[tuple[str, str, str]],
    *,
    min_width: int,
) -> None:
    """One line per policy of an evaluation report: ``columns`` are (header, metric,
    format), the format's leading digits its width (``"10.0f"``, ``"8.1%"``)."""
    width = max(min_width, *(len(name) for name in rows))
    heads = [f"{head:>{int(spec.split('.')[0])}s}" for head, _, spec in columns]
    out.print(" ".join([f"{'policy':{width}s}", *heads]))
    for name, row in rows.items():
        cells = [format(row[key], spec) for _, key, spec in columns]
        out.print(" ".join([f"{name:{width}s}", *cells]))


TenantsOption = Annotated[
    str | None,
    typer.Option(
        help="Tenants sharing the cluster, each with a quota in percent of its GPUs, e.g. "
        "vision=50,nlp=30,speech=20 (rounded to whole GPUs, at most 100% in all); each job "
        "goes to a tenant by a draw seeded by --trace-seed, the shares as probabilities. The "
        "decision step enforces the quotas; each tenant's fairness is reported.",
        show_default=False,
    ),
]


def print_tenant_table(out: Console, rows: Mapping[str, Mapping[str, Any]]) -> None:
    """Each policy's tenants, a line each (``autotune.envs.tenants``'s figures): jobs,
    average JCT, share of the cluster's GPU time against the quota's, quota attainment
    and the time spent waiting for the quota."""
    width = max(12, *(len(name) for name in rows))
    names = [tenant for row in rows.values() for tenant in row.get("tenants", {})]
    tenant_width = max(6, *(len(tenant) for tenant in names)) if names else 6
    out.print(
        f"{'policy':{width}s} {'tenant':{tenant_width}s} {'jobs':>5s} {'avg JCT s':>10s} "
        f"{'GPU share':>9s} {'quota':>7s} {'attained':>9s} {'waited s':>9s}"
    )
    for name, row in rows.items():
        for tenant, fig in row.get("tenants", {}).items():
            out.print(
                f"{name:{width}s} {tenant:{tenant_width}s} {fig['jobs']:5.0f} "
                f"{fig['avg_jct_s']:10.0f} {fig['gpu_share']:9.1%} {fig['quota_share']:7.1%} "
                f"{fig['quota_attainment']:9.1%} {fig['quota_wait_s']:9.0f}"
            )


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring of a settings dataclass (the string under the field), in
    one line: the command line's help text for the option of that setting, so that the
    setting is documented once. Empty where the source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for field, after in itertools.pairwise(body):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[field.target.id] = " ".join(after.value.value.split())
    return docs


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
