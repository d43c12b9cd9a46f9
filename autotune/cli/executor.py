"""Commands that train for real through the executor: ``autotune job run`` (one job with
a given configuration, no policy) and ``autotune calibrate`` (fit the performance model
to this machine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from autotune.cli.common import JsonOption, fail, parse_compression, progress_bar
from autotune.core import (
    JobConfig,
    Layout,
    Precision,
    PrecisionMap,
)
from autotune.errors import InputError
from autotune.interfaces import JobMetrics

__all__ = ["calibrate_command", "parse_precision", "parse_shares", "run_command"]


def parse_precision(text: str) -> PrecisionMap:
    """A precision for every matmul class (``fp32``, ``bf16``, ``fp16``, ``fp8``) or a JSON
    file mapping module classes to precisions."""
    if text in ("fp32", "bf16", "fp16", "fp8"):
        return PrecisionMap.uniform(cast(Precision, text))
    path = Path(text)
    if not path.is_file():
        raise InputError(f"--precision {text!r}: not fp32|bf16|fp16|fp8 and no such file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc}", path=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("expected a JSON object of module class -> precision", path=str(path))
    try:
        return PrecisionMap(**data)
    except (TypeError, ValueError) as exc:
        raise InputError(str(exc), path=str(path)) from None


def parse_shares(
    text: str, count: int, *, option: str = "--batch-shares", per: str = "rank", flag: str = "--dp"
) -> tuple[float, ...]:
    """``--batch-shares`` (one positive weight per data-parallel rank) or
    ``--stage-weights`` (one per pipeline stage), comma-separated."""
    try:
        shares = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"{option} {text!r}: expected numbers such as 2,1") from None
    if len(shares) != count:
        raise InputError(f"{option} {text!r}: give one weight per {per} ({flag} {count})")
    if any(not 0 < w < float("inf") for w in shares):
        raise InputError(f"{option} {text!r}: weights must be positive")
    return shares


def run_command(
    task: Annotated[
        str,
        typer.Option(
            "--task",
            help="gpt-char, mlp-synthetic (or another built-in task), hf:ARCH[-SIZE] (a "
            "Hugging Face model: hf:gpt2, hf:llama-tiny, ...), path/to/file.py:ClassName or "
            "package.module:ClassName, or either after lightning: (a LightningModule).",
        ),
    ],
    dp: Annotated[int, typer.Option("--dp", help="Data-parallel degree.", min=1)] = 1,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.", min=1)] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel degree.", min=1)] = 1,
    compression: Annotated[
        str,
        typer.Option(
            "--compression", help="none | topk:RATIO | int8 | fp8 | powersgd:RANK (data-parallel)."
        ),
    ] = "none",
    adaptive_topk: Annotated[
        bool,
        typer.Option(
            "--adaptive-topk",
            help="With --compression topk:RATIO: start from RATIO and move the kept share "
            "(0.1%-20%) to the fastest step whose compressed gradient stays faithful to the "
            "dense one, as measured while training.",
        ),
    ] = False,
    precision: Annotated[
        str,
        typer.Option(
            "--precision",
            help="fp32 | bf16 | fp16 | fp8 for every matmul class, or a JSON file of "
            "module class -> precision.",
        ),
    ] = "fp32",
    batch_shares: Annotated[
        str | None,
        typer.Option(
            "--batch-shares",
            help="Split the global batch across the data-parallel ranks in these "
            "proportions, one weight per rank (2,1: rank 0 takes two thirds, for a device "
            "twice as fast); gradients are averaged by samples. Data parallelism only.",
        ),
    ] = None,
    balance_batch: Annotated[
        bool,
        typer.Option(
            "--balance-batch",
            help="Move the batch shares to the ranks' measured speeds while training, so "
            "that a fast rank does not wait for a slow one (data parallelism only).",
        ),
    ] = False,
    stage_weights: Annotated[
        str | None,
        typer.Option(
            "--stage-weights",
            help="Cut the pipeline stages so that each holds the model's blocks in these "
            "proportions, one weight per stage (2,1: stage 0 holds two thirds, for a device "
            "twice as fast). Needs --pp.",
        ),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", help="Training steps.", min=1)] = 100,
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="Global batch (default: the task's).", min=1)
    ] = None,
    micro_batches: Annotated[
        int,
        typer.Option(
            "--micro-batches",
            help="Pipeline micro-batches, or gradient-accumulation steps without pp.",
            min=1,
        ),
    ] = 1,
    activation_checkpointing: Annotated[
        bool, typer.Option("--activation-checkpointing", help="Recompute block activations.")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights and data.")] = 0,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="Join this Ray cluster (default: start a local one)."),
    ] = None,
    checkpoint_dir: Annotated[
        Path | None,
        typer.Option("--checkpoint-dir", help="Keep checkpoints here (default: a temporary dir)."),
    ] = None,
    checkpoint_every: Annotated[
        int, typer.Option("--checkpoint-every", help="Steps between checkpoints.", min=1)
    ] = 50,
    device: Annotated[
        str, typer.Option("--device", help="auto | cpu | cuda (auto: cuda when present).")
    ] = "auto",
    as_json: JsonOption = False,
) -> None:
    """Train one job with the given layout, compression and precision, and report loss,
    bytes sent against a dense all-reduce, step time and where each rank ran."""
    import torch

    from autotune.executor.runner import ExecutorError, JobRunner, RunnerConfig
    from autotune.ray_session import ensure_ray

    try:
        config = JobConfig(
            layout=Layout(
                world_size=dp * tp * pp,
                dp=dp,
                tp=tp,
                pp=pp,
                micro_batches=micro_batches,
                activation_checkpointing=activation_checkpointing,
            ),
            precision=parse_precision(precision),
            compression=parse_compression(compression),
        )
    except InputError:
        raise
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if adaptive_topk and config.compression.kind != "topk":
        raise InputError(
            f"--adaptive-topk moves top-k's ratio: use --compression topk:RATIO, not {compression}"
        )
    shares = parse_shares(batch_shares, dp) if batch_shares is not None else None
    stages = None
    if stage_weights is not None:
        if pp < 2:
            raise InputError("--stage-weights cuts pipeline stages: give --pp 2 or more")
        stages = parse_shares(stage_weights, pp, option="--stage-weights", per="stage", flag="--pp")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise InputError(f"--device {device!r}: use auto, cpu or cuda")
    progress = progress_bar("training", "{task.completed}/{task.total} steps {task.fields[note]}")
    bar = progress.add_task("train", total=steps, note="")

    def on_step(_runner: Any, step: int, metrics: JobMetrics) -> None:
        loss = metrics.loss
        progress.update(bar, completed=step, note=f"loss {loss:.4f}" if loss is not None else "")

    run = RunnerConfig(
        task=task,
        steps=steps,
        batch_size=batch_size,
        seed=seed,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        device=device,
        adaptive_topk=adaptive_topk,
        batch_shares=shares,
        stage_weights=stages,
        balance_batch=balance_batch,
    )
    runner = JobRunner(run, config, on_step=on_step)
    started = ensure_ray(ray_address, num_cpus=config.world_size)
    try:
        with progress:
            result = runner.run()
    except ExecutorError as exc:
        fail(str(exc), code=1)
    finally:
        if started:
            import ray

            ray.shutdown()
    summary = result.summary()
    if as_json:
        typer.echo(json.dumps(summary))
        return
    ratio = summary["bytes_sent"] / summary["bytes_dense"] if summary["bytes_dense"] else None
    first, last = summary["loss_first"], summary["loss_last"]
    typer.echo(
        f"{summary['steps']} steps: loss {first:.4f} -> {last:.4f}; "
        f"median step {summary['step_time_s_median'] * 1000:.1f} ms, "
        f"{summary['samples_per_s']:.1f} samples/s"
        + (f", {summary['tokens_per_s']:.0f} tokens/s" if summary["tokens_per_s"] else "")
    )
    if ratio is not None:
        typer.echo(
            f"bytes sent {summary['bytes_sent']:,} of {summary['bytes_dense']:,} dense "
            f"({ratio:.3%})"
        )
    nodes = sorted({p["node"] for p in summary["placement"]})
    typer.echo(f"ranks on {len(nodes)} node(s): " + ", ".join(nodes))
    for event in summary["events"]:
        typer.echo(f"event: {json.dumps(event)}")


def calibrate_command(
    steps: Annotated[
        int, typer.Option("--steps", help="Measured steps per configuration.", min=2)
    ] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights and data.")] = 0,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Where to save the profile (default: <data dir>/calibration.json)."
        ),
    ] = None,
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Join this Ray cluster.")
    ] = None,
    cluster_file: Annotated[
        Path | None,
        typer.Option(
            "--cluster-file",
            help="Calibrate this described cluster (autotune cluster describe; with "
            "--ray-address): jobs spread over its machines, the fit saved into the file.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Fit the performance model to this machine, or to a described cluster, from gpt-char
    runs.

    Here: trains gpt-char under 12 configurations (layouts x compression x precision),
    fits the performance model's device and coefficients to the measured step times (the
    fitter ``autotune model calibrate`` uses for the Pollux measurements), saves the
    profile, and reports the step-time error (target MAPE <= 15%).

    With --cluster-file: trains gpt-char data parallel over the cluster's machines under 5
    configurations (dense fp32 and bf16, top-k 1%, int8, PowerSGD rank 4), fits the
    device and the links' latency and achieved bandwidth to the step times and the
    synchronisation no rank hid, and writes the calibration into the cluster file: the
    simulated cluster of ``autotune train-policy --cluster-file`` and the daemon then use
    it."""
    from autotune.catalog.clusters import load_cluster, save_cluster
    from autotune.daemon.settings import Settings
    from autotune.executor.calibrate import GRID, calibrate, link_grid, save_profile
    from autotune.ray_session import ensure_ray

    cluster = None
    grid = GRID
    if cluster_file is not None:
        if ray_address is None:
            fail("--cluster-file calibrates a running Ray cluster: give its --ray-address")
        if out is not None:
            fail("--cluster-file saves the calibration into the cluster file; drop --out")
        try:
            cluster = load_cluster(cluster_file)
            grid = link_grid(sum(1 for n in cluster.nodes if n.cpu_milli > 0))
        except InputError as exc:
            fail(str(exc))
    target = cluster_file or out or Settings().data_dir / "calibration.json"
    progress = progress_bar(
        "calibrating", "{task.completed}/{task.total} configurations {task.fields[note]}"
    )
    bar = progress.add_task("calibrate", total=len(grid), note="")
    started = ensure_ray(ray_address, num_cpus=2)
    try:
        with progress:
            report = calibrate(
                steps=steps,
                seed=seed,
                grid=grid,
                cluster=cluster,
                progress=lambda done, _total, what: progress.update(bar, completed=done, note=what),
            )
    except InputError as exc:
        fail(str(exc))
    finally:
        if started:
            import ray

            ray.shutdown()
    report["saved_to"] = str(target)
    if cluster is not None:
        save_cluster(cluster.with_calibration(report), target)
    else:
        save_profile(report, target)
    if as_json:
        typer.echo(json.dumps(report))
        return
    for row in report["configs"]:
        typer.echo(
            f"{row['config']:<36} measured {row['measured_step_s'] * 1000:8.1f} ms  "
            f"fit {row['predicted_step_s'] * 1000:8.1f} ms  "
            f"held out {row['held_out_predicted_step_s'] * 1000:8.1f} ms"
        )
    typer.echo(
        f"step-time MAPE {report['mape_step_time']:.1%} in sample, "
        f"{report['mape_step_time_held_out']:.1%} held out (target 15%); saved {target}"
    )
