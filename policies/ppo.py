"""PPO for ``ClusterEnv`` on RLlib's new API stack, with the demand forecast (arrival
probabilities and headroom) in the observation.

The network (``SlotPolicyModule``) is shared across job slots: every slot's features
are joined with the cluster-wide ones (``autotune.envs.spaces``) and mapped to that
slot's logits (keep/change, compression, precision, GPUs, layout mode, batch scale,
checkpointing); the value is read from the mean of the
slot embeddings. The same weights therefore act on any number of slots: a policy trained
with 16 slots decides 32 at serving time.

Training (``train_ppo``): optionally the module first imitates a teacher baseline on the
training episodes (behaviour cloning, ``warm_start``), then PPO improves it against the
environment's reward. Episodes are windows of consecutive jobs of a trace (Alibaba pods,
``TraceSource``) or synthetic job streams. Checkpoints are RLlib algorithm checkpoints;
``module_dir`` is the RLModule inside one, which is what serving loads.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch import nn

from autotune.core import TenantSpec
from autotune.envs.cluster_env import ClusterEnv
from autotune.envs.simulator import Arrival
from autotune.envs.tenants import draw_tenants, parse_tenant_shares, quota_tenants
from autotune.interfaces import ClusterSnapshot, Policy, PolicyChoice
from autotune.policies.ppo_settings import (
    DEFAULT_WORLD_KINDS,
    Demonstrations,
    PPOSettings,
    TraceSource,
    World,
    world,
)
from autotune.ray_session import ensure_ray
from autotune.rl.action import ACTION_DIMS, encode_config
from autotune.rl.observation import HEADER, SLOT, slot_jobs

if TYPE_CHECKING:
    from autotune.policies.evaluate import PlayedEnv

GLOBAL_FEATURES: Final = HEADER
SLOT_FEATURES: Final = len(SLOT)

__all__ = [
    "ENV_NAME",
    "MODULE_PATH",
    "DemonstrationRecorder",
    "SlotPolicyModule",
    "TeacherRound",
    "behaviour_clone",
    "discounted",
    "make_train_env",
    "module_dir",
    "train_ppo",
]

ENV_NAME: Final = "autotune-cluster-train"
MODULE_PATH: Final = Path("learner_group") / "learner" / "rl_module" / "default_policy"
"""Where an algorithm checkpoint keeps the RLModule."""
N_LOGITS: Final = sum(ACTION_DIMS)


LOG_STD_INIT: Final = -1.0
"""Initial log standard deviation of a continuous action (a study's world, such as the
Pollux-compatible mode's log2 weights): exploration of about 0.37 around the mean."""


class SlotPolicyModule(TorchRLModule, ValueFunctionAPI):
    """Per-slot shared policy; ``model_config``: ``hidden`` (width, default 64) and
    ``pooled`` (default off).

    With a ``MultiDiscrete`` action space (``ACTION_DIMS`` per slot) each slot gets
    categorical logits; with a ``Box`` of one entry per slot (a study's world, such as
    the Pollux-compatible mode's job weights, ``autotune.studies.pollux.env``) each slot
    gets a Gaussian's mean and log standard deviation.

    ``pooled``: each slot's policy also reads a summary of all the jobs (a deep set: the
    mean over occupied slots of a shared per-slot embedding, ``context``), so that a
    job's choice can depend on the others, and it still acts on any number of slots."""

    def setup(self) -> None:
        config: Any = self.model_config or {}
        hidden = int(config.get("hidden", 64))
        self.pooled = bool(config.get("pooled", False))
        self.continuous = isinstance(self.action_space, gym.spaces.Box)
        n_in = GLOBAL_FEATURES + SLOT_FEATURES
        self.context: nn.Module | None = None
        if self.pooled:
            self.context = nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh())
        self.encoder = nn.Sequential(
            nn.Linear(n_in + (hidden if self.pooled else 0), hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
        )
        self.logits = nn.Linear(hidden, 2 if self.continuous else N_LOGITS)
        # The critic has its own encoder: value-loss gradients must not move the
        # features the policy (possibly imitated from a teacher) acts on.
        self.value_encoder = nn.Sequential(
            nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh()
        )
        self.value = nn.Sequential(
            nn.Linear(hidden + GLOBAL_FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, 1)
        )
        from ray.rllib.core.distribution.torch.torch_distribution import (
            TorchDiagGaussian,
            TorchMultiCategorical,
        )

        nn.init.normal_(self.logits.weight, std=0.01)
        nn.init.zeros_(self.logits.bias)
        if self.continuous:
            self.action_dist_cls: Any = TorchDiagGaussian
            with torch.no_grad():
                self.logits.bias[1] = LOG_STD_INIT
        else:
            nvec = [int(n) for n in getattr(self.action_space, "nvec", ())]
            dist: Any = TorchMultiCategorical
            self.action_dist_cls = dist.get_partial_dist_cls(input_lens=nvec)

    @staticmethod
    def _split(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-slot inputs (B, S, G + F), the global features (B, G), the occupied mask."""
        glob = obs[:, :GLOBAL_FEATURES]
        slots = obs[:, GLOBAL_FEATURES:].reshape(obs.shape[0], -1, SLOT_FEATURES)
        joined = torch.cat([glob[:, None, :].expand(-1, slots.shape[1], -1), slots], dim=-1)
        return joined, glob, slots[:, :, 0]

    @staticmethod
    def _mean(emb: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, S, H) -> (B, H): the mean over the occupied slots."""
        weights = mask[..., None]
        return (emb * weights).sum(1) / weights.sum(1).clamp(min=1.0)

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        joined, _, mask = self._split(batch[Columns.OBS])
        if self.context is not None:
            summary = self._mean(self.context(joined), mask)
            joined = torch.cat([joined, summary[:, None, :].expand(-1, joined.shape[1], -1)], -1)
        emb = self.encoder(joined)
        out = self.logits(emb)
        if self.continuous:  # (B, S, 2) -> means of every slot, then log-stds
            logits = torch.cat([out[..., 0], out[..., 1]], dim=-1)
        else:
            logits = out.reshape(emb.shape[0], -1)
        return {Columns.ACTION_DIST_INPUTS: logits}

    def compute_values(self, batch: dict[str, Any], embeddings: Any | None = None) -> torch.Tensor:
        joined, glob, mask = self._split(batch[Columns.OBS])
        pooled = self._mean(self.value_encoder(joined), mask)
        values: torch.Tensor = self.value(torch.cat([pooled, glob], dim=-1)).squeeze(-1)
        return values

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic actions (B, slots * entries): the most likely value of each
        entry (a continuous action's mean)."""
        logits = self.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
        if self.continuous:
            means: torch.Tensor = logits[:, : logits.shape[1] // 2]
            return means
        return greedy_actions(logits.reshape(obs.shape[0], -1, N_LOGITS))


def greedy_actions(logits: torch.Tensor) -> torch.Tensor:
    """(B, S, logits per slot) -> (B, S * entries) argmax per action entry."""
    parts = torch.split(logits, list(ACTION_DIMS), dim=-1)
    picks = torch.stack([p.argmax(-1) for p in parts], dim=-1)
    return picks.reshape(logits.shape[0], -1)


def _trace(source: TraceSource) -> tuple[list[Any], list[Arrival]]:
    """The nodes and the jobs of a source, in submission order."""
    from autotune.envs import traces
    from autotune.envs.presets import pollux_nodes
    from autotune.envs.traces import load_nodes
    from autotune.envs.workloads import jobs_from_trace

    if source.kind == "alibaba":
        if source.nodes is None:
            raise ValueError("an Alibaba source needs its node list")
        trace = traces.alibaba_jobs(source.jobs, seed=source.trace_seed)
        return load_nodes(source.nodes), jobs_from_trace(trace)
    if source.kind == "pollux":
        nodes = pollux_nodes(source.gpus)
        return nodes, jobs_from_trace(traces.pollux_workload(source.jobs))
    if source.kind == "replay":
        from autotune.envs.workloads import load_workload

        nodes, arrivals, _ = load_workload(source.jobs)
        return list(nodes), sorted(arrivals, key=lambda a: a.spec.submitted_at)
    raise ValueError(f"source kind {source.kind!r}: one of {', '.join(DEFAULT_WORLD_KINDS)}")


def _retimed(arrivals: Sequence[Arrival]) -> list[Arrival]:
    """``arrivals`` with the first one submitted at time 0."""
    from dataclasses import replace

    origin = arrivals[0].spec.submitted_at
    return [
        replace(a, spec=replace(a.spec, submitted_at=a.spec.submitted_at - origin))
        for a in arrivals
    ]


class _Mixture(gym.Env[np.ndarray, np.ndarray]):
    """Episodes from several environments with the same spaces, one drawn per reset;
    rewards scaled by ``scale``; with ``restarts`` (low, high), each episode's
    reconfiguration cost drawn log-uniform between them."""

    def __init__(
        self,
        envs: Sequence[Any],
        weights: Sequence[float],
        scale: float,
        seed: int,
        world: World | None = None,
        restarts: tuple[float, float] | None = None,
    ) -> None:
        self.envs = list(envs)
        self.weights = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
        self.scale = scale
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self.current = self.envs[0]
        self.world = world
        """The study's world the environments play, ``None`` for the default world."""
        self._pick = np.random.default_rng(seed)
        self.restarts = restarts

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None:
            self._pick = np.random.default_rng(seed)
        self.current = self.envs[int(self._pick.choice(len(self.envs), p=self.weights))]
        if self.restarts is not None:
            low, high = np.log(self.restarts)
            options = {**(options or {}), "restart_s": float(np.exp(self._pick.uniform(low, high)))}
        obs, info = self.current.reset(seed=seed, options=options)
        return np.asarray(obs), dict(info)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.current.step(action)
        return obs, float(reward) * self.scale, terminated, truncated, info


def make_train_env(config: dict[str, Any]) -> _Mixture:
    """The training environment of ``config`` (a ``PPOSettings`` as a dict, plus RLlib's
    worker index when RLlib calls it)."""
    settings = _settings_from(config)
    from autotune.policies.forecast import demand_forecaster

    forecaster = demand_forecaster("lstm" if settings.forecast else "none")
    common: dict[str, Any] = {
        "slots": settings.slots,
        "max_steps": settings.max_steps,
        "forecaster": forecaster,
        "energy_weight": settings.energy_weight,
        "drawn_sensitivity": settings.drawn_sensitivity,
        "restart_s": settings.restart_s,
    }
    restarts = (
        None if settings.restart_s_max is None else (settings.restart_s, settings.restart_s_max)
    )
    worker = int(getattr(config, "worker_index", 0)) * 1000 + int(
        getattr(config, "vector_index", 0)
    )
    if not settings.sources:
        env = ClusterEnv(n_jobs=60, round_s=settings.round_s, **common)
        return _Mixture(
            [env], [1.0], settings.reward_scale, settings.seed + worker, restarts=restarts
        )
    worlds = {source.kind: world(source.kind) for source in settings.sources}
    studied = {w.kind for w in worlds.values() if w is not None}
    if studied and len(worlds) > 1:
        raise ValueError(
            f"{', '.join(sorted(studied))} sources cannot be mixed with others: a study's "
            "world acts through an action of its own"
        )
    if studied:
        (found,) = (w for w in worlds.values() if w is not None)
        return _Mixture(
            [found.make_env(s, settings, forecaster) for s in settings.sources],
            [s.weight for s in settings.sources],
            settings.reward_scale,
            settings.seed + worker,
            world=found,
        )
    envs: list[ClusterEnv] = []
    weights: list[float] = []
    for k, source in enumerate(settings.sources):
        if source.kind == "clusters":
            drawn = _drawn_cluster_envs(source, settings.seed, k, worker, common)
            envs.extend(drawn)
            weights.extend([source.weight / len(drawn)] * len(drawn))
            continue
        weights.append(source.weight)
        if source.kind == "stream":
            # The daemon's own world: its default cluster and built-in job stream, a
            # queue of half a window at the start.
            envs.append(
                ClusterEnv(
                    stream=True,
                    n_jobs=source.window,
                    initial_jobs=source.window // 2,
                    mean_interarrival_s=300.0,
                    round_s=source.round_s,
                    **common,
                )
            )
            continue
        if source.kind == "cluster":
            envs.append(
                _cluster_env(source, np.random.default_rng([settings.seed, worker, k]), common)
            )
            continue
        nodes, trace = _trace(source)
        stop = min(source.stop or len(trace), len(trace)) - source.window
        if stop <= source.start:
            stop = source.start + 1
            if source.start + source.window > len(trace):
                raise ValueError(
                    f"{source.jobs}: no window of {source.window} jobs from job {source.start}"
                )
        rng = np.random.default_rng([settings.seed, worker, k])
        shares = parse_tenant_shares(source.tenants) if source.tenants else None

        def jobs(
            shares: dict[str, float] | None,
            trace: list[Arrival] = trace,
            rng: np.random.Generator = rng,
            source: TraceSource = source,
            stop: int = stop,
        ) -> Sequence[Arrival]:
            first = int(rng.integers(source.start, stop))
            window = _retimed(trace[first : first + source.window])
            if shares is None:
                return window
            return draw_tenants(window, shares, seed=int(rng.integers(2**31)))

        # With tenants, half the source's episodes share the cluster between them and
        # half have no quotas (the daemon's default), so the policy knows both.
        variants: list[tuple[dict[str, float] | None, tuple[TenantSpec, ...]]] = [(None, ())]
        if shares is not None:
            gpus = sum(n.gpu_count for n in nodes)
            variants.insert(0, (shares, tuple(quota_tenants(shares, gpus))))
        weights[-1] = source.weight / len(variants)
        weights.extend([weights[-1]] * (len(variants) - 1))
        for episode_shares, tenants in variants:
            envs.append(
                ClusterEnv(
                    nodes=nodes,
                    jobs=partial(jobs, episode_shares),
                    round_s=source.round_s,
                    tenants=tenants,
                    **common,
                )
            )
    return _Mixture(envs, weights, settings.reward_scale, settings.seed + worker, restarts=restarts)


DRAWN_CLUSTERS: Final = 24
"""Clusters a ``clusters`` source draws (``autotune.envs.presets.drawn_cluster``); its
episodes are spread evenly over them."""
DRAWN_LOADS: Final = (0.5, 2.0)
"""The range of a drawn cluster's episode load: job arrivals at this multiple of the
daemon's stream's rate per GPU (300 s between arrivals on its 32 GPUs)."""


def _drawn_cluster_envs(
    source: TraceSource, seed: int, k: int, worker: int, common: dict[str, Any]
) -> list[ClusterEnv]:
    """The environments of a ``clusters`` source: ``DRAWN_CLUSTERS`` clusters drawn with
    ``seed`` (the same in every sampler), each with the built-in job stream sized for it
    (``scaled_stream``: ``window`` jobs per 32 GPUs) at a load drawn per episode from
    ``DRAWN_LOADS``."""
    from autotune.envs.presets import drawn_cluster
    from autotune.envs.workloads import scaled_stream

    shapes = np.random.default_rng([seed, k, 7_919])
    envs: list[ClusterEnv] = []
    for c in range(DRAWN_CLUSTERS):
        nodes = drawn_cluster(shapes)
        gpus = sum(n.gpu_count for n in nodes)
        rng = np.random.default_rng([seed, worker, k, c])

        def jobs(rng: np.random.Generator = rng, gpus: int = gpus) -> list[Arrival]:
            load = rng.uniform(*DRAWN_LOADS)
            return scaled_stream(rng, gpus, window=source.window, load=load)

        envs.append(ClusterEnv(nodes=nodes, jobs=jobs, round_s=source.round_s, **common))
    return envs


def _cluster_env(source: TraceSource, rng: np.random.Generator, common: dict[str, Any]) -> Any:
    """The environment of a user's cluster (``TraceSource(kind="cluster")``): its nodes and
    calibration, the stream of its users' tasks, a queue of half a window at the start."""
    from autotune.catalog.clusters import load_cluster
    from autotune.envs.workloads import job_stream, task_mix

    if source.nodes is None:
        raise ValueError("a cluster source needs its cluster file")
    cluster = load_cluster(source.nodes)
    coeffs = cluster.coefficients
    task_coeffs = cluster.task_coefficients
    gpus = sum(n.gpu_count for n in cluster.nodes)
    mix, batches = task_mix([t.strip() for t in source.jobs.split(",") if t.strip()], gpus)

    def jobs() -> list[Arrival]:
        return list(
            job_stream(
                rng,
                mean_interarrival_s=source.round_s,
                initial_jobs=source.window // 2,
                max_jobs=source.window,
                mix=mix,
                batches=batches,
                coeffs=coeffs,
                task_coeffs=task_coeffs,
            )
        )

    return ClusterEnv(nodes=cluster.nodes, jobs=jobs, round_s=source.round_s, **common)


def _settings_from(config: dict[str, Any]) -> PPOSettings:
    data = {k: config[k] for k in PPOSettings.__dataclass_fields__ if k in config}
    data["sources"] = tuple(
        s if isinstance(s, TraceSource) else TraceSource(**s) for s in data.get("sources", ())
    )
    return PPOSettings(**data)


def module_dir(checkpoint: str | Path) -> Path:
    """The RLModule folder of an algorithm checkpoint, or ``checkpoint`` itself when it
    already is one."""
    path = Path(checkpoint)
    return path / MODULE_PATH if (path / MODULE_PATH).is_dir() else path


# -- behaviour cloning ---------------------------------------------------------------


def _demonstrations(settings: PPOSettings, teacher_name: str, episodes: int) -> Demonstrations:
    """Observations, teacher actions, a mask of slots whose config the teacher set, and
    the discounted return from each observation on (the training reward, ``gamma``):
    the critic's target, so that PPO starts with a value function that fits the policy
    it starts from."""
    from autotune.policies.baselines import make_policy

    env = make_train_env({**asdict(settings), "reward_scale": 1.0})
    if env.world is not None:
        if teacher_name not in env.world.teachers:
            raise ValueError(
                f"warm start {teacher_name!r}: the {env.world.kind} world imitates "
                f"{', '.join(env.world.teachers)}"
            )
        return env.world.demonstrations(settings, env.envs, teacher_name, episodes)
    recorder = DemonstrationRecorder(settings)
    for episode in range(episodes):
        obs, _ = env.reset(seed=settings.seed * 10_000 + episode)
        inner = env.current
        teacher = make_policy(teacher_name, inner, settings.seed + episode)
        recorder.play(inner, obs, partial(_config_round, teacher, settings.slots))
    return recorder.arrays()


def _config_round(teacher: Policy, slots: int, snapshot: ClusterSnapshot) -> TeacherRound:
    """A default-world teacher's round: every slot job's config it chose (the mask set),
    or the job's current config kept (``change=False``)."""
    width = len(ACTION_DIMS)
    choices = teacher.decide(snapshot).choices
    action = np.zeros(width * slots, dtype=np.int64)
    decided = np.zeros(slots, dtype=np.float32)
    for slot, job in enumerate(slot_jobs(snapshot, slots)):
        choice = choices.get(job.spec.job_id)
        if choice is not None and choice.config is not None:
            action[slot * width : (slot + 1) * width] = encode_config(choice.config, job.spec)
            decided[slot] = 1.0
        elif job.config is not None:
            action[slot * width : (slot + 1) * width] = encode_config(
                job.config, job.spec, change=False
            )
    return choices, action, decided


TeacherRound = tuple[Mapping[str, PolicyChoice], np.ndarray, np.ndarray]
"""One round of a teacher: its choices, the action that encodes them, and the mask of
slots whose action it set."""


class DemonstrationRecorder:
    """A teacher's episodes as imitation data (``Demonstrations``): each round's
    observation, the teacher's action and mask, and the discounted return from it on
    (the training reward, ``gamma``): the critic's target. The default world and a
    study's (``World.demonstrations``) record through it."""

    def __init__(self, settings: PPOSettings) -> None:
        self.settings = settings
        self._obs: list[np.ndarray] = []
        self._actions: list[np.ndarray] = []
        self._masks: list[np.ndarray] = []
        self._returns: list[float] = []

    def play(
        self, env: PlayedEnv, obs: np.ndarray, teach: Callable[[ClusterSnapshot], TeacherRound]
    ) -> None:
        """One episode of ``env`` from ``obs`` (its reset observation) to its end, the
        teacher ``teach`` choosing every round."""
        rewards: list[float] = []
        while True:
            snapshot = env.snapshot
            assert snapshot is not None
            choices, action, mask = teach(snapshot)
            self._obs.append(obs)
            self._actions.append(action)
            self._masks.append(mask)
            obs, reward, terminated, truncated, _ = env.step_choices(choices)
            rewards.append(float(reward) * self.settings.reward_scale)
            if terminated or truncated:
                break
        self._returns.extend(discounted(rewards, self.settings.gamma))

    def arrays(self) -> Demonstrations:
        """Observations, actions, masks and returns, stacked."""
        return (
            np.stack(self._obs),
            np.stack(self._actions),
            np.stack(self._masks),
            np.asarray(self._returns, dtype=np.float32),
        )


def discounted(rewards: Sequence[float], gamma: float) -> list[float]:
    """The discounted return from each step of an episode on."""
    future = 0.0
    returns = []
    for r in reversed(rewards):
        future = r + gamma * future
        returns.append(future)
    return returns[::-1]


def behaviour_clone(
    module: SlotPolicyModule,
    demos: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    *,
    epochs: int,
    seed: int,
    lr: float = 3e-3,
) -> float:
    """Fit the module's policy to the teacher's actions (cross-entropy per action entry:
    the keep/change bit on every running job's slot, the config entries where the teacher
    set one), and the critic to the teacher's discounted returns (squared error). Returns the
    final loss."""
    obs = torch.from_numpy(demos[0]).float()
    if module.continuous:
        return _clone_means(module, demos, epochs=epochs, seed=seed, lr=lr)
    actions = torch.from_numpy(demos[1]).long().reshape(len(obs), -1, len(ACTION_DIMS))
    decided = torch.from_numpy(demos[2]).float()
    returns = torch.from_numpy(demos[3]).float()
    scale = float(returns.var()) + 1e-6 if len(returns) > 1 else 1.0
    slot_features = obs[:, GLOBAL_FEATURES:].reshape(len(obs), -1, SLOT_FEATURES)
    # The keep/change entry matters for running jobs only (a waiting one is configured).
    running = slot_features[:, :, 1]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    loss_value = math.nan
    for _ in range(epochs):
        order = torch.randperm(len(obs), generator=generator)
        for start in range(0, len(obs), 256):
            idx = order[start : start + 256]
            out = module._forward({Columns.OBS: obs[idx]})[Columns.ACTION_DIST_INPUTS]
            values = module.compute_values({Columns.OBS: obs[idx]})
            parts = torch.split(out.reshape(len(idx), -1, N_LOGITS), list(ACTION_DIMS), dim=-1)
            # The critic's loss in units of the returns' variance, next to cross-entropies.
            loss = nn.functional.mse_loss(values, returns[idx]) / scale
            for k, part in enumerate(parts):
                ce = nn.functional.cross_entropy(
                    part.reshape(-1, part.shape[-1]),
                    actions[idx][:, :, k].reshape(-1),
                    reduction="none",
                ).reshape(len(idx), -1)
                mask = running[idx] if k == 0 else decided[idx]
                loss = loss + (ce * mask).sum() / mask.sum().clamp(min=1.0)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            loss_value = float(loss.detach())
    return loss_value


def _clone_means(
    module: SlotPolicyModule,
    demos: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    *,
    epochs: int,
    seed: int,
    lr: float,
) -> float:
    """``behaviour_clone`` for a continuous action: the Gaussian's mean fitted to the
    teacher's action on occupied slots (squared error), the log-std left as it is, the
    critic as in the discrete case."""
    obs = torch.from_numpy(demos[0]).float()
    target = torch.from_numpy(demos[1]).float()
    occupied = torch.from_numpy(demos[2]).float()
    returns = torch.from_numpy(demos[3]).float()
    scale = float(returns.var()) + 1e-6 if len(returns) > 1 else 1.0
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    loss_value = math.nan
    slots = target.shape[1]
    for _ in range(epochs):
        order = torch.randperm(len(obs), generator=generator)
        for start in range(0, len(obs), 256):
            idx = order[start : start + 256]
            out = module._forward({Columns.OBS: obs[idx]})[Columns.ACTION_DIST_INPUTS]
            means = out[:, :slots]
            values = module.compute_values({Columns.OBS: obs[idx]})
            mask = occupied[idx]
            fit = (((means - target[idx]) ** 2) * mask).sum() / mask.sum().clamp(min=1.0)
            loss = fit + nn.functional.mse_loss(values, returns[idx]) / scale
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_value = float(fit.detach())
    return loss_value


# -- training ------------------------------------------------------------------------


def build_config(settings: PPOSettings) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.tune.registry import register_env

    register_env(ENV_NAME, make_train_env)
    return (
        PPOConfig()  # type: ignore[no-untyped-call]
        .environment(ENV_NAME, env_config=asdict(settings))
        .framework("torch")
        .env_runners(
            num_env_runners=settings.env_runners,
            num_envs_per_env_runner=settings.envs_per_runner,
        )
        .learners(num_learners=0)
        .rl_module(
            rl_module_spec=RLModuleSpec(
                module_class=SlotPolicyModule, model_config=_model_config(settings)
            )
        )
        .training(
            lr=settings.lr,
            entropy_coeff=settings.entropy_coeff,
            train_batch_size_per_learner=settings.train_batch,
            minibatch_size=settings.minibatch,
            num_epochs=settings.epochs,
            gamma=settings.gamma,
            vf_clip_param=100.0,
        )
        .debugging(seed=settings.seed, log_level="ERROR")
        .reporting(metrics_num_episodes_for_smoothing=20)
    )


def _model_config(settings: PPOSettings) -> dict[str, Any]:
    """The ``SlotPolicyModule``'s ``model_config`` of ``settings``."""
    return {"hidden": settings.hidden, "pooled": settings.pooled}


def _save_beside(module: Path, settings: PPOSettings) -> None:
    """What the sources' study's world needs beside a trained module."""
    studied = {world(s.kind) for s in settings.sources} - {None}
    for found in studied:
        assert found is not None
        found.save_beside(module, settings)


def train_ppo(
    settings: PPOSettings,
    out: str | Path,
    *,
    progress: Callable[[int, int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Train and write checkpoints under ``out`` (``iter_NNNN`` every
    ``settings.checkpoint_every`` iterations and ``final``); returns a report."""
    import ray

    torch.set_num_threads(1)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report: dict[str, Any] = {"settings": asdict(settings), "history": []}
    started_ray = ensure_ray(num_cpus=max(2, settings.env_runners + 1))
    try:
        algo = build_config(settings).build_algo()
        if settings.init_module and not settings.warm_start:
            algo.restore_from_path(module_dir(settings.init_module), component=str(MODULE_PATH))
            report["init_module"] = settings.init_module
        elif settings.warm_start:
            demos = _demonstrations(settings, settings.warm_start, settings.warm_start_episodes)
            module = SlotPolicyModule(
                observation_space=algo.get_module().observation_space,
                action_space=algo.get_module().action_space,
                model_config=_model_config(settings),
            )
            if settings.init_module:
                # Imitation starts from these weights (any slot count: they are shared).
                from ray.rllib.core.rl_module.rl_module import RLModule

                start = RLModule.from_checkpoint(module_dir(settings.init_module))
                module.set_state(start.get_state())
                report["init_module"] = settings.init_module
            loss = behaviour_clone(
                module, demos, epochs=settings.warm_start_epochs, seed=settings.seed
            )
            warm = out / "warm_start"
            module.save_to_path(warm)
            _save_beside(warm, settings)
            algo.restore_from_path(warm, component=str(MODULE_PATH))
            report["warm_start"] = {
                "teacher": settings.warm_start,
                "samples": len(demos[0]),
                "loss": loss,
            }
        for i in range(1, settings.iterations + 1):
            result = algo.train()
            runners = result.get("env_runners", {})
            row = {
                "iteration": i,
                "episode_return_mean": float(runners.get("episode_return_mean", math.nan)),
                "episode_len_mean": float(runners.get("episode_len_mean", math.nan)),
                "env_steps": float(runners.get("num_env_steps_sampled_lifetime", math.nan)),
                "time_s": time.perf_counter() - started,
            }
            report["history"].append(row)
            if progress:
                progress(i, settings.iterations, row)
            if i % settings.checkpoint_every == 0 and i < settings.iterations:
                algo.save_to_path(out / f"iter_{i:04d}")
                _save_beside(out / f"iter_{i:04d}" / MODULE_PATH, settings)
        final = out / "final"
        if final.exists():
            shutil.rmtree(final)
        algo.save_to_path(final)
        _save_beside(final / MODULE_PATH, settings)
        algo.stop()
    finally:
        if started_ray:
            ray.shutdown()
    report["checkpoint"] = str(final)
    report["module"] = str(final / MODULE_PATH)
    report["time_s"] = time.perf_counter() - started
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report
