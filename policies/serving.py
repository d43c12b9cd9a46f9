"""Serving the learned policy: load an RLModule checkpoint once, then compute
deterministic actions (``forward_inference``, the most likely value of each action entry)
for one decision round at a time.

- ``PolicyServer``: observation in, action out; checks at load time that the module fits
  the environment's spaces (``IncompatiblePolicyError`` otherwise).
- ``PPOSimPolicy``: the server as a simulator baseline (``autotune eval --policies ppo``).
- ``LearnedPolicy``: the daemon's ``Policy``. It builds the environment's observation
  from the daemon's ``ClusterSnapshot`` and turns each slot's action into a
  ``JobConfig``. When the checkpoint is missing or incompatible it decides with the
  ``rules`` policy instead, logs why (``policy.fallback``) and marks its choices with
  ``source="fallback"``.

Ray is imported (for ``RLModule.from_checkpoint``) only when a checkpoint is loaded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np

from autotune import __version__
from autotune.catalog.devices import device
from autotune.core import ACTIVE_STATES, JobConfig, JobSpec, NodeInfo
from autotune.daemon.log import event
from autotune.envs.cluster_env import (
    ACTION_DIMS,
    GLOBAL_FEATURES,
    MAX_GPU_TYPES,
    SLOT_FEATURES,
    ClusterEnv,
    decode_action,
)
from autotune.envs.simulator import (
    BATCH_SCALES,
    COMPRESSIONS,
    GPU_OPTIONS,
    LAYOUT_MODES,
    N_LAYOUTS,
    PRECISIONS,
    Job,
    job_config,
)
from autotune.errors import InputError
from autotune.interfaces import ClusterSnapshot, JobStatus, PolicyChoice
from autotune.perf.model import DEFAULT_COEFFICIENTS

__all__ = [
    "IncompatiblePolicyError",
    "LearnedPolicy",
    "PPOSimPolicy",
    "PolicyServer",
    "default_policy_checkpoint",
    "snapshot_observation",
]

_UNIT_BATCH: Final = BATCH_SCALES.index(1.0)


class IncompatiblePolicyError(InputError):
    """The checkpoint is missing, unreadable or does not fit the environment."""


def default_policy_checkpoint() -> Path:
    """The policy shipped in the package (an RLModule folder)."""
    return Path(str(resources.files("autotune") / "data" / "policy"))


class PolicyServer:
    """A loaded RLModule that acts for ``slots`` job slots."""

    def __init__(self, checkpoint: str | Path | None = None, *, slots: int = 32) -> None:
        import torch

        from autotune.policies.ppo import SlotPolicyModule, module_dir

        path = module_dir(checkpoint or default_policy_checkpoint())
        self.path = path
        self.slots = slots
        if not path.is_dir():
            raise IncompatiblePolicyError("no policy checkpoint here", path=str(path))
        try:
            from ray.rllib.core.rl_module.rl_module import RLModule

            module = RLModule.from_checkpoint(path)
        except Exception as exc:  # anything RLlib raises on a bad folder
            raise IncompatiblePolicyError(
                f"cannot load an RLModule: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                path=str(path),
            ) from None
        obs_size = GLOBAL_FEATURES + slots * SLOT_FEATURES
        obs_space = getattr(module, "observation_space", None)
        act_space = getattr(module, "action_space", None)
        obs_shape = tuple(getattr(obs_space, "shape", ()) or ())
        nvec = [int(n) for n in getattr(act_space, "nvec", ())]
        if isinstance(module, SlotPolicyModule):
            # Shared across slots: any slot count, but the same per-slot layout.
            ok = (
                len(obs_shape) == 1
                and (obs_shape[0] - GLOBAL_FEATURES) % SLOT_FEATURES == 0
                and nvec[: len(ACTION_DIMS)] == list(ACTION_DIMS)
            )
        else:
            ok = obs_shape == (obs_size,) and nvec == list(ACTION_DIMS) * slots
        if not ok:
            raise IncompatiblePolicyError(
                f"the module's spaces (observation {obs_shape}, action {nvec[:10]}...) do "
                f"not fit the environment's (observation ({obs_size},), action "
                f"{list(ACTION_DIMS)} per slot)",
                path=str(path),
            )
        if isinstance(module, SlotPolicyModule):
            missing = _missing_policy_weights(path, module)
            if missing:
                raise IncompatiblePolicyError(
                    f"the checkpoint lacks the policy's weights {missing[:3]}", path=str(path)
                )
        self.module = module
        self.shared = isinstance(module, SlotPolicyModule)
        self._torch = torch

    def act(self, observation: np.ndarray) -> np.ndarray:
        """The deterministic action for one observation."""
        from ray.rllib.core.columns import Columns

        from autotune.policies.ppo import N_LOGITS, greedy_actions

        torch = self._torch
        with torch.inference_mode():
            obs = torch.from_numpy(np.asarray(observation, dtype=np.float32)[None, :])
            logits = self.module.forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
            action = greedy_actions(logits.reshape(1, -1, N_LOGITS))
        out: np.ndarray = action[0].numpy().astype(np.int64)
        return out


def _missing_policy_weights(path: Path, module: Any) -> list[str]:
    """Weights the policy acts with (encoder, logits) that the saved state lacks; RLlib
    loads a partial state without complaint."""
    import pickle

    files = sorted(path.glob("module_state.*"))
    if not files or files[0].suffix != ".pkl":
        return []  # another format: RLlib has already read it
    with files[0].open("rb") as f:
        saved = pickle.load(f)
    needed = [k for k in module.state_dict() if k.startswith(("encoder.", "logits."))]
    return [k for k in needed if k not in saved]


class PPOSimPolicy:
    """The learned policy as a simulator baseline. Unless the env has a forecaster of its
    own, the policy fills the observation's forecast entry with the shipped LSTM's, as
    in training."""

    name = "ppo"
    queue_order = "fifo"

    def __init__(
        self, checkpoint: str | Path | None = None, *, slots: int = 32, forecast: bool = True
    ) -> None:
        self.server = PolicyServer(checkpoint, slots=slots)
        self._forecaster: Any = None
        if forecast:
            from autotune.policies.forecast import EnvForecast

            self._forecaster = EnvForecast()
        self._busy: list[float] = []

    def act(self, env: ClusterEnv, observation: np.ndarray) -> np.ndarray:
        if self._forecaster is not None and env.forecaster is None and env.sim is not None:
            if env.steps == 0:
                self._busy = []
            g = GLOBAL_FEATURES - 4
            self._busy.append(float(observation[g + 2]))
            observation = observation.copy()
            observation[g + 3] = self._forecaster(
                self._busy, env.sim.config.interval_s, env.sim.now
            )
        return self.server.act(observation)


# -- the daemon's view ---------------------------------------------------------------


def _requested(spec: JobSpec) -> int:
    """The GPUs a job asks for: half its elastic maximum, at least its minimum."""
    return max(spec.min_gpus, spec.max_gpus // 2)


def _as_job(spec: JobSpec) -> Job:
    model = spec.model
    if model is None:
        raise ValueError(f"job {spec.job_id} has no model profile")
    return Job(
        job_id=spec.job_id,
        model=model,
        coeffs=DEFAULT_COEFFICIENTS,
        submit_s=spec.submitted_at,
        work=0.0,
        duration_s=3600.0,
        base_batch=spec.global_batch,
        requested_gpus=_requested(spec),
        min_gpus=spec.min_gpus,
        max_gpus=spec.max_gpus,
    )


def _choice_indices(config: JobConfig | None) -> tuple[float, float, float, float]:
    """The current config as the env's normalised action entries (defaults if none)."""
    if config is None:
        return 0.0, 0.0, 0.0, _UNIT_BATCH / (len(BATCH_SCALES) - 1)
    comp = COMPRESSIONS.index(config.compression) if config.compression in COMPRESSIONS else 0
    prec = PRECISIONS.index(config.precision) if config.precision in PRECISIONS else 0
    layout = config.layout
    g = max(i for i, n in enumerate(GPU_OPTIONS) if n <= max(1, layout.world_size))
    mode = 1 if layout.tp > 1 else 2 if layout.pp > 1 else 0
    return (
        comp / (len(COMPRESSIONS) - 1),
        prec / (len(PRECISIONS) - 1),
        (g * len(LAYOUT_MODES) + mode) / (N_LAYOUTS - 1),
        _UNIT_BATCH / (len(BATCH_SCALES) - 1),
    )


def _gpu_models(nodes: Sequence[NodeInfo]) -> list[str]:
    return sorted(
        {n.gpu_model for n in nodes if n.gpu_count > 0},
        key=lambda m: (-device(m).peak_tflops.get("bf16", device(m).peak_tflops["fp32"]), m),
    )


def snapshot_observation(
    snapshot: ClusterSnapshot,
    slots: int,
    *,
    last_busy: float,
    forecast: float | None,
) -> tuple[np.ndarray, list[JobStatus]]:
    """The environment's observation of a daemon snapshot, and the jobs in its slots
    (pending and running, by submission)."""
    obs = np.zeros(GLOBAL_FEATURES + slots * SLOT_FEATURES, dtype=np.float32)
    nodes = [n for n in snapshot.nodes if n.gpu_count > 0]
    total = float(sum(n.gpu_count for n in nodes)) or 1.0
    models = _gpu_models(nodes)
    held: dict[str, int] = {}
    for job in snapshot.by_state("running"):
        if job.placement is not None:
            for rank in job.placement.ranks:
                held[rank.node_id] = held.get(rank.node_id, 0) + 1
    node_model = {n.node_id: n.gpu_model for n in nodes}
    for i, gpu in enumerate(models[:MAX_GPU_TYPES]):
        count = sum(n.gpu_count for n in nodes if n.gpu_model == gpu)
        used = sum(v for k, v in held.items() if node_model.get(k) == gpu)
        obs[2 * i] = count / total
        obs[2 * i + 1] = max(0, count - used) / total
    active = sorted(snapshot.by_state(*ACTIVE_STATES), key=lambda j: j.spec.submitted_at)
    g = MAX_GPU_TYPES * 2
    busy = sum(held.values()) / total
    obs[g] = len(active) / slots
    obs[g + 1] = last_busy
    obs[g + 2] = busy
    obs[g + 3] = forecast if forecast is not None else busy
    for slot, job in enumerate(active[:slots]):
        spec = job.spec
        model = spec.model
        running = job.state == "running"
        gpus = job.placement.world_size if (running and job.placement is not None) else 0
        waiting = 0.0 if running else max(0.0, snapshot.time_s - spec.submitted_at)
        gpu_model = ""
        if running and job.placement is not None and job.placement.ranks:
            gpu_model = node_model.get(job.placement.ranks[0].node_id, "")
        base = GLOBAL_FEATURES + slot * SLOT_FEATURES
        obs[base : base + SLOT_FEATURES] = (
            1.0,
            float(running),
            math.log1p(waiting / 3600),
            math.log10(model.parameters) / 10 if model else 0.0,
            math.log10(model.flops_per_sample) / 15 if model else 0.0,
            float(model is not None and model.hidden_size > 0),
            _requested(spec) / 64,
            gpus / 64,
            *_choice_indices(job.config),
            1.0 / 8 if running else 0.0,
            job.progress,
            0.0,
            (models.index(gpu_model) + 1) / MAX_GPU_TYPES if gpu_model in models else 0.0,
        )
    return obs, active[:slots]


class LearnedPolicy:
    """The daemon's ``Policy`` backed by a ``PolicyServer``, with ``rules`` as the
    named fallback."""

    name = "ppo"

    def __init__(
        self, checkpoint: str | Path | None = None, *, slots: int = 32, forecast: bool = True
    ) -> None:
        from autotune.policies.rules import RulesPolicy

        self.slots = slots
        self.fallback_reason: str | None = None
        self.server: PolicyServer | None = None
        try:
            self.server = PolicyServer(checkpoint, slots=slots)
        except IncompatiblePolicyError as exc:
            self.fallback_reason = str(exc)
            event("policy.fallback", level=30, policy="ppo", fallback="rules", reason=str(exc))
        self.rules = RulesPolicy()
        self.version = f"ppo-{__version__}" if self.server else f"ppo-fallback-rules-{__version__}"
        self._forecaster: Any = None
        if forecast and self.server is not None:
            from autotune.policies.forecast import EnvForecast

            self._forecaster = EnvForecast()
        self._busy: list[float] = []
        self._last_time: float | None = None

    def decide(self, snapshot: ClusterSnapshot) -> dict[str, PolicyChoice]:
        if self.server is None:
            return {
                job_id: PolicyChoice(
                    config=choice.config,
                    reason=f"fallback to rules ({self.fallback_reason}): {choice.reason}",
                    features=choice.features,
                    source="fallback",
                )
                for job_id, choice in self.rules.decide(snapshot).items()
            }
        interval = (
            snapshot.time_s - self._last_time
            if self._last_time is not None and snapshot.time_s > self._last_time
            else 300.0
        )
        self._last_time = snapshot.time_s
        last_busy = self._busy[-1] if self._busy else 0.0
        total = sum(n.gpu_count for n in snapshot.nodes) or 1
        held = sum(
            j.placement.world_size for j in snapshot.by_state("running") if j.placement is not None
        )
        self._busy.append(held / total)
        forecast = (
            self._forecaster(self._busy, interval, snapshot.time_s) if self._forecaster else None
        )
        obs, jobs = snapshot_observation(
            snapshot, self.slots, last_busy=last_busy, forecast=forecast
        )
        action = self.server.act(obs)
        choices: dict[str, PolicyChoice] = {}
        for slot, job in enumerate(jobs):
            choice, _change = decode_action(action, slot)
            if job.state == "running" or job.spec.model is None:
                continue  # as with rules, running jobs keep their config
            config, _ = job_config(_as_job(job.spec), choice)
            choices[job.spec.job_id] = PolicyChoice(
                config=config,
                reason=(
                    f"ppo: {config.layout.world_size} GPUs (dp {config.layout.dp}, "
                    f"tp {config.layout.tp}, pp {config.layout.pp}), "
                    f"{config.compression.kind} compression"
                ),
                features={"slot": float(slot), "forecast": float(obs[GLOBAL_FEATURES - 1])},
            )
        return choices
