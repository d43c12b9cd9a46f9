"""``autotune model validate|calibrate``: the performance model against the Pollux
measurements."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from autotune.cli.common import JsonOption, err, user_errors

__all__ = ["model_app"]

model_app = typer.Typer(help="Check and calibrate the performance model.", no_args_is_help=True)


@model_app.command("validate")
@user_errors
def model_validate(
    pollux: Annotated[
        Path,
        typer.Option(help="Pollux traces folder (<app>/placements.csv ...).", show_default=False),
    ],
    split: Annotated[
        str,
        typer.Option(
            help="scale: fit on placements.csv (1-4 nodes), test on scalability.csv (6-16 "
            "nodes). nodes: fit on placements spanning at most --max-fit-nodes nodes, test "
            "on the larger ones (with 2, a test of the testbed's slow 2-node placements "
            "more than of the model)."
        ),
    ] = "scale",
    max_fit_nodes: Annotated[
        int,
        typer.Option(min=1, help="With --split nodes: fit on placements up to this many nodes."),
    ] = 2,
    plot: Annotated[
        Path | None, typer.Option(help="Write the residual plot (PNG) here; needs matplotlib.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Fit the performance model per Pollux application on one part of its measurements
    and report its step-time error on the rest (mean absolute percentage error), beside a
    naive linear model's (compute linear in the local batch, synchronisation linear in
    the replicas)."""
    from autotune.perf.pollux import plot_residuals, validate

    report = validate(
        pollux,
        split=split,
        max_fit_nodes=max_fit_nodes,
        progress=None if as_json else lambda app: err.print(f"fitting {app}"),
    )
    if plot is not None:
        plot_residuals(report, plot)
    report.pop("residuals")
    if as_json:
        typer.echo(json.dumps(report))
        return
    out = Console()
    for app_name, row in report["apps"].items():
        out.print(
            f"{app_name:12s} fit {row['n_fit']:4d}  test {row['n_test']:5d}  "
            f"step MAPE {row['mape_step_time']:6.1%}  (baseline "
            f"{row['baseline_mape_step_time']:6.1%})  unhidden sync MAPE "
            f"{row['mape_sync_time']:6.1%}"
        )
    out.print(
        f"[bold]mean step-time MAPE {report['mape_step_time_mean']:.1%}[/] (baseline "
        f"{report['baseline_mape_step_time_mean']:.1%}); below the baseline: "
        f"{', '.join(report['beats_baseline']) or 'none'}"
    )


@model_app.command("calibrate")
@user_errors
def model_calibrate(
    pollux: Annotated[
        Path,
        typer.Option(help="Pollux traces folder (<app>/placements.csv ...).", show_default=False),
    ],
    out: Annotated[Path, typer.Option(help="Where to write the calibration JSON.")],
) -> None:
    """Fit every Pollux application on all its placements and write the document the
    package ships as autotune/data/pollux_apps.json."""
    from autotune.perf.pollux import calibrate

    out.write_text(json.dumps(calibrate(pollux), indent=1) + "\n")
    err.print(f"wrote {out}")
