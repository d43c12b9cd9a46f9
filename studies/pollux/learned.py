"""The learned policy of the Pollux-compatible world: how PPO trains it there and how it
serves.

Its action is every slot job's log2 weight in the goodput allocation
(``autotune.studies.pollux.env``); the policy network is the default world's
(``autotune.policies.ppo.SlotPolicyModule``, a Gaussian per slot). ``WORLD`` plugs this
world into PPO's training (``autotune.policies.ppo.World``, entry point
``autotune.worlds`` ``pollux-compat``): the sources' environments, the teacher
``goodput-size`` (``SizedGoodputPolicy``) to imitate first, and the allocation saved
beside every module (``ALLOCATION_FILE``: its fairness p, so that serving allocates as
training did). ``PolluxLearnedPolicy`` serves a module trained here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Protocol

import numpy as np

from autotune.interfaces import ClusterSnapshot, PolicyRound
from autotune.policies.ppo import DemonstrationRecorder, TeacherRound
from autotune.policies.ppo_settings import Demonstrations, PPOSettings, TraceSource
from autotune.policies.serving import IncompatiblePolicyError, PolicyServer, checkpoint_hash
from autotune.rl.observation import ObservationEncoder, round_slots, slot_jobs
from autotune.studies.pollux.env import (
    PolluxCompatEnv,
    WeightedAllocation,
    allocator,
    base_weights,
    compat_env,
    decode_weights,
    encode_weights,
)
from autotune.studies.pollux.goodput import (
    FAIRNESS_P,
    SIZE_EXPONENT,
    GoodputPolicy,
    SizedGoodputPolicy,
)

__all__ = [
    "ALLOCATION_FILE",
    "WORLD",
    "PolluxLearnedPolicy",
    "PolluxWorld",
    "WeightedTeacher",
    "saved_allocation",
]

ALLOCATION_FILE: Final = "allocation.json"
"""Beside a module trained in this world: the goodput allocation its weights act through
(``{"fairness_p": p}``)."""


class PolluxWorld:
    """The Pollux-compatible world as PPO's training sees it (``autotune.policies.ppo.World``):
    a ``pollux-compat`` source is a Pollux workload CSV played whole (``traces``: Pollux's
    traces folder, ``gpus`` T4 GPUs)."""

    kind = "pollux-compat"
    teachers = ("goodput-size",)
    options: Mapping[str, float] = MappingProxyType(
        {"fairness_p": FAIRNESS_P, "size_exponent": SIZE_EXPONENT, "residual": 0.0}
    )
    """``fairness_p``: the goodput allocation's p (Pollux's -1), for the teacher and the
    policy; ``size_exponent``: the teacher ``goodput-size``'s exponent; ``residual``: 1
    for a residual policy, whose action corrects the teacher's weights (log2 of the
    factor; zero is the teacher), 0 for one that sets the weights."""

    def option(self, settings: PPOSettings, name: str) -> float:
        return float(settings.world_options.get(name, self.options[name]))

    def residual_exponent(self, settings: PPOSettings) -> float | None:
        """The teacher's exponent a residual policy corrects, ``None`` for a plain one."""
        if self.option(settings, "residual") == 0:
            return None
        return self.option(settings, "size_exponent")

    def make_env(
        self, source: TraceSource, settings: PPOSettings, forecaster: Any
    ) -> PolluxCompatEnv:
        if source.traces is None:
            raise ValueError(f"{source.jobs}: a pollux-compat source needs the traces folder")
        return compat_env(
            source.jobs,
            source.traces,
            gpus=source.gpus,
            slots=settings.slots,
            max_steps=settings.max_steps,
            forecaster=forecaster,
            fairness_p=self.option(settings, "fairness_p"),
            residual_exponent=self.residual_exponent(settings),
        )

    def demonstrations(
        self, settings: PPOSettings, envs: Sequence[Any], teacher: str, episodes: int
    ) -> Demonstrations:
        """The teacher ``goodput-size``'s episodes, its action every slot job's log2
        weight; each workload is played ``episodes`` times at most (the world has no
        noise: one play of a workload is all there is)."""
        recorder = DemonstrationRecorder(settings)
        for inner in envs[: max(1, episodes)]:
            obs, _ = inner.reset(seed=settings.seed)
            policy = self.teacher(inner.cluster, settings)
            residual = self.residual_exponent(settings) is not None
            recorder.play(
                inner, obs, partial(_weights_round, policy, settings.slots, residual=residual)
            )
        return recorder.arrays()

    def teacher(self, cluster: Any, settings: PPOSettings) -> WeightedTeacher:
        """The teacher of an episode of ``cluster`` (a ``ClusterEnv``)."""
        return SizedGoodputPolicy(
            cluster,
            exponent=self.option(settings, "size_exponent"),
            p=self.option(settings, "fairness_p"),
        )

    def save_beside(self, module: Path, settings: PPOSettings) -> None:
        (module / ALLOCATION_FILE).write_text(json.dumps(self.saved(settings)))

    def saved(self, settings: PPOSettings) -> dict[str, Any]:
        """What serving needs of this world's options (``saved_allocation`` reads it)."""
        return {
            "world": self.kind,
            "fairness_p": self.option(settings, "fairness_p"),
            "residual_exponent": self.residual_exponent(settings),
        }


class WeightedTeacher(WeightedAllocation, Protocol):
    """A teacher whose action is its weights: ``goodput-size``, Sia's ``sia-goodput``."""

    def weights(self, snapshot: ClusterSnapshot) -> dict[str, float]: ...


def _weights_round(
    teacher: WeightedTeacher, slots: int, snapshot: ClusterSnapshot, *, residual: bool
) -> TeacherRound:
    """A round of the teacher ``goodput-size``: its allocation, every slot job's log2
    weight as the action (relative to its own weights for a residual policy: zero),
    every occupied slot in the mask."""
    weights = teacher.weights(snapshot)
    occupied = np.zeros(slots, dtype=np.float32)
    occupied[: len(slot_jobs(snapshot, slots))] = 1.0
    action = encode_weights(weights, snapshot, slots, weights if residual else None)
    return teacher.allocate(snapshot, weights), action, occupied


WORLD: Final = PolluxWorld()
"""The world the ``autotune.worlds`` entry point ``pollux-compat`` names."""


def saved_allocation(
    module: Path, *, world: str = "pollux-compat", default_p: float = FAIRNESS_P
) -> dict[str, Any]:
    """What is saved beside a module trained in ``world`` (``ALLOCATION_FILE``): its
    ``fairness_p`` (``default_p`` if nothing is saved), ``residual_exponent`` (``None``: a
    plain policy) and any other option its world saved. ``IncompatiblePolicyError`` for
    a module another world saved (one saved before worlds were recorded is taken as
    ``world``'s)."""
    saved = module / ALLOCATION_FILE
    data: dict[str, Any] = json.loads(saved.read_text()) if saved.is_file() else {}
    found = data.get("world", world)
    if found != world:
        raise IncompatiblePolicyError(
            f"{module}: trained in the {found} world; this policy serves {world} modules"
        )
    exponent = data.get("residual_exponent")
    return {
        **data,
        "fairness_p": float(data.get("fairness_p", default_p)),
        "residual_exponent": None if exponent is None else float(exponent),
    }


class PolluxLearnedPolicy:
    """The learned policy of the Pollux-compatible world: each round it encodes the
    snapshot with the environment's ``ObservationEncoder``, takes the module's mean log2
    weight for every active job (``decode_weights``) and lets the goodput allocation
    (``GoodputPolicy.allocate``) turn the weights into GPU counts and batch sizes: what
    the training environment does with its action, with the fairness p and, for a
    residual policy, the teacher's exponent saved beside the module (``ALLOCATION_FILE``;
    Pollux's -1 and a plain policy if none). ``env``: the environment's ``ClusterEnv``.
    Version: ``ppo-pollux-<checkpoint hash>``.

    Every active job is the policy's, however many: the module is shared across slots,
    so a round with more active jobs than the slots it trained with is encoded with a
    slot for each (``every_job=False``: only the first ``env.slots``, the others weigh
    1, or the teacher's weight for a residual policy, as in training)."""

    name = "ppo"
    version_prefix = "ppo-pollux"
    world = "pollux-compat"
    """The training world whose modules it serves (``saved_allocation``)."""
    default_p = FAIRNESS_P
    """The fairness p of a module saved without one."""
    quantum: float | None = None
    """As the training environment's (``PolluxCompatEnv.quantum``)."""

    def __init__(
        self, env: Any, server: PolicyServer, *, forecast: str = "lstm", every_job: bool = True
    ) -> None:
        from autotune.policies.forecast import demand_forecaster

        if not server.continuous:
            raise IncompatiblePolicyError(
                "a Pollux-compatible policy acts with a number per slot: "
                "PolicyServer(continuous=True)"
            )
        self.env = env
        self.server = server
        self.every_job = every_job
        self.saved = saved_allocation(server.path, world=self.world, default_p=self.default_p)
        self.fairness_p: float = self.saved["fairness_p"]
        self.residual_exponent: float | None = self.saved["residual_exponent"]
        self.allocator = self.make_allocator(env)
        self.version = f"{self.version_prefix}-{checkpoint_hash(server.path)[:12]}"
        self.encoder = ObservationEncoder(
            env.slots, round_s=env.round_s, forecaster=demand_forecaster(forecast)
        )

    def decide(self, snapshot: ClusterSnapshot) -> PolicyRound:
        slots = round_slots(snapshot, self.encoder.slots, every_job=self.every_job)
        obs = self.encoder.encode(snapshot, slots=slots)
        weights = decode_weights(
            self.server.act(obs), snapshot, slots, self.base(snapshot), quantum=self.quantum
        )
        return PolicyRound(choices=self.allocator.allocate(snapshot, weights))

    def make_allocator(self, env: Any) -> WeightedAllocation:
        """The allocation the module's weights act through, as in training."""
        return allocator(env, self.fairness_p, self.residual_exponent)

    def base(self, snapshot: ClusterSnapshot) -> dict[str, float] | None:
        """The weights the module's action corrects (``None``: it sets them)."""
        assert isinstance(self.allocator, GoodputPolicy)
        return base_weights(self.allocator, snapshot)
