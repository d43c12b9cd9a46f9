"""The history's settings: the cluster, the jobs' mix and fates, what is sampled, the
defaults of ``bench/history.py``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from autotune.core import (
    NodeInfo,
    PrecisionMap,
)
from autotune.envs.presets import default_nodes
from autotune.envs.simulator import SimConfig, SimulatedCluster

BACKEND: Final = SimulatedCluster.name
"""The backend the history is of: its name labels the metrics and is the jobs' origin."""
NODE_GPUS: Final = 8
GPU_WEIGHTS: Final = {1: 4.0, 2: 4.0, 4: 3.0, 8: 2.0, 16: 1.0}
"""How often a job wants each GPU count (among those within its bounds)."""
DECISIONS_PER_JOB: Final = 10.0
"""Mean decisions per job (its start, resizes, overrides): sets the arrival rate."""
OFFERED_LOAD: Final = 0.75
"""Share of the GPUs the jobs would keep busy at the sizes they ask for and the speed
of the rules' configuration: sets their durations."""
DURATION_SIGMA: Final = 1.0
"""Of the log-normal job durations."""
RESTART_S: Final = SimConfig().restart_s
SLOTS: Final = 32
"""Queued jobs considered each tick (the learned policy's slots)."""
FATES: Final = (("finished", 0.92), ("failed", 0.03), ("cancelled", 0.05))
FAIL_REASONS: Final = (
    "the training process ran out of GPU memory",
    "diverged: loss NaN after 3 rollbacks to the last checkpoint",
    "the training process exited with status 1",
)
CANCELLED: Final = "cancelled on request"
OVERRIDE_SHARE: Final = 0.03
OVERRIDE_DELETED: Final = 1 / 3
PINS: Final[tuple[tuple[dict[str, Any], str], ...]] = (
    ({"precision": PrecisionMap.uniform("fp32").as_dict()}, "fp32 while a loss spike is studied"),
    ({"compression": {"kind": "none"}}, "dense gradients for an accuracy comparison"),
    ({"layout": {"activation_checkpointing": True}}, "memory headroom for a longer context"),
)
FALLBACK_ERRORS: Final = (
    "TimeoutError: the policy did not answer within 10 s",
    "OSError: [Errno 24] Too many open files",
    "RuntimeError: policy module state does not match its checkpoint",
)
TRANSITION_SHARE: Final = 1 / 200
PLACEHOLDER_OVERRIDE: Final = 1
DEFAULT_DAYS: Final = 30.0
DEFAULT_GPUS: Final = 512
DEFAULT_TICK_S: Final = 2.0
DEFAULT_DECISIONS_PER_DAY: Final = 35_000
DEFAULT_JOB_METRICS_EVERY: Final = 600
DEFAULT_CLUSTER_METRICS_EVERY: Final = 10
_A100: Final = next(n for n in default_nodes() if n.gpu_model == "A100")


def cluster_nodes(gpus: int) -> list[NodeInfo]:
    """``gpus / 8`` nodes: the simulated cluster's 8-GPU A100 node, renamed."""
    if gpus < NODE_GPUS or gpus % NODE_GPUS or _A100.gpu_count != NODE_GPUS:
        raise ValueError(f"--cluster-gpus {gpus}: a multiple of {NODE_GPUS} (8-GPU nodes)")
    return [replace(_A100, node_id=f"a100-{i}") for i in range(gpus // NODE_GPUS)]
