"""``autotune plan``: place the GPU pods of a cluster trace on its nodes with the Planner."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from autotune.cli.common import JsonOption, fail, progress_bar, user_errors
from autotune.errors import InputError

__all__ = ["plan"]


@user_errors
def plan(
    nodes: Annotated[
        Path, typer.Option(help="Alibaba v2023 node list (.csv or .csv.gz).", show_default=False)
    ],
    jobs: Annotated[
        Path, typer.Option(help="Alibaba v2023 pod list (.csv or .csv.gz).", show_default=False)
    ],
    limit: Annotated[
        int | None, typer.Option(min=1, help="Take only the first N GPU pods by creation time.")
    ] = None,
    strategy: Annotated[
        str,
        typer.Option(help="hungarian (decision rounds of linear assignment) or first-fit."),
    ] = "hungarian",
    round_size: Annotated[
        int, typer.Option("--round-size", min=1, help="Placement units per decision round.")
    ] = 256,
    as_json: JsonOption = False,
) -> None:
    """Place the GPU pods of a trace, as one queue of pending work, on its nodes.

    Pods go in creation order; each must fit on one node, whole. Prints the assignment
    of every rank to a node and GPU, the pods left unplaced with the reason, and the
    solve time.
    """
    from autotune.envs.traces import load_nodes, load_pods
    from autotune.planner import first_fit, verify_placements
    from autotune.planner import plan as run_plan

    if strategy not in ("hungarian", "first-fit"):
        raise InputError(f"--strategy {strategy!r}: use hungarian or first-fit")
    node_list = load_nodes(nodes)
    trace = load_pods(jobs, limit=limit)
    with progress_bar("placing", "{task.completed}/{task.total} pods", enabled=not as_json) as bar:
        task = bar.add_task("plan", total=len(trace.jobs))
        if strategy == "first-fit":
            result = first_fit(trace.jobs, node_list, {})
        else:
            result = run_plan(
                trace.jobs,
                node_list,
                {},
                round_size=round_size,
                progress=lambda done, _total: bar.update(task, completed=done),
            )
    problems = verify_placements(trace.jobs, node_list, result.placements)
    if problems:  # a Planner bug, not bad input: say so loudly
        fail(f"invalid assignment (a Planner bug): {problems[0]}", code=1)
    report: dict[str, Any] = {
        "assignments": [
            {
                "job": job.job_id,
                "rank": slot.rank,
                "node": slot.node_id,
                "gpu": slot.gpu_index,
                "gpu_milli": slot.gpu_milli,
            }
            for job in trace.jobs
            if (placement := result.placements.get(job.job_id)) is not None
            for slot in placement.ranks
        ],
        "unplaced": [
            {"job": job.job_id, "reason": result.unplaced[job.job_id]}
            for job in trace.jobs
            if job.job_id in result.unplaced
        ],
        "skipped_cpu_only": trace.skipped_cpu_only,
        "solve_s": round(result.solve_s, 3),
        "strategy": strategy,
        "placed": len(result.placements),
        "rounds": result.rounds,
    }
    if as_json:
        typer.echo(json.dumps(report))
        return
    _print_plan_summary(report, total=len(trace.jobs))


def _print_plan_summary(report: dict[str, Any], *, total: int) -> None:
    out = Console()
    out.print(
        f"[bold]{report['placed']}[/] of {total} GPU pods placed with {report['strategy']} "
        f"in {report['solve_s']:.1f} s ({report['rounds']} rounds); "
        f"{len(report['unplaced'])} unplaced; {report['skipped_cpu_only']} CPU-only pods skipped."
    )
    reasons = Counter(u["reason"].split(";")[0] for u in report["unplaced"])
    for reason, count in reasons.most_common():
        out.print(f"  {count:5d}  {reason}")
