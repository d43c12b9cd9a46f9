"""``autotune forecast train|eval``: the LSTM demand forecaster."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from autotune.cli.common import JsonOption, err, fail, progress_bar
from autotune.errors import InputError

__all__ = ["forecast_app"]

forecast_app = typer.Typer(
    help="Train and evaluate the LSTM demand forecaster (arrival probability and peak "
    "demand quantiles, 15 and 60 minutes ahead).",
    no_args_is_help=True,
)

SeriesOption = Annotated[
    list[Path],
    typer.Option(
        "--series",
        help="Helios-style CSV (time, running_gpu_num, pending_gpu_num, total_gpu_num; "
        ".csv or .csv.gz); repeat the option.",
        show_default=False,
    ),
]


@forecast_app.command("train")
def forecast_train(
    series: SeriesOption,
    out: Annotated[Path, typer.Option(help="Checkpoint folder to write.", show_default=False)],
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the data.")] = 8,
    stride: Annotated[int, typer.Option(min=1, help="Minutes between training samples.")] = 1,
    window: Annotated[
        int, typer.Option(min=1, help="Five-minute steps of history the LSTM reads.")
    ] = 48,
    hidden: Annotated[int, typer.Option(min=1, help="LSTM width.")] = 48,
    validation_days: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Last days of each series held out to calibrate the quantiles and fit the "
            "baselines' buffers.",
        ),
    ] = 10.0,
    seed: Annotated[int, typer.Option(help="Seed of initialisation and shuffling.")] = 0,
    as_json: JsonOption = False,
) -> None:
    """Train the demand forecaster.

    Writes a checkpoint folder (config.json with the calibration and the baselines,
    model.pt). Never evaluate it on the series it was trained on.
    """
    from autotune.policies.forecast import ForecasterConfig, read_demand, save_checkpoint, train

    started = time.perf_counter()
    try:
        data = [read_demand(p) for p in series]
        config = ForecasterConfig(
            window=window,
            hidden=hidden,
            validation_days=validation_days,
            trained_on=tuple(sorted({s.name for s in data})),
        )
    except InputError as exc:
        fail(str(exc))
    losses: list[float] = []
    progress = progress_bar(
        "training",
        "epoch {task.completed}/{task.total}  loss {task.fields[loss]}",
        enabled=not as_json,
    )
    with progress:
        task = progress.add_task("train", total=epochs, loss="-")

        def update(epoch: int, _total: int, loss: float) -> None:
            losses.append(loss)
            progress.update(task, completed=epoch, loss=f"{loss:.4f}")

        try:
            forecaster = train(
                data, config, epochs=epochs, stride=stride, seed=seed, progress=update
            )
        except InputError as exc:
            fail(str(exc))
    save_checkpoint(forecaster, out)
    report = {
        "out": str(out),
        "epochs": epochs,
        "train_loss": losses,
        "trained_on": list(forecaster.config.trained_on),
        "offsets": forecaster.config.offsets,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if as_json:
        typer.echo(json.dumps(report))
    else:
        err.print(f"wrote {out} (final training loss {losses[-1]:.4f})")


@forecast_app.command("eval")
def forecast_eval(
    series: SeriesOption,
    model: Annotated[
        Path | None, typer.Option(help="Checkpoint folder (default: the one shipped).")
    ] = None,
    from_day: Annotated[
        float, typer.Option(min=1.0, help="Score forecasts made from this day on (1 = day 2).")
    ] = 1.0,
    predictions_out: Annotated[
        Path | None,
        typer.Option(
            help="Write every forecast to this CSV: series, time, horizon_min, p_arrival, "
            "q50, q90, q95 (GPUs), one row per minute from the second day on.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Score the forecaster against calibrated persistence, climatology and persistence +
    buffer.

    Arrival probability: Brier score, log loss, AUC. Peak demand: pinball loss in GPUs
    and coverage at 50%, 90% and 95%. Per series and over all series' points together.
    """
    from autotune.policies.forecast import (
        default_checkpoint,
        load_checkpoint,
        pooled,
        predictions_frame,
        read_demand,
        score_forecasts,
    )

    bar = progress_bar("scoring", "{task.completed}/{task.total} series", enabled=not as_json)
    try:
        forecaster = load_checkpoint(model or default_checkpoint())
        data = [read_demand(p) for p in series]
        reports = []
        with bar:
            task = bar.add_task("score", total=len(data))
            for s in data:
                reports.append(score_forecasts(forecaster, s, from_day=from_day))
                bar.advance(task)
    except InputError as exc:
        fail(str(exc))
    seen = [s.name for s in data if s.name in forecaster.config.trained_on]
    report = {
        "trained_on": list(forecaster.config.trained_on),
        "series": reports,
        "pooled": pooled(reports, forecaster.config.horizons),
    }
    if seen:
        report["warning"] = f"the model was trained on {', '.join(seen)}"
    if predictions_out is not None:
        import pandas as pd

        frame = pd.concat([predictions_frame(forecaster, s) for s in data], ignore_index=True)
        predictions_out.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(predictions_out, index=False)
        report["predictions_out"] = str(predictions_out)
        report["predictions"] = len(frame)
    if as_json:
        typer.echo(json.dumps(report))
        return
    out = Console()
    table = Table(title="Forecasts (LSTM vs baselines)")
    for col in (
        "series",
        "h (min)",
        "arrival rate",
        "Brier LSTM",
        "Brier cal. persistence",
        "ratio",
        "AUC LSTM",
        "pinball95 LSTM",
        "pinball95 persist.+buffer",
        "ratio",
        "coverage95 LSTM",
    ):
        table.add_column(col, justify="right" if col != "series" else "left")
    rows = [(r["series"], r["horizons"]) for r in reports] + [("all", report["pooled"])]
    for name, horizons in rows:
        for h, e in horizons.items():
            lstm, pers = e["lstm"], e["persistence"]
            table.add_row(
                name,
                h,
                f"{e['arrival_rate']:.3f}" if "arrival_rate" in e else "",
                f"{lstm['brier']:.4f}",
                f"{pers['brier']:.4f}",
                f"{e['brier_ratio']:.3f}",
                f"{lstm['auc']:.3f}" if "auc" in lstm else "",
                f"{lstm['pinball']['0.95']:.3f}",
                f"{pers['pinball']['0.95']:.3f}",
                f"{e['pinball95_ratio']:.3f}",
                f"{lstm['coverage']['0.95']:.1%}",
            )
    out.print(table)
    if "predictions_out" in report:
        out.print(f"wrote {report['predictions']} forecasts to {report['predictions_out']}")
    if "warning" in report:
        out.print(f"[yellow]warning: {report['warning']}[/]")
