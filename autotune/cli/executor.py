"""Commands that train for real through the executor: ``autotune job run`` (one job with
a given configuration, no policy) and ``autotune calibrate`` (fit the performance model
to this machine)."""

from __future__ import annotations

import json
from collections.abc import Mapping
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
from autotune.executor.calibrate import CLUSTER_STEPS, LOCAL_STEPS
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
        int | None,
        typer.Option(
            "--steps",
            help=f"Measured steps per configuration (default: {LOCAL_STEPS} on this machine, "
            f"{CLUSTER_STEPS} with --cluster-file, where a short run's step on the network "
            "varies more).",
            min=2,
        ),
    ] = None,
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
    efficiency: Annotated[
        list[str] | None,
        typer.Option(
            "--efficiency",
            help="Also measure this built-in task's statistical efficiency under each "
            "compression the policy chooses among (steps to a target loss against plain "
            "DDP, local processes), and its gradient noise scale at the end of plain "
            "DDP's runs (the task's prior from then on); repeat it. With --cluster-file "
            "and no --ray-address, only this, added to the file's calibration.",
        ),
    ] = None,
    compute: Annotated[
        list[str] | None,
        typer.Option(
            "--compute",
            help="With --cluster-file: also fit this built-in task's own costs (its "
            "speed on the calibrated device, per-step overhead and per-collective cost) "
            "from plain DDP over the machines at its batch and at 4x; its jobs are then "
            "priced with them instead of gpt-char's (gpt-char's are the calibration's "
            "own: nothing to add). Repeat it. Recalibrating drops them: give it again.",
        ),
    ] = None,
    efficiency_steps: Annotated[
        int,
        typer.Option(
            "--efficiency-steps",
            help="N: the target is plain DDP's loss at step N; a compression trains up "
            "to 2N steps.",
            min=20,
        ),
    ] = 150,
    efficiency_seeds: Annotated[
        int,
        typer.Option(
            "--efficiency-seeds",
            help="Seeds per task (from --seed); the efficiency is their median.",
            min=1,
        ),
    ] = 3,
    as_json: JsonOption = False,
) -> None:
    """Fit the performance model to this machine, or to a described cluster, from gpt-char
    runs.

    Here: trains gpt-char under 12 configurations (layouts x compression x precision),
    fits the performance model's device and coefficients to the measured step times (the
    fitter ``autotune model calibrate`` uses for the Pollux measurements), saves the
    profile, and reports the step-time error (target MAPE <= 15%).

    With --cluster-file: trains gpt-char over the cluster's machines under 6
    configurations (data parallel dense in fp32 at the batch and at 4x it, under int8,
    under PowerSGD rank 4 and under top-k 1% in bf16; a tensor-parallel pair across
    machines), fits the device, the links' latency and achieved bandwidth and a
    tensor-parallel collective's latency to the step times and the synchronisation no
    rank hid, and writes the calibration into the cluster file: the simulated cluster of
    ``autotune train-policy --cluster-file`` and the daemon then use it.

    With --compute TASK (and --cluster-file): also trains TASK with plain DDP over the
    machines at its batch and at 4x, and fits its own costs (speed on the calibrated
    device, per-step overhead, per-collective cost): its jobs are priced with them instead
    of gpt-char's.

    With --efficiency TASK: also trains TASK with plain DDP and under each compression
    the policy chooses among (2 local processes, --efficiency-seeds seeds), and saves the
    steps-to-target ratio as the task's efficiency under that compression: from then on
    the task's profile is charged it instead of the catalog's constant, where a policy
    trains and where the daemon serves. It needs no cluster: with --cluster-file and no
    --ray-address only the efficiencies are measured, into the file's calibration."""
    from autotune.catalog.clusters import load_cluster, save_cluster
    from autotune.daemon.settings import Settings
    from autotune.executor.calibrate import (
        GRID,
        TASK,
        calibrate,
        calibrate_compute,
        link_grid,
        save_profile,
    )
    from autotune.ray_session import ensure_ray

    tasks = _trainable_tasks(efficiency or [])
    computed = [t for t in _trainable_tasks(compute or [], "--compute") if t != TASK]
    seeds = list(range(seed, seed + efficiency_seeds))
    if compute and cluster_file is None:
        fail("--compute fits a task's compute on a described cluster: give --cluster-file")
    if tasks and cluster_file is None:
        fail(
            "--efficiency saves into a cluster file's calibration, which a policy trains on "
            "and the daemon loads: give --cluster-file"
        )
    if cluster_file is not None and ray_address is None and compute:
        fail("--compute trains the task on the cluster: give its --ray-address")
    if cluster_file is not None and ray_address is None and tasks:
        _efficiency_only(cluster_file, tasks, efficiency_steps, seeds, out, as_json)
        return
    cluster = None
    grid = GRID
    if cluster_file is not None:
        if ray_address is None:
            fail(
                "--cluster-file calibrates a running Ray cluster: give its --ray-address "
                "(or only --efficiency TASK, which needs no cluster)"
            )
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
    total = len(grid) + len(computed) * 2
    bar = progress.add_task("calibrate", total=total, note="")
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
            for task in computed:
                assert cluster is not None  # --compute needs --cluster-file
                fitted = calibrate_compute(
                    task,
                    report,
                    cluster=cluster,
                    steps=report["steps"],
                    seed=seed,
                    progress=lambda what: progress.update(bar, advance=1, note=what),
                )
                statistics = report.setdefault("statistics", {})
                statistics[task] = {**statistics.get(task, {}), "compute": fitted}
    except InputError as exc:
        fail(str(exc))
    finally:
        if started:
            import ray

            ray.shutdown()
    report["saved_to"] = str(target)
    if cluster is not None:
        _keep_measured(report, cluster.calibration, tasks)
        save_cluster(cluster.with_calibration(report), target)
        if tasks:  # saved first: a failed measurement loses none of the link calibration
            _measure_efficiency(report, tasks, efficiency_steps, seeds, enabled=not as_json)
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
    for task in computed:
        for row in report["statistics"][task]["compute"]["configs"]:
            typer.echo(
                f"{task + ' ' + row['config']:<36} measured "
                f"{row['measured_step_s'] * 1000:8.1f} ms  "
                f"fit {row['predicted_step_s'] * 1000:8.1f} ms  "
                f"on gpt-char's {row['cluster_predicted_step_s'] * 1000:8.1f} ms"
            )
    _echo_efficiency(report, tasks)
    typer.echo(
        f"step-time MAPE {report['mape_step_time']:.1%} in sample, "
        f"{report['mape_step_time_held_out']:.1%} held out (target 15%); saved {target}"
    )


def _trainable_tasks(names: list[str], option: str = "--efficiency") -> list[str]:
    from autotune.catalog.tasks import trainable_tasks

    known = trainable_tasks()
    for name in names:
        if name not in known:
            fail(f"{option} {name!r}: not a built-in task the executor trains ({known})")
    return list(dict.fromkeys(names))


def _measure_efficiency(
    report: dict[str, Any], tasks: list[str], steps: int, seeds: list[int], *, enabled: bool
) -> None:
    """Measure each task's compression efficiencies into ``report["statistics"]``, beside
    what the report already holds of the task (its noise scale)."""
    from autotune.executor.efficiency import compression_efficiencies
    from autotune.rl.action import COMPRESSIONS

    compressions = [c for c in COMPRESSIONS if c.kind != "none"]
    progress = progress_bar(
        "efficiency", "{task.completed}/{task.total} runs {task.fields[note]}", enabled=enabled
    )
    bar = progress.add_task(
        "efficiency", total=len(tasks) * len(seeds) * (1 + len(compressions)), note=""
    )
    statistics = report.setdefault("statistics", {})
    try:
        with progress:
            for task in tasks:
                found = compression_efficiencies(
                    task,
                    compressions,
                    n_steps=steps,
                    seeds=seeds,
                    progress=lambda what: progress.update(bar, advance=1, note=what),
                )
                statistics[task] = {**statistics.get(task, {}), **found}
    except InputError as exc:
        fail(str(exc))
    except (RuntimeError, TimeoutError) as exc:
        fail(f"measuring the compression efficiencies failed: {exc}")


def _keep_measured(
    report: dict[str, Any], previous: Mapping[str, Any] | None, tasks: list[str]
) -> None:
    """Carry the compression efficiencies an earlier calibration measured of tasks not
    measured again into the new ``report``: recalibrating the links keeps them."""
    from autotune.executor.efficiency import KEYS

    if not previous:
        return
    statistics = report.setdefault("statistics", {})
    for task, figures in (previous.get("statistics") or {}).items():
        if task in tasks or "compression_efficiency" not in figures:
            continue
        kept = {k: figures[k] for k in KEYS if k in figures}
        statistics[task] = {**statistics.get(task, {}), **kept}


def _efficiency_only(
    cluster_file: Path,
    tasks: list[str],
    steps: int,
    seeds: list[int],
    out: Path | None,
    as_json: bool,
) -> None:
    """``--efficiency`` on a calibrated cluster file, without a cluster: the efficiencies
    measured into its calibration."""
    from autotune.catalog.clusters import load_cluster, save_cluster

    if out is not None:
        fail("--cluster-file saves the calibration into the cluster file; drop --out")
    try:
        cluster = load_cluster(cluster_file)
    except InputError as exc:
        fail(str(exc))
    if cluster.calibration is None:
        fail(
            f"{cluster_file} holds no calibration: calibrate the cluster first "
            "(autotune calibrate --cluster-file FILE --ray-address ADDRESS)"
        )
    report = dict(cluster.calibration)
    _measure_efficiency(report, tasks, steps, seeds, enabled=not as_json)
    save_cluster(cluster.with_calibration(report), cluster_file)
    if as_json:
        typer.echo(json.dumps({"saved_to": str(cluster_file), "statistics": report["statistics"]}))
        return
    _echo_efficiency(report, tasks)
    typer.echo(f"saved into the calibration of {cluster_file}")


def _echo_efficiency(report: dict[str, Any], tasks: list[str]) -> None:
    for task in tasks:
        figures = report["statistics"][task]
        found = figures["compression_efficiency"]
        noise = figures.get("run_noise_scale")
        typer.echo(
            f"{task}: efficiency "
            + ", ".join(f"{name} {value:.2f}" for name, value in found.items())
            + ("" if noise is None else f"; noise scale {noise:.1f} samples")
        )
