"""The history's cluster (its GPUs, taken and freed) and its jobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.benchmarks.history.settings import NODE_GPUS
from autotune.benchmarks.history.templates import Template
from autotune.core import (
    JobSpec,
    NodeInfo,
)
from autotune.db.tables import (
    JobRow,
)

# --- the cluster ----------------------------------------------------------------------


class Cluster:
    """Free GPUs per node; a job gets whole GPUs on one node (8 or fewer) or whole
    nodes (more)."""

    def __init__(self, nodes: list[NodeInfo]) -> None:
        self.names = [n.node_id for n in nodes]
        self.free: list[list[int]] = [list(range(NODE_GPUS)) for _ in nodes]
        self.by_free: list[set[int]] = [set() for _ in range(NODE_GPUS + 1)]
        self.by_free[NODE_GPUS] = set(range(len(nodes)))
        self.total = NODE_GPUS * len(nodes)
        self.held = 0

    def _set(self, node: int, free: list[int]) -> None:
        self.by_free[len(self.free[node])].discard(node)
        self.free[node] = free
        self.by_free[len(free)].add(node)

    def take(self, gpus: int) -> list[tuple[int, int]] | None:
        """``gpus`` free GPUs (best fit), or ``None``."""
        if gpus > NODE_GPUS:
            if len(self.by_free[NODE_GPUS]) < gpus // NODE_GPUS:
                return None
            chosen = sorted(self.by_free[NODE_GPUS])[: gpus // NODE_GPUS]
            for node in chosen:
                self._set(node, [])
            self.held += gpus
            return [(node, g) for node in chosen for g in range(NODE_GPUS)]
        for count in range(gpus, NODE_GPUS + 1):
            if self.by_free[count]:
                node = min(self.by_free[count])
                free = self.free[node]
                self._set(node, free[gpus:])
                self.held += gpus
                return [(node, g) for g in free[:gpus]]
        return None

    def grow(self, held: list[tuple[int, int]], gpus: int) -> list[tuple[int, int]] | None:
        """``held`` and more GPUs of the same node, up to ``gpus``, where that node has them."""
        node = held[0][0]
        more = gpus - len(held)
        if gpus > NODE_GPUS or any(n != node for n, _ in held) or len(self.free[node]) < more:
            return None
        free = self.free[node]
        self._set(node, free[more:])
        self.held += more
        return sorted(held + [(node, g) for g in free[:more]])

    def give(self, gpus: list[tuple[int, int]]) -> None:
        for node, gpu in gpus:
            self._set(node, sorted([*self.free[node], gpu]))
        self.held -= len(gpus)


# --- jobs -----------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Job:
    spec: JobSpec
    model: str
    task: dict[str, Any]
    fate: str
    wish: int
    """GPUs it asks for."""
    options: list[int]
    work: float
    """Samples at statistical efficiency 1 left to do."""
    total_work: float
    state: str = "pending"
    gpus: list[tuple[int, int]] = field(default_factory=list)
    template: Template | None = None
    since_s: float = 0.0
    """When its current configuration started to make progress (after a restart)."""
    generation: int = 0
    """Counts its decisions: a finish event of an earlier configuration is stale."""
    override_id: int | None = None
    nan_events: int = 0
    row: JobRow | None = None
    """Kept so the repository finds the job's row in the session instead of reading it."""

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    def progress_at(self, now_s: float) -> float:
        done = self.total_work - self.work
        if self.template is not None and self.state == "running":
            done += self.template.goodput * max(0.0, now_s - self.since_s)
        return min(1.0, max(0.0, done / self.total_work)) if self.total_work > 0 else 0.0


@dataclass(slots=True)
class Counters:
    decisions: int = 0
    resizes: int = 0
    others_before: int = 0
    """Decisions other than resizes before the current span (to pace the resizes)."""
    in_tick: int = 0
    utilization_sum: float = 0.0
    utilization_n: int = 0
