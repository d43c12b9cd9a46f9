"""The learned policy of the Sia-compatible world: how PPO trains it there and how it
serves, as in the Pollux-compatible world (``autotune.studies.pollux.learned``) with
Sia's heterogeneity-aware goodput optimiser in place of Pollux's.

Its action is every slot job's log2 weight in ``SiaGoodputPolicy``'s allocation (which
picks each job's GPU type, count and batch); for a residual policy (the default here)
the log2 correction of the weight its teacher ``sia-goodput`` gives it at its size
exponent, so the zero action is the teacher. ``WORLD`` plugs this world into PPO's
training (entry point ``autotune.worlds`` ``sia-compat``): a ``sia-compat`` source is a
Sia workload CSV (``jobs``) played whole on Sia's default cluster, its jobs elastic, with
``traces`` the artifact's ``sia-simulator`` folder. ``SiaLearnedPolicy`` serves a module
trained here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from autotune.interfaces import ClusterSnapshot
from autotune.policies.ppo_settings import PPOSettings, TraceSource
from autotune.policies.serving import PolicyServer
from autotune.studies.pollux.env import PolluxCompatEnv, WeightedAllocation
from autotune.studies.pollux.learned import PolluxLearnedPolicy, PolluxWorld
from autotune.studies.sia.goodput import FAIRNESS_P, SiaGoodputPolicy
from autotune.studies.sia.world import ROUND_S, sia_arrivals, sia_env

__all__ = ["QUANTUM", "WORLD", "SiaCompatEnv", "SiaLearnedPolicy", "SiaWorld"]

QUANTUM: Final = 0.05
"""The step of an action entry (log2 of a weight's factor, 2^0.05: about 3.5%) unless the
``quantum`` option says another: what imitating zero leaves (a few thousandths) rounds
to zero, what PPO learns (tenths) does not."""


def _allocation(env: Any, p: float, residual_exponent: float | None) -> SiaGoodputPolicy:
    """Sia's goodput allocation at fairness ``p``; weighted at ``residual_exponent``
    where a residual policy corrects its weights (else every job weighs 1)."""
    return SiaGoodputPolicy(env, p=p, exponent=residual_exponent or 0.0)


def _base(
    allocation: WeightedAllocation | None,
    residual_exponent: float | None,
    snapshot: ClusterSnapshot,
) -> dict[str, float] | None:
    """The weights a residual policy's action corrects (the allocation's own), else
    ``None``."""
    if residual_exponent is None:
        return None
    assert isinstance(allocation, SiaGoodputPolicy)
    return allocation.weights(snapshot)


class SiaCompatEnv(PolluxCompatEnv):
    """A ``ClusterEnv`` of Sia's world (``sia_env``) whose action is every slot job's log2
    weight in ``SiaGoodputPolicy``'s allocation at fairness ``fairness_p``; with
    ``residual_exponent``, the log2 correction of the weight ``SiaGoodputPolicy`` gives
    the job at that exponent (zero: the teacher). Its reward is minus the round's
    job-hours, as in the Pollux-compatible world.

    Entries are rounded to ``quantum`` (``QUANTUM``): the optimiser's greedy steps
    compare equal terms of alike jobs, so a correction of a thousandth (what imitating
    zero leaves) would reorder them; rounded, an imitation of the teacher is the
    teacher."""

    quantum: float | None = QUANTUM

    def make_allocator(self) -> WeightedAllocation:
        return _allocation(self.cluster, self.fairness_p, self.residual_exponent)

    def base(self, snapshot: ClusterSnapshot) -> dict[str, float] | None:
        return _base(self.allocator, self.residual_exponent, snapshot)


class SiaWorld(PolluxWorld):
    """The Sia-compatible world as PPO's training sees it (``autotune.policies.ppo.World``):
    see the module docstring. Options: ``fairness_p`` (Sia's goodput allocation's p),
    ``size_exponent`` (the teacher's), ``residual`` (1, the default: the action corrects
    the teacher's weights; 0: it sets them)."""

    kind = "sia-compat"
    teachers = ("sia-goodput",)
    options: Mapping[str, float] = MappingProxyType(
        {"fairness_p": FAIRNESS_P, "size_exponent": 0.0, "residual": 1.0, "quantum": QUANTUM}
    )

    def make_env(self, source: TraceSource, settings: PPOSettings, forecaster: Any) -> SiaCompatEnv:
        if source.traces is None:
            raise ValueError(f"{source.jobs}: a sia-compat source needs Sia's sia-simulator folder")
        cluster = sia_env(
            sia_arrivals(source.jobs, source.traces, elastic=True),
            round_s=ROUND_S,
            slots=settings.slots,
            max_steps=settings.max_steps,
            forecaster=forecaster,
        )
        env = SiaCompatEnv(
            cluster,
            fairness_p=self.option(settings, "fairness_p"),
            residual_exponent=self.residual_exponent(settings),
        )
        env.quantum = self.option(settings, "quantum")
        return env

    def saved(self, settings: PPOSettings) -> dict[str, Any]:
        return {**super().saved(settings), "quantum": self.option(settings, "quantum")}

    def teacher(self, cluster: Any, settings: PPOSettings) -> SiaGoodputPolicy:
        return SiaGoodputPolicy(
            cluster,
            p=self.option(settings, "fairness_p"),
            exponent=self.option(settings, "size_exponent"),
        )


WORLD: Final = SiaWorld()
"""The world the ``autotune.worlds`` entry point ``sia-compat`` names."""


class SiaLearnedPolicy(PolluxLearnedPolicy):
    """The learned policy of the Sia-compatible world: the module's mean log2 weight (or
    correction of the teacher's) for every active job, through ``SiaGoodputPolicy``'s
    allocation with the fairness p, exponent and quantum saved beside the module, as in
    training.
    ``env``: the environment's ``ClusterEnv`` (``sia_env``). Version:
    ``ppo-sia-<checkpoint hash>``."""

    version_prefix = "ppo-sia"
    world = "sia-compat"
    default_p = FAIRNESS_P

    def __init__(
        self, env: Any, server: PolicyServer, *, forecast: str = "lstm", every_job: bool = True
    ) -> None:
        super().__init__(env, server, forecast=forecast, every_job=every_job)
        self.quantum = float(self.saved.get("quantum", QUANTUM))

    def make_allocator(self, env: Any) -> WeightedAllocation:
        return _allocation(env, self.fairness_p, self.residual_exponent)

    def base(self, snapshot: ClusterSnapshot) -> dict[str, float] | None:
        return _base(self.allocator, self.residual_exponent, snapshot)
