"""Readers of public cluster traces: jobs to replay and cluster-load series.

| module | readers | trace |
|---|---|---|
| ``alibaba`` | ``alibaba_jobs``, ``load_nodes``, ``load_pods`` | Alibaba GPU v2023 (ATC'23) |
| ``pollux`` | ``pollux_workload`` | Pollux workloads (OSDI'21) |
| ``philly`` | ``philly_jobs`` | Philly-style job lists |
| ``helios`` | ``helios_load``, ``helios_demand`` | Helios per-minute cluster load (SC'21) |

Every file is CSV (``.csv`` or ``.csv.gz``) read through ``autotune.csvfile``: an error
names the file, the row (the header is row 1) and the column. Jobs of traces that name no
model get one from ``assign_model`` (``jobs``).
"""

from autotune.envs.traces.alibaba import PodTrace, alibaba_jobs, load_nodes, load_pods
from autotune.envs.traces.helios import DemandSeries, LoadSeries, helios_demand, helios_load
from autotune.envs.traces.jobs import MODEL_TIERS, TraceJob, assign_model
from autotune.envs.traces.philly import philly_jobs
from autotune.envs.traces.pollux import POLLUX_APPLICATIONS, pollux_workload

__all__ = [
    "MODEL_TIERS",
    "POLLUX_APPLICATIONS",
    "DemandSeries",
    "LoadSeries",
    "PodTrace",
    "TraceJob",
    "alibaba_jobs",
    "assign_model",
    "helios_demand",
    "helios_load",
    "load_nodes",
    "load_pods",
    "philly_jobs",
    "pollux_workload",
]
