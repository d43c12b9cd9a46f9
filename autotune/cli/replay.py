"""``autotune replay``: learn from the daemon's logged runs. ``export`` writes the logged
rounds as RLlib offline data, ``train`` retrains a policy from them, ``evaluate`` compares
candidates with the logging policy (counterfactual simulation and off-policy estimates)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from autotune.cli.common import (
    ConfigOption,
    DataDirOption,
    DbOption,
    JsonOption,
    err,
    progress_bar,
    user_errors,
)
from autotune.errors import InputError

__all__ = ["replay_app"]

replay_app = typer.Typer(
    help="Learn from logged runs: export them, retrain a policy, evaluate candidates.",
    no_args_is_help=True,
)


def _when(text: str | None, option: str) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InputError(
            f"{option} {text!r}: an ISO 8601 time, e.g. 2026-11-30T12:00:00Z"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


@replay_app.command("export")
@user_errors
def export_command(
    out: Annotated[Path, typer.Option("--out", help="Folder to write (new or empty).")],
    config: ConfigOption = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
    since: Annotated[
        str | None, typer.Option(help="Only rounds decided at or after this time (ISO 8601).")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Only rounds decided before this time (ISO 8601).")
    ] = None,
    json_out: JsonOption = False,
) -> None:
    """Export the learned policy's logged rounds as Parquet for offline training.

    One row per job decision (RLlib's columns obs, actions, rewards, new_obs,
    terminateds, truncateds, eps_id, t, plus action_logp, the action mask and the reward's
    parts), in at most 4 files; manifest.json describes them, workload.json holds the
    jobs that arrived, for replay in the simulator."""
    from autotune.daemon.settings import load_settings
    from autotune.replay.export import export

    settings = load_settings(config, db_url=db, data_dir=data_dir)
    if settings.db_url is None and not (settings.data_dir / "autotune.db").is_file():
        raise InputError(f"no daemon database in {settings.data_dir}: give --db")
    with progress_bar("exporting", "{task.completed} rounds", enabled=not json_out) as bar:
        task = bar.add_task("export", total=None)
        report = export(
            settings.database_url,
            out,
            since=_when(since, "--since"),
            until=_when(until, "--until"),
            progress=lambda n: bar.update(task, completed=n),
        )
    if json_out:
        typer.echo(json.dumps(report.to_json()))
        return
    typer.echo(
        f"{report.rows} transitions from {report.rounds} rounds ({report.episodes} job "
        f"episodes) in {len(report.files)} file(s) under {report.out}, {report.seconds:.1f} s"
    )
    if report.skipped_unmeasured or report.skipped_not_applied:
        err.print(
            f"left out: {report.skipped_unmeasured} round(s) without a measured reward, "
            f"{report.skipped_not_applied} job decision(s) an override or a fallback took"
        )


@replay_app.command("train")
@user_errors
def train_command(
    data: Annotated[
        Path, typer.Option(help="An export (`autotune replay export`).", show_default=False)
    ],
    out: Annotated[
        Path,
        typer.Option(help="Folder for the trained RLModule and train.json.", show_default=False),
    ],
    algo: Annotated[str, typer.Option(help="bc (behaviour cloning) or marwil.")] = "bc",
    init: Annotated[
        Path | None,
        typer.Option(help="Policy checkpoint to start from (default: the shipped policy)."),
    ] = None,
    epochs: Annotated[
        float, typer.Option(min=0.0, help="Passes over the data (unless --iterations).")
    ] = 5.0,
    iterations: Annotated[
        int | None, typer.Option(min=1, help="Gradient steps (default: from --epochs).")
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Logged rows per step.")] = 256,
    lr: Annotated[float, typer.Option(min=0.0, help="Learning rate.")] = 1e-4,
    beta: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="MARWIL's advantage temperature.")
    ] = 1.0,
    sim_finetune: Annotated[
        int,
        typer.Option(
            min=0, help="PPO iterations in the simulator on the export's workload afterwards."
        ),
    ] = 0,
    sim_train_batch: Annotated[
        int, typer.Option(min=16, help="Simulated rounds per PPO iteration.")
    ] = 512,
    sim_max_steps: Annotated[
        int, typer.Option(min=1, help="Rounds per simulated episode at most.")
    ] = 128,
    sim_teacher: Annotated[
        str | None,
        typer.Option(
            help="Before PPO, imitate this baseline (oracle) on episodes of the export's "
            "workload: it searches the performance model calibrated to the logs."
        ),
    ] = None,
    sim_teacher_episodes: Annotated[
        int, typer.Option(min=1, help="Episodes the teacher plays for the imitation.")
    ] = 20,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    json_out: JsonOption = False,
) -> None:
    """Retrain the learned policy from an export with RLlib's BC or MARWIL.

    It starts from the active policy's weights (--init), imitates the logged decisions
    (MARWIL weights each by its advantage over the job's return), counting only the action
    entries that mattered; --sim-finetune then runs PPO in the simulator on the logged
    workload (after imitating --sim-teacher there, if given). OUT holds the RLModule
    (what `autotune daemon` and `replay evaluate` load) and train.json (losses, data
    summary, content hashes)."""
    from autotune.policies.replay.train import OfflineSettings, train_offline

    settings = OfflineSettings(
        algo=algo,
        iterations=iterations,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        beta=beta,
        seed=seed,
        sim_finetune=sim_finetune,
        sim_train_batch=sim_train_batch,
        sim_max_steps=sim_max_steps,
        sim_teacher=sim_teacher,
        sim_teacher_episodes=sim_teacher_episodes,
    )
    with progress_bar(
        "{task.description}",
        "{task.completed}/{task.total}  {task.fields[detail]}",
        enabled=not json_out,
    ) as bar:
        task = bar.add_task(f"training {algo}", total=None, detail="")
        offline_total = 0

        def update(phase: str, done: int, total: int, row: dict[str, float]) -> None:
            nonlocal offline_total
            if phase == "offline":
                offline_total = total
                loss = row.get("total_loss")
                detail = f"loss {loss:.3f}" if loss is not None else ""
                bar.update(task, completed=done, total=total + sim_finetune, detail=detail)
            else:
                ret = row.get("episode_return_mean")
                detail = f"simulator return {ret:.2f}" if ret is not None else ""
                bar.update(
                    task,
                    description="fine-tuning in the simulator",
                    completed=offline_total + done,
                    detail=detail,
                )

        report = train_offline(data, out, settings, init=init, progress=update)
    if json_out:
        typer.echo(json.dumps(report, default=str))
        return
    agreement = report["agreement"]
    steps = " -> ".join(
        f"{agreement[k]:.1%}" for k in ("init", "offline", "final") if k in agreement
    )
    typer.echo(
        f"{report['version']}: {report['checkpoint']} after {report['iterations']} "
        f"{algo} iterations on {report['data']['rows']} logged decisions"
        + (f" and {sim_finetune} PPO iterations in the simulator" if sim_finetune else "")
        + f" ({report['seconds']['total']:.0f} s); logged entries its greedy action "
        f"matches: {steps}"
    )


@replay_app.command("evaluate")
@user_errors
def evaluate_command(
    policy: Annotated[
        list[str],
        typer.Option(
            "--policy",
            help="A policy: the first is the logging policy, the others candidates. "
            "NAME=CHECKPOINT, CHECKPOINT, 'shipped' (the packaged policy) or 'rules'.",
        ),
    ],
    data: Annotated[
        Path | None,
        typer.Option(
            help="An export (`autotune replay export`): off-policy estimates on its "
            "rows, and its workload for the counterfactual simulation."
        ),
    ] = None,
    pollux_workload: Annotated[
        Path | None,
        typer.Option(
            "--pollux-workload",
            help="Play this Pollux workload CSV in the counterfactual simulation instead of "
            "the export's logged jobs.",
        ),
    ] = None,
    workload_jobs: Annotated[
        str | None,
        typer.Option("--workload-jobs", help="START:STOP of --pollux-workload's jobs."),
    ] = None,
    gpus: Annotated[int, typer.Option(help="GPUs of the Pollux testbed (4 per node).")] = 64,
    round_s: Annotated[float, typer.Option("--round-s", help="Round period, seconds.")] = 300.0,
    seeds: Annotated[int, typer.Option(min=1, help="Simulation seeds per policy.")] = 3,
    resamples: Annotated[int, typer.Option(min=100, help="Bootstrap resamples.")] = 1000,
    json_out: JsonOption = False,
) -> None:
    """Compare candidate policies with the logging policy, two ways, with 95% intervals.

    Counterfactual simulation: the workload played under each policy, same seeds (average
    JCT, goodput, energy). Off-policy estimates on the logged rows: self-normalised
    importance sampling and doubly robust, bootstrapped by episode, with the effective
    sample size. Verdict: promote a candidate only if every lower 95% bound of (candidate
    - logging) is above 0 and the effective sample size is at least 10% of the rows."""
    from autotune.policies.replay.evaluate import evaluate_replay, parse_policy

    specs = [parse_policy(p) for p in policy]
    workload: Any = None
    if pollux_workload is not None:
        from autotune.envs.presets import pollux_nodes
        from autotune.envs.workloads import pollux_arrivals

        workload = (pollux_nodes(gpus), pollux_arrivals(pollux_workload, workload_jobs), round_s)
    elif data is None:
        raise InputError("give --data (an export) or --pollux-workload")
    total = seeds * len(specs)
    with progress_bar(
        "simulating", "{task.completed}/{task.total} runs", enabled=not json_out
    ) as bar:
        task = bar.add_task("runs", total=total)
        report = evaluate_replay(
            data,
            specs,
            workload=workload,
            seeds=seeds,
            resamples=resamples,
            progress=lambda _name, _seed: bar.advance(task),
        )
    if json_out:
        typer.echo(json.dumps(report))
        return
    _print(report)


def _fmt(entry: dict[str, Any], digits: int = 2) -> str:
    mean = entry.get("mean", entry.get("value"))
    low, high = entry["low"], entry["high"]
    if mean is None:
        return "-"
    if low is None:
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} [{low:,.{digits}f}, {high:,.{digits}f}]"


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    cf = report["counterfactual"]
    table = Table(
        title=f"counterfactual simulation ({cf['trace']['jobs']} jobs, "
        f"{cf['trace']['seeds']} seeds; 95% t-intervals)"
    )
    for column in ("policy", "avg JCT (s)", "goodput", "energy (kWh)", "vs logging"):
        table.add_column(column)
    for name, entry in cf["policies"].items():
        relative = entry.get("relative")
        versus = (
            f"JCT {relative['avg_jct']:+.1%}, goodput {relative['goodput']:+.1%}"
            if relative
            else "(logging)"
        )
        table.add_row(
            name,
            _fmt(entry["avg_jct_s"], 0),
            _fmt(entry["goodput"]),
            _fmt(entry["energy_kwh"], 1),
            versus,
        )
    console.print(table)
    ope = report["off_policy"]
    if ope is not None:
        table = Table(
            title=f"off-policy estimates ({ope['rows']} logged decisions, "
            f"{ope['episodes']} episodes; candidate - logging, 95% bootstrap)"
        )
        for column in ("policy", "SNIS", "DR", "ESS share", "clipped"):
            table.add_column(column)
        for name, entry in ope["policies"].items():
            if "skipped" in entry:
                table.add_row(name, entry["skipped"], "", "", "")
                continue
            table.add_row(
                name,
                _fmt(entry["snis"]["difference"], 3),
                _fmt(entry["dr"]["difference"], 3),
                f"{entry['ess_share']:.1%}",
                f"{entry['clipped_share']:.1%}",
            )
        console.print(table)
    for name, verdict in report["verdicts"].items():
        if verdict["promote"]:
            console.print(f"[green]{name}: promote[/green]")
        else:
            console.print(f"[red]{name}: do not promote[/red]: " + "; ".join(verdict["failed"]))
