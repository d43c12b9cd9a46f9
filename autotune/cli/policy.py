"""``autotune train-policy`` and ``autotune tune-policy``: the learned scheduling policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from autotune.cli.common import JsonOption, err, fail, progress_bar
from autotune.errors import InputError

__all__ = ["learned_policies", "train_policy", "tune_policy"]

# Options train-policy and tune-policy share: where training episodes come from.
TraceOption = Annotated[
    Path | None,
    typer.Option(help="Alibaba v2023 pod list to train on (default: synthetic jobs)."),
]
NodesOption = Annotated[Path | None, typer.Option(help="Alibaba node list (with --trace).")]
TrainPodsOption = Annotated[
    str, typer.Option(help="START:STOP pods (creation order) episodes are drawn from.")
]
WindowOption = Annotated[int, typer.Option(min=1, help="Consecutive pods per episode.")]


def _range(text: str) -> tuple[int, int | None]:
    start, _, stop = text.partition(":")
    try:
        return int(start or 0), int(stop) if stop else None
    except ValueError:
        fail(f"--train-pods {text!r}: expected START:STOP, e.g. 1000:7000")


def train_policy(
    out: Annotated[Path, typer.Option(help="Checkpoint folder to write.", show_default=False)],
    algo: Annotated[str, typer.Option(help="Algorithm (ppo).")] = "ppo",
    iterations: Annotated[int, typer.Option(min=1, help="Training iterations.")] = 50,
    trace: TraceOption = None,
    nodes: NodesOption = None,
    train_pods: TrainPodsOption = "1000:",
    window: WindowOption = 60,
    pollux_workload: Annotated[
        list[Path] | None,
        typer.Option(help="Pollux workload CSV(s) to train on as well; repeat the option."),
    ] = None,
    pollux_gpus: Annotated[int, typer.Option(min=4, help="T4 GPUs for Pollux episodes.")] = 64,
    pollux_compat: Annotated[
        bool,
        typer.Option(
            help="Train in the Pollux-compatible mode on the --pollux-workload files, each "
            "played whole (measured physics, Pollux's clock and knobs; the action is every "
            "job's weight in the goodput allocation, the reward minus job-hours). Serve it "
            "with autotune eval --pollux-compat --policy-checkpoint."
        ),
    ] = False,
    pollux_traces: Annotated[
        Path | None,
        typer.Option(
            help="Pollux traces folder for --pollux-compat (default: traces/ beside the "
            "workloads' folder)."
        ),
    ] = None,
    size_exponent: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="--pollux-compat: the teacher goodput-size's exponent (a job's weight is "
            "(remaining time / 1 h)^-exponent).",
        ),
    ] = 0.5,
    fairness_p: Annotated[
        float,
        typer.Option(
            max=-1e-9,
            help="--pollux-compat: the goodput allocation's p (Pollux's -1), for the teacher "
            "and the policy; saved beside the module.",
        ),
    ] = -1.0,
    stream: Annotated[
        bool,
        typer.Option(
            help="Also train on the daemon's default world: its simulated cluster and "
            "built-in job stream."
        ),
    ] = False,
    slots: Annotated[
        int | None,
        typer.Option(
            min=1, help="Job slots of the training env [default: 16; 32 --pollux-compat]."
        ),
    ] = None,
    round_s: Annotated[
        float,
        typer.Option(
            "--round-s",
            min=1.0,
            help="Decision round period (simulated s); serve the policy with the same "
            "--round-s (--pollux-compat: Pollux's 60 s).",
        ),
    ] = 300.0,
    max_steps: Annotated[
        int | None,
        typer.Option(
            min=1, help="Rounds per episode at most [default: 128; 5000 --pollux-compat]."
        ),
    ] = None,
    energy_weight: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Reward given up per kWh (default: the energy_weight setting, 0.05).",
        ),
    ] = None,
    warm_start: Annotated[
        str | None,
        typer.Option(
            help="Imitate this baseline before PPO: oracle, rules or none (--pollux-compat: "
            "goodput-size or none) [default: oracle; goodput-size --pollux-compat]."
        ),
    ] = None,
    warm_start_episodes: Annotated[
        int, typer.Option(min=1, help="Teacher episodes for imitation.")
    ] = 12,
    forecast: Annotated[
        bool,
        typer.Option(help="The demand LSTM's forecast in the observation (else none)."),
    ] = True,
    lr: Annotated[float, typer.Option(min=0.0, help="Learning rate.")] = 3e-4,
    entropy_coeff: Annotated[float, typer.Option(min=0.0, help="Entropy bonus.")] = 0.003,
    train_batch: Annotated[int, typer.Option(min=16, help="Env steps per iteration.")] = 512,
    hidden: Annotated[int, typer.Option(min=4, help="Network width.")] = 64,
    checkpoint_every: Annotated[int, typer.Option(min=1, help="Iterations per checkpoint.")] = 10,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    as_json: JsonOption = False,
) -> None:
    """Train a scheduling policy with RLlib PPO.

    The cluster environment's observation carries the LSTM demand forecast. Episodes are
    windows of Alibaba pods (--trace/--nodes) and Pollux workloads (--pollux-workload),
    or synthetic jobs. RLlib checkpoints go under OUT (iter_NNNN/ and final/); the
    RLModule that serving loads is final/learner_group/learner/rl_module/default_policy.
    """
    if algo != "ppo":
        fail(f"--algo {algo!r}: only ppo is supported")
    if (trace is None) != (nodes is None):
        fail("--trace and --nodes go together")
    teachers = ("goodput-size", "none") if pollux_compat else ("oracle", "rules", "none")
    warm_start = warm_start or teachers[0]
    if warm_start not in teachers:
        mode = " with --pollux-compat" if pollux_compat else ""
        fail(f"--warm-start {warm_start!r}{mode}: {', '.join(teachers)}")
    if pollux_compat:
        if not pollux_workload:
            fail("--pollux-compat needs at least one --pollux-workload")
        if trace is not None or stream:
            fail("--pollux-compat trains on Pollux workloads only (not --trace or --stream)")
    elif pollux_traces is not None:
        fail("--pollux-traces is for --pollux-compat")
    slots = slots or (32 if pollux_compat else 16)
    max_steps = max_steps or (5000 if pollux_compat else 128)
    if pollux_gpus % 4:
        fail(f"--pollux-gpus {pollux_gpus}: Pollux nodes have 4 GPUs each")
    for path in (trace, nodes, *(pollux_workload or [])):
        if path is not None and not path.is_file():
            fail(f"{path}: no such file")
    from autotune.envs.presets import POLLUX_ROUND_S
    from autotune.policies.ppo import PPOSettings, TraceSource, train_ppo

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
            )
        )
    for workload in pollux_workload or []:
        if pollux_compat:
            folder = pollux_traces or workload.resolve().parent.parent / "traces"
            if not folder.is_dir():
                fail(f"{folder}: no Pollux traces folder (--pollux-traces)")
            sources.append(
                TraceSource(
                    kind="pollux-compat",
                    jobs=str(workload.resolve()),
                    gpus=pollux_gpus,
                    traces=str(folder.resolve()),
                    round_s=POLLUX_ROUND_S,
                    weight=1.0 / len(pollux_workload or [1]),
                )
            )
            continue
        sources.append(
            TraceSource(
                kind="pollux",
                jobs=str(workload.resolve()),
                gpus=pollux_gpus,
                window=window,
                round_s=round_s,
                weight=1.0 / len(pollux_workload or [1]),
            )
        )
    if stream:
        sources.append(
            TraceSource(
                kind="stream",
                jobs="",
                window=window,
                round_s=round_s,
                weight=1.0,
            )
        )
    if energy_weight is None:
        from autotune.daemon.settings import load_settings

        energy_weight = load_settings().energy_weight
    settings = PPOSettings(
        iterations=iterations,
        slots=slots,
        round_s=POLLUX_ROUND_S if pollux_compat else round_s,
        max_steps=max_steps,
        energy_weight=energy_weight,
        forecast=forecast,
        lr=lr,
        entropy_coeff=entropy_coeff,
        train_batch=train_batch,
        minibatch=min(128, train_batch),
        hidden=hidden,
        warm_start=None if warm_start == "none" else warm_start,
        warm_start_episodes=warm_start_episodes,
        size_exponent=size_exponent,
        fairness_p=fairness_p,
        seed=seed,
        sources=tuple(sources),
    )
    progress = progress_bar(
        "training PPO",
        "iter {task.completed}/{task.total}  return {task.fields[ret]}",
        enabled=not as_json,
    )
    with progress:
        task = progress.add_task("train", total=iterations, ret="-")

        def update(i: int, _n: int, row: dict[str, float]) -> None:
            progress.update(task, completed=i, ret=f"{row['episode_return_mean']:.2f}")

        try:
            report: dict[str, Any] = train_ppo(
                settings, out, checkpoint_every=checkpoint_every, progress=update
            )
        except ValueError as exc:
            fail(str(exc))
    if as_json:
        typer.echo(json.dumps(report, default=str))
    else:
        last = report["history"][-1]
        err.print(
            f"wrote {report['checkpoint']} after {iterations} iterations "
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
    knobs: str = "all",
) -> dict[str, Any]:
    """Factories ``(env, seed) -> Policy`` for the ``eval`` policies that are not
    baselines. The checkpoint is loaded at the first episode of each seed; a bad one (or
    one trained for the other ``knobs``) is an ``InputError`` before any episode runs."""
    factories: dict[str, Any] = {}
    if "ppo" in names:
        import torch

        from autotune.policies.serving import LearnedPolicy, PolicyServer, PolluxLearnedPolicy

        torch.set_num_threads(1)
        if knobs == "pollux" and checkpoint is None:
            raise InputError(
                "ppo in the Pollux-compatible mode needs --policy-checkpoint: a policy "
                "trained there (autotune train-policy --pollux-compat); the shipped one "
                "acts in the default world"
            )
        server = PolicyServer(checkpoint, slots=slots, knobs=knobs)  # raises if it does not fit

        def ppo(env: Any, seed: int, forecast: str = "lstm") -> Any:
            if knobs == "pollux":
                return PolluxLearnedPolicy(env, server, forecast=forecast)
            return LearnedPolicy(slots=slots, round_s=round_s, server=server, forecast=forecast)

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
    slots: Annotated[int, typer.Option(min=1, help="Job slots of the training env.")] = 16,
    round_s: Annotated[
        float, typer.Option("--round-s", min=1.0, help="Decision round period (simulated s).")
    ] = 300.0,
    max_steps: Annotated[int, typer.Option(min=1, help="Rounds per episode at most.")] = 128,
    warm_start: Annotated[
        str, typer.Option(help="Imitate this baseline before every trial: oracle, rules, none.")
    ] = "none",
    warm_start_episodes: Annotated[
        int, typer.Option(min=1, help="Teacher episodes for imitation.")
    ] = 12,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
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
    from autotune.policies.ppo import PPOSettings, TraceSource
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
    with err.status("searching", spinner="dots") if not as_json else _nothing():
        try:
            report = search(settings, out, samples=samples, grace=grace, concurrent=concurrent)
        except ValueError as exc:
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


def _nothing() -> Any:
    from contextlib import nullcontext

    return nullcontext()
