"""What a PPO training run is: its settings (``PPOSettings``), where its episodes come
from (``TraceSource``) and, for a study's world, the plug-in that builds them
(``World``). One definition of each setting with its default, which
``autotune train-policy`` builds its options from. Light to import: no torch, Ray or
Gymnasium (``autotune.policies.ppo`` trains)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

import numpy as np

from autotune.core import DEFAULT_ENERGY_WEIGHT, DEFAULT_RESTART_S

if TYPE_CHECKING:
    import gymnasium as gym

__all__ = [
    "DEFAULT_WORLD_KINDS",
    "WORLDS_GROUP",
    "Demonstrations",
    "PPOSettings",
    "TraceSource",
    "World",
    "world",
]


@dataclass(frozen=True, slots=True)
class TraceSource:
    """Episodes drawn from a trace: windows of ``window`` consecutive jobs whose first
    job is in ``[start, stop)`` (submission order), re-timed to start at 0.

    ``kind="alibaba"``: ``jobs`` is an Alibaba v2023 pod list and ``nodes`` its node
    list. ``kind="pollux"``: ``jobs`` is a Pollux workload CSV, on ``gpus`` T4 GPUs (4
    per node) as the Pollux testbed. ``kind="stream"``: the daemon's default world (its
    cluster and built-in job stream), ``window`` jobs per episode; ``jobs`` is unused.
    ``kind="replay"``: ``jobs`` is a replay export folder (``autotune replay export``):
    its cluster and the jobs its log saw (``autotune.envs.workloads.load_workload``).
    ``kind="cluster"``: a user's cluster: ``nodes`` is its cluster file (``autotune
    cluster describe``, with its calibration if ``autotune calibrate --cluster-file`` ran)
    and ``jobs`` the built-in tasks its users train, comma-separated (``NAME``,
    ``NAME:N`` or ``NAME:LO-HI`` devices, as ``task_mix`` reads them): the built-in
    stream's arrivals of those tasks (``autotune.envs.workloads.task_mix``), ``window``
    per episode, on the cluster's nodes, with the calibration's device and coefficients.
    ``kind="clusters"``: clusters no one named: ``DRAWN_CLUSTERS`` of
    ``autotune.envs.presets.drawn_cluster`` (16 to 512 GPUs, mixes of GPU models, link
    speeds), each with the built-in job stream at a load drawn per episode; ``window``
    jobs per 32 GPUs; ``jobs`` is unused.

    Any other kind names a study's world (a ``World`` among the ``autotune.worlds``
    entry points: ``pollux-compat``, ``autotune.studies.pollux``), which builds the
    episodes' environment itself. Every source of one training must then be of that
    kind: a study's action space differs from the default world's."""

    jobs: str
    kind: str = "alibaba"
    nodes: str | None = None
    gpus: int = 64
    start: int = 0
    stop: int | None = None
    window: int = 60
    round_s: float = 300.0
    trace_seed: int = 0
    traces: str | None = None
    """A study's world: the folder of measurements it plays (the Pollux-compatible
    world's traces folder)."""
    weight: float = 1.0
    """Share of episodes drawn from this source, relative to the others."""
    tenants: str | None = None
    """Tenants sharing the cluster (an ``alibaba``, ``pollux`` or ``replay`` source):
    their shares as ``autotune eval --tenants`` reads them (``vision=50,nlp=30``), each
    a quota of its share of the GPUs (``autotune.envs.tenants``). Half the source's
    episodes share the cluster, each one's jobs drawn to the tenants afresh, the decision
    step enforcing the quotas; the other half have no quotas, as the daemon's default
    cluster, so that the policy knows both."""


@dataclass(frozen=True, slots=True)
class PPOSettings:
    """One training run of ``train_ppo``: one definition of every setting and its
    default, which ``autotune train-policy`` builds its options from."""

    iterations: int = 50
    """PPO iterations (each ``train_batch`` environment steps)."""
    checkpoint_every: int = 10
    """Iterations between two checkpoints (``iter_NNNN``; ``final`` always)."""
    slots: int = 16
    """Job slots of the training environment (the policy's weights are shared across
    slots, so it may serve more)."""
    round_s: float = 300.0
    """Decision round period of the synthetic and trace episodes (simulated s); serve the
    policy with the same."""
    max_steps: int = 128
    """Rounds per episode at most."""
    restart_s: float = DEFAULT_RESTART_S
    """Seconds a reconfiguration costs a job in the training episodes (the observation's
    ``restart`` feature)."""
    restart_s_max: float | None = None
    """With it, each episode's reconfiguration cost is drawn log-uniform between
    ``restart_s`` and this, so that the policy learns to weigh a change against what it
    costs on the cluster that serves it; ``None``: ``restart_s`` in every episode."""
    forecast: bool = True
    """The shipped demand LSTM fills the observation's forecast features (else none:
    no arrival expected, headroom from demand now)."""
    lr: float = 3e-4
    """Adam's learning rate."""
    entropy_coeff: float = 0.003
    """PPO's entropy bonus."""
    train_batch: int = 512
    """Environment steps per iteration."""
    minibatch: int = 128
    """Steps per gradient step (at most ``train_batch``)."""
    epochs: int = 6
    """Passes over each iteration's steps."""
    gamma: float = 0.97
    """Discount per round."""
    hidden: int = 64
    """Width of the shared per-slot network."""
    pooled: bool = False
    """Each slot's policy also reads a summary of every job (``SlotPolicyModule``'s
    ``pooled``: a mean over the slots), not only its own features and the cluster's."""
    reward_scale: float = 0.1
    """Rewards are multiplied by this before PPO sees them."""
    energy_weight: float = DEFAULT_ENERGY_WEIGHT
    """Normalized goodput the reward gives up per kWh (the daemon's ``energy_weight``)."""
    drawn_sensitivity: bool = False
    """Each job of the performance model trains at a compression sensitivity drawn from the
    one measured over real tasks (``EnvConfig.drawn_sensitivity``), where the policy sees
    the catalog's price, as on a real cluster; else every job at the catalog's."""
    warm_start: str | None = "oracle"
    """Teacher baseline for behaviour cloning before PPO (``None``: from scratch): a
    baseline of ``autotune.policies.baselines`` (``oracle``, ``rules``), or one of a
    study's world's ``World.teachers``."""
    warm_start_episodes: int = 12
    """Teacher episodes to imitate."""
    warm_start_epochs: int = 60
    """Passes over the teacher's steps."""
    init_module: str | None = None
    """An RLModule (or algorithm) checkpoint of a ``SlotPolicyModule`` with ``hidden``
    units that PPO starts from instead of a fresh module; with ``warm_start`` too, the
    imitation of the teacher starts from it."""
    env_runners: int = 0
    """Processes sampling episodes beside the learner, each with its own environments (0:
    the learner's process samples). Up to one per core: sampling is most of an
    iteration's time, and it splits across them."""
    envs_per_runner: int = 1
    """Environments each sampler steps in turn (a vector of them; RLlib's
    ``num_envs_per_env_runner``)."""
    seed: int = 0
    sources: tuple[TraceSource, ...] = ()
    """Where episodes come from; empty: synthetic job streams (``autotune/Cluster-v0``)."""
    world_options: dict[str, float] = field(default_factory=dict)
    """Options of the study's world the sources name (``World.options``: the
    Pollux-compatible world's ``fairness_p`` and ``size_exponent``); empty in the
    default world."""

    def __post_init__(self) -> None:
        for name in (
            "iterations",
            "checkpoint_every",
            "slots",
            "max_steps",
            "train_batch",
            "minibatch",
            "epochs",
            "hidden",
            "warm_start_episodes",
            "warm_start_epochs",
            "envs_per_runner",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"PPOSettings.{name}={getattr(self, name)!r}: must be >= 1")
        if self.env_runners < 0:
            raise ValueError(f"PPOSettings.env_runners={self.env_runners!r}: must be >= 0")
        if self.minibatch > self.train_batch:
            raise ValueError(
                f"PPOSettings.minibatch={self.minibatch} is more than train_batch="
                f"{self.train_batch}"
            )
        if not self.restart_s >= 0:
            raise ValueError(f"PPOSettings.restart_s={self.restart_s!r}: must be >= 0")
        if self.restart_s_max is not None and not self.restart_s_max >= self.restart_s > 0:
            raise ValueError(
                f"PPOSettings.restart_s_max={self.restart_s_max!r}: must be >= restart_s="
                f"{self.restart_s!r} > 0"
            )
        if not 0 < self.gamma <= 1:
            raise ValueError(f"PPOSettings.gamma={self.gamma!r}: must be in (0, 1]")


Demonstrations = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""A teacher's episodes as training data: observations, the teacher's actions, a mask of
the slots whose action the teacher set, and the discounted return from each step on."""


@runtime_checkable
class World(Protocol):
    """A study's world that PPO can train in: sources of its ``kind`` play there. Found
    among the ``autotune.worlds`` entry points by kind, so training's worker processes
    find it too."""

    kind: str
    teachers: tuple[str, ...]
    """The teachers ``warm_start`` may name; the first is the default."""
    options: Mapping[str, float]
    """Its options and their defaults (``PPOSettings.world_options``)."""

    def make_env(
        self, source: TraceSource, settings: PPOSettings, forecaster: Any
    ) -> gym.Env[np.ndarray, np.ndarray]:
        """The environment of one source's episodes."""
        ...

    def demonstrations(
        self, settings: PPOSettings, envs: Sequence[Any], teacher: str, episodes: int
    ) -> Demonstrations:
        """The teacher's episodes in ``envs`` (the sources' environments)."""
        ...

    def save_beside(self, module: Path, settings: PPOSettings) -> None:
        """Write what serving needs beside a trained module (its allocation, ...)."""
        ...


def world(kind: str) -> World | None:
    """The study's world of ``kind`` (``None`` for the default world's kinds)."""
    if kind in DEFAULT_WORLD_KINDS:
        return None
    for entry in entry_points(group=WORLDS_GROUP):
        if entry.name == kind:
            found = entry.load()
            if not isinstance(found, World):
                raise TypeError(f"entry point {entry.value}: not a World")
            return found
    known = [*DEFAULT_WORLD_KINDS, *(e.name for e in entry_points(group=WORLDS_GROUP))]
    raise ValueError(f"source kind {kind!r}: one of {', '.join(known)}")


DEFAULT_WORLD_KINDS: Final = ("alibaba", "pollux", "stream", "replay", "cluster", "clusters")
"""Source kinds played in the default world."""
WORLDS_GROUP: Final = "autotune.worlds"
"""The entry-point group under which studies register their worlds."""
