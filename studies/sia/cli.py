"""``autotune sia ...``: the Sia-compatible world from the command line.

- ``eval``: play a Sia workload as Sia's simulator does (its three-type cluster, each
  job on its GPU type's measured traces, its clock and restart costs) under the shared
  baseline (``fifo``), the goodput optimiser (``goodput``) or a policy trained in this
  world (``ppo``, ``--policy-checkpoint``), and report the average job completion time,
  and each job's with ``--json``.

Registered under the ``autotune.commands`` entry points; the ``autotune`` command line
finds it there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from autotune.cli.common import JsonOption, user_errors
from autotune.errors import InputError

__all__ = ["app"]

app = typer.Typer(
    help="The Sia-compatible world (Sia, SOSP'23): its heterogeneous cluster and workloads "
    "on each GPU type's measured physics, its clock and restart costs.",
    no_args_is_help=True,
)


@app.command("eval")
@user_errors
def eval_command(
    workload: Annotated[
        Path, typer.Option(help="Sia workload CSV (name,time,application,num_replicas,...).")
    ],
    sia: Annotated[
        Path | None,
        typer.Option(
            help="Sia's sia-simulator folder (its traces/ are read; default: the one that "
            "holds the workload as workloads/<set>/<file>, as in the artifact).",
            show_default=False,
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option(min=1.0, help="Seconds between scheduling rounds (Sia's default).")
    ] = 60.0,
    policy: Annotated[
        str,
        typer.Option(
            help="fifo: first come, first served on the fastest GPU type with room, each "
            "job rigid on its num_replicas GPUs and batch (the baseline Sia's simulator "
            "also runs); goodput: every job elastic, its GPU type, count and batch "
            "re-chosen every round by the heterogeneity-aware goodput optimiser; ppo: a "
            "policy trained in this world (bench/sia_learned.py), elastic jobs, its "
            "weights through the optimiser (needs --policy-checkpoint)."
        ),
    ] = "fifo",
    policy_checkpoint: Annotated[
        Path | None,
        typer.Option(help="The trained module --policy ppo plays.", show_default=False),
    ] = None,
    mix_gpu_types: Annotated[
        bool,
        typer.Option(
            "--mix-gpu-types",
            help="Beyond Sia's world: a data-parallel job may run across two GPU types, "
            "each rank's batch share by its type's speed (--policy goodput only).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Play a Sia workload as Sia's simulator does (its cluster, each job on its GPU
    type's measured traces, 60 s rounds, each application's restart cost) under a policy;
    the world has no noise."""
    from autotune.studies.sia.fidelity import POLICIES, play
    from autotune.studies.sia.world import ROUND_S

    if policy not in (*POLICIES, "ppo"):
        raise InputError(f"--policy {policy!r}: one of {', '.join(POLICIES)}, ppo")
    if not workload.is_file():
        raise InputError("no such workload file", path=str(workload))
    if policy == "ppo" and interval != ROUND_S:
        raise typer.BadParameter(
            f"a policy trained in Sia's world decides every {ROUND_S:.0f} s, as it trained",
            param_hint="--interval",
        )
    if (policy == "ppo") != (policy_checkpoint is not None):
        raise typer.BadParameter(
            "--policy ppo plays the module at --policy-checkpoint, and only it takes one",
            param_hint="--policy-checkpoint",
        )
    if mix_gpu_types and policy != "goodput":
        raise typer.BadParameter(
            "only the goodput optimiser splits a job across GPU types", param_hint="--policy"
        )
    folder = sia or workload.resolve().parent.parent.parent
    if policy_checkpoint is None:
        result = play(workload, folder, round_s=interval, policy=policy, mix=mix_gpu_types)
    else:
        from autotune.policies.serving import PolicyServer
        from autotune.studies.sia.learned import SiaLearnedPolicy

        server = PolicyServer(policy_checkpoint, slots=32, continuous=True)

        def chosen(env: Any) -> SiaLearnedPolicy:
            return SiaLearnedPolicy(env, server)

        result = play(workload, folder, round_s=interval, policy=chosen)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    typer.echo(
        f"{workload.name}: {result['finished']}/{result['jobs']} jobs finished, average JCT "
        f"{result['avg_jct_h']:.3f} h, {result['restarts']} restarts ({result['wall_s']} s)"
        + (
            f", {result['mixed_gpu_rounds']:.1%} of busy GPU-rounds across types"
            if mix_gpu_types
            else ""
        )
    )
