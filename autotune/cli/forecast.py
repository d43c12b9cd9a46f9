"""``autotune forecast train|eval``: the LSTM load forecaster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from autotune.cli.common import JsonOption, err, fail, progress_bar
from autotune.errors import InputError

__all__ = ["forecast_app"]

forecast_app = typer.Typer(
    help="Train and evaluate the LSTM cluster-load forecaster.", no_args_is_help=True
)


@forecast_app.command("train")
def forecast_train(
    series: Annotated[
        list[Path],
        typer.Option(
            "--series",
            help="Training CSVs (time column + value columns); repeat the option.",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option(help="Checkpoint folder to write.", show_default=False)],
    column: Annotated[
        list[str] | None,
        typer.Option(
            help="Value column(s) to train on; repeat. Default: gpu_utilization, pending_gpu_num."
        ),
    ] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the data.")] = 6,
    stride: Annotated[int, typer.Option(min=1, help="Minutes between training samples.")] = 3,
    window: Annotated[int, typer.Option(min=2, help="Minutes of history the model reads.")] = 60,
    hidden: Annotated[int, typer.Option(min=1, help="LSTM width.")] = 48,
    seed: Annotated[int, typer.Option(help="Seed of initialisation and shuffling.")] = 0,
    as_json: JsonOption = False,
) -> None:
    """Train the LSTM load forecaster.

    Writes a checkpoint folder (config.json, model.pt). Never evaluate it on the series it
    was trained on.
    """
    from autotune.policies.forecast import ForecasterConfig, read_series, save_checkpoint, train

    try:
        columns = tuple(column or ("gpu_utilization", "pending_gpu_num"))
        data = [read_series(p, c) for p in series for c in columns]
        config = ForecasterConfig(
            window=window,
            hidden=hidden,
            columns=columns,
            trained_on=tuple(sorted({s.name for s in data})),
        )
    except InputError as exc:
        fail(str(exc))
    losses: list[float] = []
    progress = progress_bar(
        "training",
        "epoch {task.completed}/{task.total}  L1 {task.fields[loss]}",
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
        "train_l1": losses,
        "trained_on": config.trained_on,
    }
    if as_json:
        typer.echo(json.dumps(report))
    else:
        err.print(f"wrote {out} (final training L1 {losses[-1]:.4f})")


@forecast_app.command("eval")
def forecast_eval(
    series: Annotated[
        Path, typer.Option("--series", help="CSV with a time column.", show_default=False)
    ],
    column: Annotated[str, typer.Option(help="Value column to forecast.")] = "gpu_utilization",
    horizon: Annotated[int, typer.Option(min=1, help="Minutes ahead.")] = 15,
    model: Annotated[
        Path | None, typer.Option(help="Checkpoint folder (default: the one shipped).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Compare the forecaster with persistence and seasonal naive.

    MAE and RMSE at one horizon, on every minute of the series with a day of history.
    """
    from autotune.policies.forecast import (
        default_checkpoint,
        evaluate_series,
        load_checkpoint,
        read_series,
    )

    try:
        forecaster = load_checkpoint(model or default_checkpoint())
        data = read_series(series, column)
        report = evaluate_series(forecaster, data, horizon)
    except InputError as exc:
        fail(str(exc))
    if data.name in forecaster.config.trained_on:
        report["warning"] = f"the model was trained on {data.name}"
    if as_json:
        typer.echo(json.dumps(report))
        return
    out = Console()
    out.print(f"{data.name} {column}, {horizon} min ahead, {report['points']} points")
    for name in ("lstm", "persistence", "seasonal_naive"):
        out.print(f"  {name:15s} MAE {report['mae'][name]:.5f}  RMSE {report['rmse'][name]:.5f}")
    out.print(f"  LSTM / persistence MAE: {report['mae_ratio_lstm_persistence']:.3f}")
    if "warning" in report:
        out.print(f"[yellow]warning: {report['warning']}[/]")
