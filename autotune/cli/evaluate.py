"""``autotune eval``: replay a trace in the simulator under several policies and compare
them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from autotune.cli.common import (
    JsonOption,
    TenantsOption,
    field_docs,
    print_policy_table,
    print_tenant_table,
    runs_progress,
    user_errors,
)
from autotune.cli.policy import learned_policies
from autotune.errors import InputError
from autotune.rl.environment import EVALUATION, EnvConfig

__all__ = ["eval_policies"]

_EVAL = EVALUATION
_DOC = field_docs(EnvConfig)


@user_errors
def eval_policies(
    nodes: Annotated[
        Path | None, typer.Option(help="Alibaba v2023 node list (with --jobs).")
    ] = None,
    jobs: Annotated[Path | None, typer.Option(help="Alibaba v2023 pod list.")] = None,
    pollux_workload: Annotated[
        Path | None, typer.Option(help="Pollux workload CSV (name,time,application,...).")
    ] = None,
    philly_jobs: Annotated[
        Path | None, typer.Option(help="Philly-style job list (timestamp,duration,num_gpus).")
    ] = None,
    gpus: Annotated[
        int, typer.Option(min=1, help="Cluster size for Pollux (4 T4 per node) or Philly (8 P100).")
    ] = 64,
    cluster_file: Annotated[
        Path | None,
        typer.Option(
            "--cluster-file",
            help="A cluster file (autotune cluster describe, or written by hand): replay on "
            "its nodes instead of the trace's (--nodes) or the --gpus preset.",
        ),
    ] = None,
    limit_jobs: Annotated[int | None, typer.Option(min=1, help="Replay the first N jobs.")] = None,
    skip_jobs: Annotated[
        int, typer.Option(min=0, help="Leave out the first N jobs (before --limit-jobs).")
    ] = 0,
    policies: Annotated[
        str,
        typer.Option(
            help="Comma-separated: static, rules (the daemon's), random, oracle, tiresias "
            "(least attained service, preemptive), ppo (the learned policy, as the daemon "
            "serves it), tune (per-job trial search)."
        ),
    ] = "static,rules,oracle",
    policy_checkpoint: Annotated[
        Path | None, typer.Option(help="RLModule checkpoint for ppo (default: the one shipped).")
    ] = None,
    tune_budget_s: Annotated[
        float, typer.Option(min=0.0, help="Simulated trial time per job for tune (s).")
    ] = 1800.0,
    tune_charge: Annotated[
        bool,
        typer.Option(help="tune: the trial time delays each job (--no-tune-charge: free)."),
    ] = True,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per policy.")] = 3,
    slots: Annotated[int, typer.Option(min=1, help=_DOC.get("slots"))] = _EVAL.slots,
    round_s: Annotated[
        float, typer.Option("--round-s", min=1.0, help=_DOC.get("round_s"))
    ] = _EVAL.round_s,
    restart_s: Annotated[
        float, typer.Option("--restart-s", min=0.0, help=_DOC.get("restart_s"))
    ] = _EVAL.restart_s,
    trace_seed: Annotated[
        int, typer.Option(help="Seed of model assignment to trace jobs and of --tenants' draw.")
    ] = 0,
    tenants: TenantsOption = None,
    forecast: Annotated[
        str,
        typer.Option(
            help="Comma-separated forecasters (lstm, persistence, none) behind the learned "
            "policy's forecast features and the 'forecast' provisioning; more than one runs "
            "the ablation (a row per forecaster)."
        ),
    ] = "lstm",
    provisioning: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated provisioning modes to compare (none: every node on; "
            "buffer: keep powered what persistence + buffer's 95% quantile of the next "
            "hour's demand needs; forecast: what --forecast's quantile needs). Parked "
            "nodes draw nothing; idle rounds are played so idle energy counts."
        ),
    ] = None,
    wake_s: Annotated[float, typer.Option(min=0.0, help=_DOC.get("wake_s"))] = _EVAL.wake_s,
    mix_gpu_models: Annotated[
        bool,
        typer.Option(
            help="One data-parallel job may run across GPU models where no one model has "
            "room and the performance model says that beats its best model's free GPUs "
            "alone (batch shares by speed)."
        ),
    ] = _EVAL.mix_models,
    drawn_sensitivity: Annotated[
        bool,
        typer.Option(
            help="Each job trains at a compression sensitivity drawn from the one measured "
            "over real tasks (autotune.perf.sensitivity) while the policies price "
            "compression by the catalog, as on a real cluster; default: every job at the "
            "catalog's."
        ),
    ] = _EVAL.drawn_sensitivity,
    as_json: JsonOption = False,
) -> None:
    """Replay a trace in the simulated cluster the daemon runs, through the daemon's
    decision step, under several policies (same jobs and seeds), and compare job
    completion time, makespan, goodput, GPU utilisation and energy. --provisioning
    compares parking idle nodes by a demand forecast; --forecast ablates the forecast.
    --tenants shares the cluster between tenants with quotas and reports, per tenant, its
    jobs' average JCT, its GPU time against its quota, its quota attainment and its time
    waiting for its quota."""
    from autotune.envs import traces
    from autotune.envs.presets import philly_nodes, pollux_nodes
    from autotune.envs.tenants import draw_tenants, parse_tenant_shares, quota_tenants
    from autotune.envs.traces import load_nodes
    from autotune.envs.workloads import jobs_from_trace
    from autotune.policies.baselines import BASELINES
    from autotune.policies.evaluate import evaluate_policies

    sources = [x is not None for x in (jobs, pollux_workload, philly_jobs)]
    if sum(sources) != 1:
        raise InputError("give one trace: --nodes/--jobs, --pollux-workload or --philly-jobs")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    known = [*BASELINES, "ppo", "tune"]
    unknown = [p for p in names if p not in known]
    if unknown or not names:
        raise InputError(f"unknown policy {unknown}; known: {', '.join(known)}")
    from autotune.policies.forecast import FORECASTS
    from autotune.provisioning import PROVISIONING

    forecasts = [f.strip() for f in forecast.split(",") if f.strip()]
    if not forecasts or any(f not in FORECASTS for f in forecasts):
        raise InputError(f"--forecast {forecast!r}: comma-separated, of {', '.join(FORECASTS)}")
    modes = [m.strip() for m in (provisioning or "").split(",") if m.strip()]
    if provisioning is not None and (not modes or any(m not in PROVISIONING for m in modes)):
        raise InputError(
            f"--provisioning {provisioning!r}: comma-separated, of {', '.join(PROVISIONING)}"
        )
    shares = parse_tenant_shares(tenants) if tenants is not None else None
    if jobs is not None:
        if nodes is None:
            raise InputError("--jobs needs --nodes")
        node_list = load_nodes(nodes)
        limit = None if limit_jobs is None else skip_jobs + limit_jobs
        trace = traces.alibaba_jobs(jobs, seed=trace_seed, limit=limit)[skip_jobs:]
        info: dict[str, Any] = {"kind": "alibaba", "path": str(jobs)}
    elif pollux_workload is not None:
        node_list = pollux_nodes(gpus)
        trace = _window(traces.pollux_workload(pollux_workload), skip_jobs, limit_jobs)
        info = {"kind": "pollux", "path": str(pollux_workload)}
    else:
        assert philly_jobs is not None
        node_list = philly_nodes(gpus)
        trace = _window(traces.philly_jobs(philly_jobs, seed=trace_seed), skip_jobs, limit_jobs)
        info = {"kind": "philly", "path": str(philly_jobs)}
    if cluster_file is not None:
        from autotune.catalog.clusters import load_cluster

        node_list = list(load_cluster(cluster_file).nodes)
        info["cluster_file"] = str(cluster_file)
    total = sum(n.gpu_count for n in node_list)
    too_big = [t.job_id for t in trace if t.num_gpus > total]
    if too_big:
        raise InputError(
            f"{len(too_big)} job(s) ask for more than the {total} GPUs, e.g. {too_big[0]}"
        )
    if not trace:
        raise InputError("no jobs left to replay (--skip-jobs/--limit-jobs)")
    sim_jobs = jobs_from_trace(_rebase(trace))
    tenant_specs = quota_tenants(shares, sum(n.gpu_count for n in node_list)) if shares else ()
    if shares:
        sim_jobs = draw_tenants(sim_jobs, shares, seed=trace_seed)
        info["tenant_seed"] = trace_seed
    extra = learned_policies(
        names,
        checkpoint=policy_checkpoint,
        slots=slots,
        round_s=round_s,
        budget_s=tune_budget_s,
        charge=tune_charge,
    )
    if "ppo" in names:
        info["policy_checkpoint"] = str(policy_checkpoint or "shipped")
    if "tune" in names:
        info["tune_budget_s"] = tune_budget_s
        info["tune_charge"] = tune_charge
    total = len(names) * seeds * max(1, len(modes)) * len(forecasts)
    with runs_progress(total, enabled=not as_json) as advance:
        report = evaluate_policies(
            nodes=node_list,
            jobs=sim_jobs,
            policies=names,
            seeds=seeds,
            slots=slots,
            round_s=round_s,
            restart_s=restart_s,
            trace=info,
            extra=extra,
            forecasts=forecasts,
            provisioning=modes,
            wake_s=wake_s,
            mix_models=mix_gpu_models,
            drawn_sensitivity=drawn_sensitivity,
            tenants=tenant_specs,
            progress=advance,
        )
    if as_json:
        typer.echo(json.dumps(report))
        return
    out = Console()
    out.print(
        f"{report['trace']['jobs']} jobs on {report['trace']['gpus']} GPUs, "
        f"{seeds} seed(s); means over seeds"
    )
    print_policy_table(
        out,
        report["policies"],
        [
            ("avg JCT s", "avg_jct_s", "10.0f"),
            ("p99 JCT s", "p99_jct_s", "10.0f"),
            ("makespan s", "makespan_s", "11.0f"),
            ("goodput", "goodput", "8.2f"),
            ("GPU util", "gpu_util", "8.1%"),
            ("kWh", "energy_kwh", "8.1f"),
            ("idle kWh", "idle_energy_kwh", "8.1f"),
            ("done", "n_jobs_done", "6.0f"),
        ],
        min_width=10,
    )
    if shares:
        print_tenant_table(out, report["policies"])


def _window(trace: list[Any], skip: int, limit: int | None) -> list[Any]:
    return trace[skip:] if limit is None else trace[skip : skip + limit]


def _rebase(trace: list[Any]) -> list[Any]:
    """Submission times from the first kept job (after --skip-jobs)."""
    from dataclasses import replace

    origin = min(t.submit_s for t in trace)
    return [replace(t, submit_s=t.submit_s - origin) for t in trace] if origin else trace
