"""``autotune pollux ...``: the Pollux-compatible world from the command line.

- ``eval``: play a Pollux workload as Pollux's simulator does (measured physics, its
  clock and knobs) under several policies, and compare them;
- ``train-policy``: train the learned policy of this world (PPO after imitating
  ``goodput-size``), served by ``eval --policies ppo --policy-checkpoint``;
- ``validate-model``: the performance model fitted on part of Pollux's measurements,
  scored on the rest;
- ``calibrate-model``: the coefficients fitted on all of them, as the catalog ships them.

Registered under the ``autotune.commands`` entry points; the ``autotune`` command line
finds it there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from autotune.cli.common import (
    JsonOption,
    TenantsOption,
    err,
    fail,
    print_policy_table,
    print_tenant_table,
    runs_progress,
    user_errors,
)
from autotune.cli.policy import (
    CheckpointEveryOption,
    EntropyOption,
    EnvRunnersOption,
    ForecastOption,
    HiddenOption,
    IterationsOption,
    LrOption,
    OutOption,
    PooledOption,
    SeedOption,
    TrainBatchOption,
    WarmStartEpisodesOption,
    run_training,
    training_settings,
)
from autotune.errors import InputError
from autotune.policies.ppo_settings import PPOSettings, TraceSource

__all__ = ["app"]

app = typer.Typer(
    help="The Pollux-compatible world (Pollux, OSDI'21): its workloads on its measured "
    "physics, clock and knobs; its policies, the learned one, and the performance model "
    "against its measurements.",
    no_args_is_help=True,
)

_PPO = PPOSettings()

TracesOption = Annotated[
    Path | None,
    typer.Option(
        help="Pollux traces folder (<app>/placements.csv ...; default: traces/ beside the "
        "workloads' folder).",
        show_default=False,
    ),
]
GpusOption = Annotated[int, typer.Option(min=4, help="T4 GPUs of the testbed (4 per node).")]


def _traces(workload: Path, traces: Path | None) -> Path:
    folder = traces or workload.resolve().parent.parent / "traces"
    if not folder.is_dir():
        raise InputError("no Pollux traces folder here (--traces)", path=str(folder))
    return folder


@app.command("eval")
@user_errors
def eval_command(
    workload: Annotated[
        Path, typer.Option(help="Pollux workload CSV (name,time,application,...).")
    ],
    traces: TracesOption = None,
    policies: Annotated[
        str,
        typer.Option(
            help="Comma-separated: static, rules, random, tiresias, optimus, oracle "
            "(on the measured physics), goodput, goodput-size, ppo (needs "
            "--policy-checkpoint: one trained with `autotune pollux train-policy`)."
        ),
    ] = "tiresias,goodput",
    policy_checkpoint: Annotated[
        Path | None, typer.Option(help="RLModule checkpoint for ppo.", show_default=False)
    ] = None,
    gpus: GpusOption = 64,
    limit_jobs: Annotated[int | None, typer.Option(min=1, help="Replay the first N jobs.")] = None,
    skip_jobs: Annotated[
        int, typer.Option(min=0, help="Leave out the first N jobs (before --limit-jobs).")
    ] = 0,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per policy.")] = 1,
    slots: Annotated[int, typer.Option(min=1, help="Jobs a policy decides per round.")] = 32,
    forecast: Annotated[
        str, typer.Option(help="What fills the learned policy's forecast features.")
    ] = "lstm",
    tenants: TenantsOption = None,
    trace_seed: Annotated[int, typer.Option(help="Seed of --tenants' draw.")] = 0,
    as_json: JsonOption = False,
) -> None:
    """Play a Pollux workload as Pollux's simulator does (each job's replicas and batch
    from the file, fp32, no compression, progress from the measured traces, 60 s rounds,
    30 s per start or restart, Pollux's clock) with Pollux's knobs only (each job's GPU
    count and batch size), under several policies; compare their job completion times.
    The world has no noise: one seed is all there is. --tenants shares the cluster
    between tenants with quotas and reports each tenant's fairness."""
    from autotune.envs.tenants import parse_tenant_shares
    from autotune.studies.pollux.evaluate import POLICIES, evaluate_compat

    names = [p.strip() for p in policies.split(",") if p.strip()]
    known = [*POLICIES, "ppo"]
    unknown = [p for p in names if p not in known]
    if unknown or not names:
        raise InputError(
            f"unknown policy {unknown}; the Pollux-compatible world runs {', '.join(known)}"
        )
    shares = parse_tenant_shares(tenants) if tenants is not None else None
    if "ppo" in names and policy_checkpoint is None:
        raise InputError(
            "ppo needs --policy-checkpoint: a policy trained in this world "
            "(autotune pollux train-policy); the shipped one acts in the default world"
        )
    with runs_progress(len(names) * seeds, enabled=not as_json) as advance:
        report = evaluate_compat(
            workload,
            _traces(workload, traces),
            names,
            checkpoint=policy_checkpoint,
            gpus=gpus,
            seeds=seeds,
            slots=slots,
            skip_jobs=skip_jobs,
            limit_jobs=limit_jobs,
            forecast=forecast,
            tenants=shares,
            tenant_seed=trace_seed,
            progress=advance,
        )
    if as_json:
        typer.echo(json.dumps(report))
        return
    out = Console()
    out.print(f"{report['trace']['jobs']} jobs on {report['trace']['gpus']} GPUs")
    print_policy_table(
        out,
        report["policies"],
        [
            ("avg JCT s", "avg_jct_s", "10.0f"),
            ("p99 JCT s", "p99_jct_s", "10.0f"),
            ("makespan s", "makespan_s", "11.0f"),
        ],
        min_width=12,
    )
    if shares:
        print_tenant_table(out, report["policies"])


@app.command("train-policy")
def train_policy(
    out: OutOption,
    workload: Annotated[
        list[Path],
        typer.Option(help="Pollux workload CSV(s), each played whole; repeat the option."),
    ],
    traces: TracesOption = None,
    gpus: GpusOption = 64,
    iterations: IterationsOption = _PPO.iterations,
    slots: Annotated[int, typer.Option(min=1, help="Job slots of the training env.")] = 32,
    max_steps: Annotated[int, typer.Option(min=1, help="Rounds per episode at most.")] = 5000,
    warm_start: Annotated[
        str, typer.Option(help="Imitate this teacher before PPO: goodput-size or none.")
    ] = "goodput-size",
    warm_start_episodes: WarmStartEpisodesOption = _PPO.warm_start_episodes,
    size_exponent: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="The teacher goodput-size's exponent (a job's weight is (remaining time / "
            "1 h)^-exponent).",
        ),
    ] = 0.5,
    fairness_p: Annotated[
        float,
        typer.Option(
            max=-1e-9,
            help="The goodput allocation's p (Pollux's -1), for the teacher and the policy; "
            "saved beside the module.",
        ),
    ] = -1.0,
    residual: Annotated[
        bool,
        typer.Option(
            help="A residual policy: its action corrects the weights goodput-size gives "
            "(log2 of the factor), so it starts as the teacher; saved beside the module.",
        ),
    ] = False,
    forecast: ForecastOption = _PPO.forecast,
    lr: LrOption = _PPO.lr,
    entropy_coeff: EntropyOption = _PPO.entropy_coeff,
    train_batch: TrainBatchOption = _PPO.train_batch,
    hidden: HiddenOption = _PPO.hidden,
    pooled: PooledOption = _PPO.pooled,
    checkpoint_every: CheckpointEveryOption = _PPO.checkpoint_every,
    env_runners: EnvRunnersOption = _PPO.env_runners,
    seed: SeedOption = _PPO.seed,
    as_json: JsonOption = False,
) -> None:
    """Train the learned policy of the Pollux-compatible world with RLlib PPO: its action
    is every job's weight in the goodput allocation, its reward minus the job-hours; it
    first imitates goodput-size. Serve it with autotune pollux eval --policies ppo
    --policy-checkpoint OUT/final/learner_group/learner/rl_module/default_policy."""
    if warm_start not in ("goodput-size", "none"):
        fail(f"--warm-start {warm_start!r}: goodput-size or none")
    if gpus % 4:
        fail(f"--gpus {gpus}: Pollux nodes have 4 GPUs each")
    for path in workload:
        if not path.is_file():
            fail(f"{path}: no such file")
    sources = []
    for path in workload:
        try:
            folder = _traces(path, traces)
        except InputError as exc:
            fail(str(exc))
        sources.append(
            TraceSource(
                kind="pollux-compat",
                jobs=str(path.resolve()),
                gpus=gpus,
                traces=str(folder.resolve()),
                weight=1.0 / len(workload),
            )
        )
    settings = training_settings(
        sources,
        warm_start=warm_start,
        train_batch=train_batch,
        iterations=iterations,
        checkpoint_every=checkpoint_every,
        slots=slots,
        max_steps=max_steps,
        forecast=forecast,
        lr=lr,
        entropy_coeff=entropy_coeff,
        hidden=hidden,
        pooled=pooled,
        env_runners=env_runners,
        warm_start_episodes=warm_start_episodes,
        seed=seed,
        world_options={
            "size_exponent": size_exponent,
            "fairness_p": fairness_p,
            "residual": float(residual),
        },
    )
    run_training(settings, out, as_json=as_json)


@app.command("validate-model")
@user_errors
def validate_model(
    traces: Annotated[
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
    from autotune.studies.pollux.fit import plot_residuals, validate

    report = validate(
        traces,
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


@app.command("calibrate-model")
@user_errors
def calibrate_model(
    traces: Annotated[
        Path,
        typer.Option(help="Pollux traces folder (<app>/placements.csv ...).", show_default=False),
    ],
    out: Annotated[Path, typer.Option(help="Where to write the calibration JSON.")],
) -> None:
    """Fit every Pollux application on all its placements and write the document the
    package ships as autotune/data/applications.json (the catalog's measured
    applications)."""
    from autotune.studies.pollux.fit import calibrate

    out.write_text(json.dumps(calibrate(traces), indent=1) + "\n")
    err.print(f"wrote {out}")
