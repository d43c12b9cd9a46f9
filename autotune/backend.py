"""The two small interfaces the daemon is assembled from at start-up.

A ``Backend`` is the cluster: it reports state and applies decisions (the simulated
cluster in ``autotune.envs``; Ray actors in ``autotune.executor``). A ``Policy`` chooses
each job's configuration (``autotune.policies``). The daemon knows only these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from autotune.core import Decision, DecisionSource, JobConfig, JobSpec, NodeInfo, Placement

__all__ = ["Backend", "ClusterSnapshot", "JobState", "JobStatus", "Policy", "PolicyChoice"]

JobState = Literal["pending", "running", "finished", "failed", "cancelled"]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStatus:
    spec: JobSpec
    state: JobState
    config: JobConfig | None = None
    placement: Placement | None = None
    progress: float = 0.0
    """Fraction of the job's work done, 0 to 1."""
    samples_per_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSnapshot:
    time_s: float
    """The backend's clock, in seconds."""
    nodes: Sequence[NodeInfo]
    jobs: Sequence[JobStatus]
    telemetry: str
    """Where the figures come from: ``simulator``, ``nvml``, ``psutil``, ``ray``."""
    gpu_utilization: float = 0.0
    """Allocated share of the cluster's GPU capacity, 0 to 1."""

    def by_state(self, *states: JobState) -> list[JobStatus]:
        return [j for j in self.jobs if j.state in states]


@runtime_checkable
class Backend(Protocol):
    name: str

    def observe(self) -> ClusterSnapshot:
        """The cluster now (advancing a simulated clock by one tick)."""
        ...

    def apply(self, decisions: Sequence[Decision]) -> None:
        """Start or reconfigure jobs as decided. Decisions without a placement are
        ignored."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyChoice:
    config: JobConfig
    reason: str
    """Why, in words a user reads in the decision log."""
    features: Mapping[str, float] = field(default_factory=dict)
    """The inputs that mattered, by name."""
    source: DecisionSource = "policy"
    """``fallback`` when a policy could not decide and another one did (see the reason)."""


@runtime_checkable
class Policy(Protocol):
    name: str
    version: str

    def decide(self, snapshot: ClusterSnapshot) -> dict[str, PolicyChoice]:
        """A configuration for every job to (re)configure; jobs left out keep theirs."""
        ...
