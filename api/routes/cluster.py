from __future__ import annotations

from fastapi import APIRouter, Request

from autotune.api.deps import TelemetryDep, in_session
from autotune.api.schemas import ClusterPublic, HostPublic, NodePublic
from autotune.core import MILLI_PER_GPU
from autotune.db import repository as repo

router = APIRouter(prefix="/cluster", tags=["cluster"])


@router.get("", response_model=ClusterPublic)
async def get_cluster(telemetry: TelemetryDep, request: Request) -> ClusterPublic:
    """Nodes (lost ones too, marked ``lost``), what running jobs hold on them, jobs per
    state, and live readings of the hardware (NVML, psutil, Ray's state API: whichever
    the daemon chose)."""
    sources = request.app.state.host_telemetry
    records, placements, jobs = await in_session(
        request,
        lambda session: (
            repo.node_records(session=session),
            repo.running_placements(session=session),
            request.app.state.job_counts.read(session),
        ),
    )
    allocated: dict[str, int] = {}
    for placement in placements.values():
        for slot in placement.ranks:
            allocated[slot.node_id] = allocated.get(slot.node_id, 0) + slot.gpu_milli
    public = [
        NodePublic(
            node_id=n.node_id,
            backend_node_id=n.backend_node_id or None,
            gpu_model=n.gpu_model,
            gpu_count=n.gpu_count,
            gpus_allocated=allocated.get(n.node_id, 0) / MILLI_PER_GPU,
            gpu_memory_bytes=n.gpu_memory_bytes,
            cpu_milli=n.cpu_milli,
            memory_mib=n.memory_mib,
            state=record.state,
            lost_at=record.lost_at,
        )
        for record in records
        for n in (record.info,)
    ]
    return ClusterPublic(
        telemetry=telemetry,
        telemetry_sources=[telemetry, *(source.name for source in sources)],
        hosts=[HostPublic(source=source.name, readings=source.read()) for source in sources],
        gpus_total=sum(n.gpu_count for n in public if n.state == "alive"),
        gpus_allocated=sum(p.gpus_allocated for p in public),
        jobs=jobs,
        nodes=public,
    )
