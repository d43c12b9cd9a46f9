"""The dashboard at ``/``: a map of the cluster (nodes by GPUs, each GPU coloured by the
job holding it; lost nodes, and how many nodes provisioning parked), each tenant's GPUs
held against its quota (above it, borrowing), the jobs with their state, why they wait,
their configuration, progress and JCT or age, the active and the shadow policy side by
side, the overrides in force, the cluster's GPU demand next to its capacity and the
demand forecast (the 15-minute peak band, aligned at the end of the window it forecasts,
and the arrival probabilities), goodput per job, a timeline of decisions by source (a
shadow policy's too) with each decision's explanation on click, and, when a shadow
policy ran, its agreement with the active one and both rounds' predicted goodput.

One refresh of the page is a handful of reads: ``GET /api/v1/dashboard`` (below: what
no other route gives, as the GPUs each job holds and every job's current configuration),
``/jobs``, ``/policies``, ``/overrides?active=true`` and, while a shadow policy runs,
``/policies/shadow``; a decision's explanation is read when it is opened. Plotly's
JavaScript is served from the installed ``plotly`` package, so the page needs no network
beyond the daemon."""

from __future__ import annotations

from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse, HTMLResponse
from sqlalchemy.orm import Session

from autotune.api.deps import ReaderDep, SessionDep, every_tenant
from autotune.api.routes.forecast import MAX_MINUTES, read_demand_window
from autotune.api.routes.jobs import event_public
from autotune.api.routes.tenants import read_tenants
from autotune.api.schemas import (
    DashboardCluster,
    DashboardDecision,
    DashboardGpuHold,
    DashboardJobConfig,
    DashboardNode,
    DashboardPublic,
)
from autotune.core import MILLI_PER_GPU, Placement, utc_now
from autotune.daemon.forecast import CAPACITY_METRIC
from autotune.daemon.lifecycle import SHADOW_METRICS
from autotune.db import repository as repo
from autotune.demand import HORIZONS, QUANTILES, DemandForecaster
from autotune.serde import to_json

router = APIRouter(tags=["dashboard"])

JOBS_SHOWN = 100
"""Jobs the page's table lists (``GET /api/v1/jobs?limit=100``, newest first): the
configurations sent are those of these jobs and of every running one."""

PROVISIONING_METRICS = (
    CAPACITY_METRIC,
    "nodes_parked",
    "provisioning_target_gpus",
    "provisioning_recommended_park",
)

_PAGE = (Path(__file__).parent.parent / "static" / "dashboard.html").read_text()


def _plotly_js() -> Path:
    path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    if not path.is_file():
        raise HTTPException(status_code=404, detail="plotly.min.js not found in the plotly package")
    return path


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def dashboard_page() -> HTMLResponse:
    return HTMLResponse(_PAGE)


@router.get("/static/plotly.min.js", include_in_schema=False)
def plotly_js() -> FileResponse:
    return FileResponse(
        _plotly_js(),
        media_type="text/javascript",
        headers={"Cache-Control": "public, max-age=86400"},
    )


@router.get("/api/v1/dashboard", tags=["dashboard"], response_model=DashboardPublic)
def dashboard_data(
    session: SessionDep,
    request: Request,
    reader: ReaderDep,
    samples: Annotated[int, Query(ge=2, le=5000)] = 300,
    minutes: Annotated[
        int, Query(ge=1, le=MAX_MINUTES, description="Minutes of GPU demand shown")
    ] = 180,
) -> Response:
    """The dashboard's figures in one response: ``demand`` over the newest ``minutes``
    minutes, the rest over the newest ``samples`` ticks; the cluster map (``cluster``:
    every GPU's holders) and the current configuration of the running and the newest
    jobs (``configs``), which no other route gives; and the tenants' use against their
    quotas (``tenants``, as ``GET /tenants``, from the same placements as the map).
    With ``reads=tenant``, an admin's token only (it shows every tenant's jobs)."""
    every_tenant(reader)
    forecasters: tuple[DemandForecaster, ...] = request.app.state.forecasters
    # One sample more than shown: a tick's decisions are committed just before its
    # sample, so the window's decisions are those after the sample before it.
    ticks = repo.list_metrics(session=session, names=["gpu_utilization"], limit=samples + 1)
    since = ticks[0].recorded_at if len(ticks) > samples else None
    rows = repo.list_decision_rows(session=session, since=since, limit=500).rows
    # A shadow policy's decisions have a page of their own: they never crowd out the
    # decisions taken.
    shadow_rows = repo.list_decision_rows(
        session=session, source="shadow", since=since, limit=500
    ).rows
    rows = sorted([*rows, *shadow_rows], key=lambda row: int(row["id"]), reverse=True)
    demand = _demand(session, forecasters, minutes)
    placements = repo.running_placements(session=session)
    body = DashboardPublic(
        generated_at=utc_now(),
        predictor=demand["predictor"],
        demand=demand,
        goodput=_per_job(session, "job_goodput", since),
        # Measured on each step where jobs train for real (--backend ray); tokens/s where
        # the task says its sequence length.
        throughput={
            unit: _per_job(session, f"job_{unit}", since)
            for unit in ("samples_per_s", "tokens_per_s")
        },
        # Training quality, measured as the jobs train (autotune.executor.quality).
        quality={
            name: _per_job(session, f"job_{name}", since)
            for name in ("loss", "noise_scale", "compression_cosine")
        },
        decisions=[
            DashboardDecision(
                id=row["id"],
                at=row["decided_at"].isoformat(),
                job_id=row["job_id"],
                source=row["source"],
                policy_version=row["policy_version"],
                override_id=row["override_id"],
                reason=row["reason"][:200],
            )
            for row in reversed(rows)
        ],
        events=[event_public(e) for e in repo.recent_job_events(session=session, since=since)],
        jobs=request.app.state.job_counts.read(session),
        shadow=_shadow(session, since, samples),
        cluster=_cluster(session, placements, ticks[-1].recorded_at if ticks else None),
        configs=_configs(session, placements),
        tenants=read_tenants(session, placements),
    )
    # Serialised once (as ``GET /decisions`` does), not dumped and re-validated.
    return Response(body.model_dump_json(), media_type="application/json")


def _cluster(
    session: Session, placements: dict[str, Placement], at: datetime | None
) -> DashboardCluster:
    """Every node the daemon recorded with the ranks of running jobs on its GPUs, and the
    newest tick's capacity and provisioning figures (parked and waking nodes are among
    the nodes, with their state)."""
    held: dict[str, list[DashboardGpuHold]] = {}
    for job_id, placement in sorted(placements.items()):
        for slot in placement.ranks:
            held.setdefault(slot.node_id, []).append(
                DashboardGpuHold(
                    gpu_index=slot.gpu_index,
                    job_id=job_id,
                    rank=slot.rank,
                    gpu_milli=slot.gpu_milli,
                )
            )
    nodes = [
        DashboardNode(
            node_id=record.info.node_id,
            gpu_model=record.info.gpu_model,
            gpu_count=record.info.gpu_count,
            state=record.state,
            lost_at=record.lost_at,
            held=sorted(held.get(record.info.node_id, []), key=lambda h: (h.gpu_index, h.rank)),
        )
        for record in repo.node_records(session=session)
    ]
    latest: dict[str, float] = {}
    if at is not None:  # one tick's samples share their time
        for sample in repo.list_metrics(session=session, names=PROVISIONING_METRICS, since=at):
            if sample.recorded_at == at:
                latest[sample.name] = sample.value

    def count(name: str) -> int | None:
        value = latest.get(name)
        return None if value is None else round(value)

    return DashboardCluster(
        nodes=nodes,
        gpus_total=sum(n.gpu_count for n in nodes if n.state == "alive"),
        gpus_held=sum(h.gpu_milli for hs in held.values() for h in hs) / MILLI_PER_GPU,
        at=at,
        capacity_gpus=latest.get(CAPACITY_METRIC),
        nodes_parked=count("nodes_parked"),
        provisioning_target_gpus=latest.get("provisioning_target_gpus"),
        provisioning_recommended_park=count("provisioning_recommended_park"),
    )


def _configs(session: Session, placements: dict[str, Placement]) -> dict[str, DashboardJobConfig]:
    """The newest decision taken of each running job and of the ``JOBS_SHOWN`` newest
    jobs: their configuration, the GPUs and nodes it placed them on, who decided it."""
    newest = repo.list_jobs(session=session, limit=JOBS_SHOWN).rows
    job_ids = {*placements, *(record.spec.job_id for record in newest)}
    configs: dict[str, DashboardJobConfig] = {}
    for job_id, record in repo.latest_decision_records(session=session, job_ids=job_ids).items():
        decision = record.decision
        assert decision.decision_id is not None
        placement = decision.placement
        ranks = () if placement is None else placement.ranks
        configs[job_id] = DashboardJobConfig(
            decision_id=decision.decision_id,
            source=decision.source,
            policy_version=decision.policy_version,
            override_id=record.override_id,
            decided_at=decision.decided_at,
            preempt=decision.preempt,
            gpus=0.0 if placement is None else placement.gpus,
            nodes=sorted({slot.node_id for slot in ranks}),
            config=to_json(decision.config),
        )
    return configs


def _demand(
    session: Session, forecasters: tuple[DemandForecaster, ...], minutes: int
) -> dict[str, Any]:
    """GPU demand per minute (GPUs), the cluster's capacity, the band of the 15-minute
    peak forecast and the arrival probabilities. A band point at minute t is the forecast
    made at t - 15 for the peak over (t - 15, t], so the demand at t stays under its q95
    when the forecast covers; its last 15 points are the forecast ahead of now. The
    arrival probabilities are shown at the minute they were made."""
    data = read_demand_window(session, forecasters, minutes=minutes)
    window = data.window
    horizon = HORIZONS[0]
    quantiles = window.quantiles.get(horizon, [])
    return {
        "predictor": window.predictor,
        "fallback_reasons": window.failures,
        "capacity_gpus": window.capacity,
        "at": [t.isoformat() for t in data.at],
        "demand_gpus": window.demand,
        "band": {
            "horizon_min": horizon,
            "at": [(t + timedelta(minutes=horizon)).isoformat() for t in data.at],
            **{
                f"q{round(100 * level)}": [q[j] for q in quantiles]
                for j, level in enumerate(QUANTILES)
            },
        },
        "p_arrival": {str(h): window.p_arrival.get(h, []) for h in HORIZONS},
        "coverage95": {
            str(h): window.coverage(h, 0.95) if window.demand else None for h in HORIZONS
        },
    }


def _shadow(session: Session, since: datetime | None, samples: int) -> dict[str, Any]:
    """Per shadowed tick in the window: the agreement with the active policy and both
    rounds' predicted goodput (empty lists when no shadow ran), and the shadow now."""
    _active, shadow = repo.policy_state(session=session)
    series: dict[str, Any] = {"version": shadow.version if shadow is not None else None}
    for key, name in zip(
        ("agreement", "shadow_goodput", "active_goodput"), SHADOW_METRICS, strict=True
    ):
        points = repo.list_metrics(session=session, names=[name], since=since, limit=samples)
        series[key] = {
            "at": [p.recorded_at.isoformat() for p in points],
            "value": [p.value for p in points],
        }
    return series


def _per_job(
    session: Session, name: str, since: datetime | None
) -> dict[str, dict[str, list[Any]]]:
    """One line per job of the metric ``name``: ``{"at": [...], "value": [...]}``."""
    lines: dict[str, dict[str, list[Any]]] = {}
    for sample in repo.list_metrics(session=session, names=[name], since=since, limit=20_000):
        if sample.job_id is None:
            continue
        line = lines.setdefault(sample.job_id, {"at": [], "value": []})
        line["at"].append(sample.recorded_at.isoformat())
        line["value"].append(sample.value)
    return lines
