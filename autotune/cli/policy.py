"""``autotune train-policy`` and ``autotune tune-policy``: the learned scheduling policy.

The options' defaults and help come from ``autotune.policies.ppo_settings.PPOSettings``
(one definition of each setting); a study's command line reuses the option types and
``run_training`` (``autotune.studies.pollux.cli``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from autotune.cli.common import JsonOption, err, fail, field_docs, progress_bar
from autotune.errors import InputError
from autotune.policies.ppo_settings import PPOSettings, TraceSource

__all__ = [
    "CheckpointEveryOption",
    "EntropyOption",
    "EnvRunnersOption",
    "ForecastOption",
    "HiddenOption",
    "IterationsOption",
    "LrOption",
    "OutOption",
    "PooledOption",
    "SeedOption",
    "TrainBatchOption",
    "WarmStartEpisodesOption",
    "learned_policies",
    "run_training",
    "train_policy",
    "training_settings",
    "tune_policy",
]

_PPO = PPOSettings()
_DOC = field_docs(PPOSettings)

# Options train-policy, tune-policy and studies' training commands share, from the settings.
OutOption = Annotated[Path, typer.Option(help="Checkpoint folder to write.", show_default=False)]
IterationsOption = Annotated[int, typer.Option(min=1, help=_DOC.get("iterations"))]
CheckpointEveryOption = Annotated[int, typer.Option(min=1, help=_DOC.get("checkpoint_every"))]
WarmStartEpisodesOption = Annotated[int, typer.Option(min=1, help=_DOC.get("warm_start_episodes"))]
ForecastOption = Annotated[bool, typer.Option(help=_DOC.get("forecast"))]
LrOption = Annotated[float, typer.Option(min=0.0, help=_DOC.get("lr"))]
EntropyOption = Annotated[float, typer.Option(min=0.0, help=_DOC.get("entropy_coeff"))]
TrainBatchOption = Annotated[int, typer.Option(min=16, help=_DOC.get("train_batch"))]
HiddenOption = Annotated[int, typer.Option(min=4, help=_DOC.get("hidden"))]
PooledOption = Annotated[bool, typer.Option(help=_DOC.get("pooled"))]
DrawnSensitivityOption = Annotated[bool, typer.Option(help=_DOC.get("drawn_sensitivity"))]
EnvRunnersOption = Annotated[int, typer.Option(min=0, help=_DOC.get("env_runners"))]
EnvsPerRunnerOption = Annotated[int, typer.Option(min=1, help=_DOC.get("envs_per_runner"))]
SeedOption = Annotated[int, typer.Option(help="Seed.")]
TraceOption = Annotated[
    Path | None,
    typer.Option(help="Alibaba v2023 pod list to train on (default: synthetic jobs)."),
]
NodesOption = Annotated[Path | None, typer.Option(help="Alibaba node list (with --trace).")]
TrainPodsOption = Annotated[
    str, typer.Option(help="START:STOP pods (creation order) episodes are drawn from.")
]
WindowOption = Annotated[int, typer.Option(min=1, help="Consecutive jobs per episode.")]
SlotsOption = Annotated[int, typer.Option(min=1, help=_DOC.get("slots"))]
MaxStepsOption = Annotated[int, typer.Option(min=1, help=_DOC.get("max_steps"))]
RoundOption = Annotated[float, typer.Option("--round-s", min=1.0, help=_DOC.get("round_s"))]


def _range(text: str) -> tuple[int, int | None]:
    start, _, stop = text.partition(":")
    try:
        return int(start or 0), int(stop) if stop else None
    except ValueError:
        fail(f"--train-pods {text!r}: expected START:STOP, e.g. 1000:7000")


def train_policy(
    out: OutOption,
    algo: Annotated[str, typer.Option(help="Algorithm (ppo).")] = "ppo",
    iterations: IterationsOption = _PPO.iterations,
    trace: TraceOption = None,
    nodes: NodesOption = None,
    train_pods: TrainPodsOption = "1000:",
    window: WindowOption = 60,
    pollux_workload: Annotated[
        list[Path] | None,
        typer.Option(
            help="Pollux workload CSV(s) to train on as well, the jobs on the catalog's "
            "profiles of its applications; repeat the option."
        ),
    ] = None,
    pollux_gpus: Annotated[int, typer.Option(min=4, help="T4 GPUs for Pollux episodes.")] = 64,
    tenants: Annotated[
        str | None,
        typer.Option(
            help="Tenants sharing the cluster in the --trace and --pollux-workload "
            "episodes, as NAME=PERCENT,... (e.g. vision=50,nlp=30,speech=20): each a quota "
            "of its share of the GPUs. Half of those episodes share the cluster, each "
            "one's jobs drawn to the tenants afresh, half have no quotas; the policy sees "
            "each job's tenant's quota and headroom."
        ),
    ] = None,
    stream: Annotated[
        bool,
        typer.Option(
            help="Also train on the daemon's default world: its simulated cluster and "
            "built-in job stream."
        ),
    ] = False,
    drawn_clusters: Annotated[
        bool,
        typer.Option(
            help="Also train on clusters drawn at random (16 to 512 GPUs of 1 to 3 GPU "
            "models, 10 to 400 Gbit/s links; the built-in job stream at a drawn load), "
            "for a policy that serves clusters it never saw."
        ),
    ] = False,
    cluster_file: Annotated[
        Path | None,
        typer.Option(
            "--cluster-file",
            help="Also train on this described cluster (autotune cluster describe, "
            "calibrated by autotune calibrate --cluster-file): its nodes and measured "
            "figures, with a stream of the --task jobs its users train.",
        ),
    ] = None,
    task: Annotated[
        list[str] | None,
        typer.Option(
            "--task",
            help="A built-in task the cluster's users train (with --cluster-file), as "
            "NAME (elastic over 1 to all the cluster's devices), NAME:N (N devices) or "
            "NAME:LO-HI; repeat the option. Default: gpt-char and mlp-synthetic.",
        ),
    ] = None,
    slots: SlotsOption = _PPO.slots,
    round_s: RoundOption = _PPO.round_s,
    max_steps: MaxStepsOption = _PPO.max_steps,
    restart_s: Annotated[
        float, typer.Option("--restart-s", min=0.0, help=_DOC.get("restart_s"))
    ] = _PPO.restart_s,
    restart_s_max: Annotated[
        float | None, typer.Option("--restart-s-max", min=0.0, help=_DOC.get("restart_s_max"))
    ] = _PPO.restart_s_max,
    energy_weight: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Reward given up per kWh (default: the energy_weight setting, 0.05).",
        ),
    ] = None,
    warm_start: Annotated[
        str, typer.Option(help="Imitate this baseline before PPO: oracle, rules or none.")
    ] = _PPO.warm_start or "none",
    warm_start_episodes: WarmStartEpisodesOption = _PPO.warm_start_episodes,
    forecast: ForecastOption = _PPO.forecast,
    lr: LrOption = _PPO.lr,
    entropy_coeff: EntropyOption = _PPO.entropy_coeff,
    train_batch: TrainBatchOption = _PPO.train_batch,
    hidden: HiddenOption = _PPO.hidden,
    pooled: PooledOption = _PPO.pooled,
    drawn_sensitivity: DrawnSensitivityOption = _PPO.drawn_sensitivity,
    checkpoint_every: CheckpointEveryOption = _PPO.checkpoint_every,
    env_runners: EnvRunnersOption = _PPO.env_runners,
    envs_per_runner: EnvsPerRunnerOption = _PPO.envs_per_runner,
    seed: SeedOption = _PPO.seed,
    as_json: JsonOption = False,
) -> None:
    """Train a scheduling policy with RLlib PPO.

    The cluster environment's observation carries the LSTM demand forecast. Episodes are
    windows of Alibaba pods (--trace/--nodes) and Pollux workloads (--pollux-workload),
    the daemon's default world (--stream), clusters drawn at random (--drawn-clusters),
    your own cluster (--cluster-file, --task), or synthetic jobs. RLlib checkpoints go under
    OUT (iter_NNNN/ and final/); the RLModule that serving loads is
    final/learner_group/learner/rl_module/default_policy.
    """
    if algo != "ppo":
        fail(f"--algo {algo!r}: only ppo is supported")
    if (trace is None) != (nodes is None):
        fail("--trace and --nodes go together")
    if warm_start not in ("oracle", "rules", "none"):
        fail(f"--warm-start {warm_start!r}: oracle, rules or none")
    if restart_s_max is not None and not restart_s_max >= restart_s > 0:
        fail(f"--restart-s-max {restart_s_max:g}: must be >= --restart-s ({restart_s:g}) > 0")
    if pollux_gpus % 4:
        fail(f"--pollux-gpus {pollux_gpus}: Pollux nodes have 4 GPUs each")
    if tenants is not None:
        from autotune.envs.tenants import parse_tenant_shares

        try:
            parse_tenant_shares(tenants)
        except InputError as exc:
            fail(str(exc))
        if trace is None and not pollux_workload:
            fail("--tenants shares the --trace and --pollux-workload episodes: give one")
    for path in (trace, nodes, *(pollux_workload or [])):
        if path is not None and not path.is_file():
            fail(f"{path}: no such file")
    sources: list[TraceSource] = []
    if trace is not None and nodes is not None:
        start, stop = _range(train_pods)
        sources.append(
            TraceSource(
                kind="alibaba",
                jobs=str(trace.resolve()),
                nodes=str(nodes.resolve()),
                start=start,
                stop=stop,
                window=window,
                round_s=round_s,
                tenants=tenants,
            )
        )
    for workload in pollux_workload or []:
        sources.append(
            TraceSource(
                kind="pollux",
                jobs=str(workload.resolve()),
                gpus=pollux_gpus,
                window=window,
                round_s=round_s,
                weight=1.0 / len(pollux_workload or [1]),
                tenants=tenants,
            )
        )
    if stream:
        sources.append(TraceSource(kind="stream", jobs="", window=window, round_s=round_s))
    if drawn_clusters:
        sources.append(TraceSource(kind="clusters", jobs="", window=window, round_s=round_s))
    if task and cluster_file is None:
        fail("--task names the jobs of the --cluster-file's users: give the cluster file")
    if cluster_file is not None:
        sources.append(
            _cluster_source(cluster_file, task or ["gpt-char", "mlp-synthetic"], window, round_s)
        )
    if energy_weight is None:
        from autotune.daemon.settings import load_settings

        energy_weight = load_settings().energy_weight
    settings = training_settings(
        sources,
        warm_start=warm_start,
        train_batch=train_batch,
        iterations=iterations,
        checkpoint_every=checkpoint_every,
        slots=slots,
        round_s=round_s,
        max_steps=max_steps,
        restart_s=restart_s,
        restart_s_max=restart_s_max,
        energy_weight=energy_weight,
        forecast=forecast,
        lr=lr,
        entropy_coeff=entropy_coeff,
        hidden=hidden,
        pooled=pooled,
        drawn_sensitivity=drawn_sensitivity,
        warm_start_episodes=warm_start_episodes,
        env_runners=env_runners,
        envs_per_runner=envs_per_runner,
        seed=seed,
    )
    run_training(settings, out, as_json=as_json)


def _cluster_source(path: Path, tasks: list[str], window: int, round_s: float) -> TraceSource:
    """The training source of a described cluster, checked here so that a bad file or
    task ends the command with its reason before training starts."""
    from autotune.catalog.clusters import load_cluster
    from autotune.envs.workloads import task_mix

    try:
        cluster = load_cluster(path)
        task_mix(tasks, sum(n.gpu_count for n in cluster.nodes))
    except (InputError, ValueError) as exc:
        fail(str(exc))
    return TraceSource(
        kind="cluster",
        jobs=",".join(tasks),
        nodes=str(path.resolve()),
        window=window,
        round_s=round_s,
    )


def training_settings(
    sources: list[TraceSource], *, warm_start: str, train_batch: int, **options: Any
) -> PPOSettings:
    """The ``PPOSettings`` of a training command's options (``options``: any other
    field): ``--warm-start none`` imitates nothing, and a step's minibatch is at most the
    iteration's batch."""
    return PPOSettings(
        sources=tuple(sources),
        warm_start=None if warm_start == "none" else warm_start,
        train_batch=train_batch,
        minibatch=min(_PPO.minibatch, train_batch),
        **options,
    )


def run_training(settings: PPOSettings, out: Path, *, as_json: bool) -> None:
    """Train with PPO under a progress bar, then print the report (``--json``) or where
    the checkpoint went; a bad setting ends the command with its reason."""
    from autotune.policies.ppo import train_ppo

    progress = progress_bar(
        "training PPO",
        "iter {task.completed}/{task.total}  return {task.fields[ret]}",
        enabled=not as_json,
    )
    with progress:
        task = progress.add_task("train", total=settings.iterations, ret="-")

        def update(i: int, _n: int, row: dict[str, float]) -> None:
            progress.update(task, completed=i, ret=f"{row['episode_return_mean']:.2f}")

        try:
            report: dict[str, Any] = train_ppo(settings, out, progress=update)
        except ValueError as exc:
            fail(str(exc))
    if as_json:
        typer.echo(json.dumps(report, default=str))
    else:
        last = report["history"][-1]
        err.print(
            f"wrote {report['checkpoint']} after {settings.iterations} iterations "
            f"({report['time_s']:.0f} s; mean episode return {last['episode_return_mean']:.2f})"
        )


def learned_policies(
    names: list[str],
    *,
    checkpoint: Path | None,
    slots: int,
    round_s: float,
    budget_s: float,
    charge: bool = True,
) -> dict[str, Any]:
    """Factories ``(env, seed) -> Policy`` for the ``eval`` policies that are not
    baselines. The checkpoint is loaded at the first episode of each seed; a bad one is
    an ``InputError`` before any episode runs."""
    factories: dict[str, Any] = {}
    if "ppo" in names:
        import torch

        from autotune.policies.serving import LearnedPolicy, PolicyServer

        torch.set_num_threads(1)
        server = PolicyServer(checkpoint, slots=slots)  # raises if it does not fit

        def ppo(env: Any, seed: int, forecast: str = "lstm") -> Any:
            # The encoder reads the restart cost the simulated cluster charges, as the
            # training environment's does.
            return LearnedPolicy(
                slots=slots,
                round_s=round_s,
                restart_s=env.sim_config.restart_s,
                server=server,
                forecast=forecast,
            )

        factories["ppo"] = ppo
    if "tune" in names:
        from autotune.policies.trial_tuner import TrialTunerPolicy

        factories["tune"] = lambda env, seed: TrialTunerPolicy(
            env, budget_s=budget_s, seed=seed, charge=charge
        )
    return factories


def tune_policy(
    out: Annotated[Path, typer.Option(help="Folder for the search's trials.", show_default=False)],
    samples: Annotated[int, typer.Option(min=1, help="Trials (hyperparameter draws).")] = 4,
    iterations: Annotated[int, typer.Option(min=1, help="Most PPO iterations per trial.")] = 8,
    grace: Annotated[int, typer.Option(min=1, help="ASHA's grace period (iterations).")] = 2,
    concurrent: Annotated[int, typer.Option(min=1, help="Trials at a time (1 CPU each).")] = 2,
    trace: TraceOption = None,
    nodes: NodesOption = None,
    train_pods: TrainPodsOption = "1000:",
    window: WindowOption = 60,
    slots: SlotsOption = _PPO.slots,
    round_s: RoundOption = _PPO.round_s,
    max_steps: MaxStepsOption = _PPO.max_steps,
    warm_start: Annotated[
        str, typer.Option(help="Imitate this baseline before every trial: oracle, rules, none.")
    ] = "none",
    warm_start_episodes: WarmStartEpisodesOption = _PPO.warm_start_episodes,
    seed: SeedOption = _PPO.seed,
    as_json: JsonOption = False,
) -> None:
    """Search PPO's hyperparameters with Ray Tune and ASHA.

    Learning rate, entropy coefficient and batch size; prints every trial and the best.
    """
    if (trace is None) != (nodes is None):
        fail("--trace and --nodes go together")
    if warm_start not in ("oracle", "rules", "none"):
        fail(f"--warm-start {warm_start!r}: oracle, rules or none")
    for path in (trace, nodes):
        if path is not None and not path.is_file():
            fail(f"{path}: no such file")
    from autotune.policies.ppo_search import search

    sources: tuple[TraceSource, ...] = ()
    if trace is not None and nodes is not None:
        start, stop = _range(train_pods)
        sources = (
            TraceSource(
                jobs=str(trace.resolve()),
                nodes=str(nodes.resolve()),
                start=start,
                stop=stop,
                window=window,
                round_s=round_s,
            ),
        )
    settings = PPOSettings(
        iterations=iterations,
        slots=slots,
        round_s=round_s,
        max_steps=max_steps,
        warm_start=None if warm_start == "none" else warm_start,
        warm_start_episodes=warm_start_episodes,
        seed=seed,
        sources=sources,
    )
    bar = progress_bar(
        "searching",
        "{task.completed}/{task.total} trials ended, {task.fields[iterations]} iterations",
        enabled=not as_json,
    )
    with bar:
        task = bar.add_task("search", total=samples, iterations=0)
        try:
            report = search(
                settings,
                out,
                samples=samples,
                grace=grace,
                concurrent=concurrent,
                progress=lambda ended, iterations: bar.update(
                    task, completed=ended, iterations=iterations
                ),
            )
        except (ValueError, InputError) as exc:
            fail(str(exc))
    if as_json:
        typer.echo(json.dumps(report, default=str))
        return
    out_console = Console()
    out_console.print(f"{'lr':>10s} {'entropy':>8s} {'batch':>6s} {'iters':>6s} {'return':>8s}")
    for t in report["trials"]:
        ret = t["episode_return_mean"]
        out_console.print(
            f"{t['lr']:10.2e} {t['entropy_coeff']:8.4f} {t['train_batch']:6d} "
            f"{t['iterations'] or 0:6d} {ret if ret is not None else float('nan'):8.3f}"
        )
    out_console.print(f"best: {report['best']}")
