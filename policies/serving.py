"""Serving the learned policy: load an RLModule checkpoint once, then compute
deterministic actions (``forward_inference``, the most likely value of each action entry)
for one decision round at a time.

- ``PolicyServer``: observation in, action out; checks at load time that the module fits
  the environment's spaces (``IncompatiblePolicyError`` otherwise).
- ``LearnedPolicy``: the daemon's ``Policy``, and the ``ppo`` row of ``autotune eval``.
  It encodes the ``ClusterSnapshot`` with the environment's encoder and decodes each
  slot's action with the environment's decoder (``autotune.envs.spaces``). When the
  checkpoint is missing or incompatible it decides with the ``rules`` policy instead,
  logs why (``policy.fallback``) and marks its choices with ``source="fallback"``.

Ray is imported (for ``RLModule.from_checkpoint``) only when a checkpoint is loaded.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from autotune import __version__
from autotune.core import DEFAULT_ROUND_S
from autotune.daemon.log import event
from autotune.envs.spaces import (
    ACTION_DIMS,
    HEADER,
    SLOT,
    ObservationEncoder,
    decode_slot,
    observation_size,
    queue_order,
    wait_choices,
)
from autotune.errors import InputError
from autotune.interfaces import ClusterSnapshot, PolicyChoice

__all__ = [
    "IncompatiblePolicyError",
    "LearnedPolicy",
    "PolicyServer",
    "default_policy_checkpoint",
]


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
        obs_size = observation_size(slots)
        obs_space = getattr(module, "observation_space", None)
        act_space = getattr(module, "action_space", None)
        obs_shape = tuple(getattr(obs_space, "shape", ()) or ())
        nvec = [int(n) for n in getattr(act_space, "nvec", ())]
        if isinstance(module, SlotPolicyModule):
            # Shared across slots: any slot count, but the same per-slot layout.
            ok = (
                len(obs_shape) == 1
                and obs_shape[0] > HEADER
                and (obs_shape[0] - HEADER) % len(SLOT) == 0
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


class LearnedPolicy:
    """The daemon's ``Policy`` backed by a ``PolicyServer``, with ``rules`` as the named
    fallback: for every job when the checkpoint cannot load, for one job when its slot
    cannot be decoded (that job alone is decided by rules, ``source="fallback"``, with
    the reason).

    It encodes the snapshot with the environment's ``ObservationEncoder`` (one per
    cluster: it remembers the busy share of earlier rounds for the forecast) and decodes
    the action with the environment's decoder, so the daemon serves exactly what the
    environment trained. ``round_s`` is the decision round period
    (``autotune.daemon.settings.Settings.round_s``)."""

    name = "ppo"

    def __init__(
        self,
        checkpoint: str | Path | None = None,
        *,
        slots: int = 32,
        round_s: float = DEFAULT_ROUND_S,
        forecast: bool = True,
        server: PolicyServer | None = None,
    ) -> None:
        """``server``: an already loaded checkpoint (``checkpoint`` is then ignored)."""
        from autotune.policies.rules import RulesPolicy

        self.slots = slots
        self.fallback_reason: str | None = None
        self.server = server
        try:
            if self.server is None:
                self.server = PolicyServer(checkpoint, slots=slots)
        except IncompatiblePolicyError as exc:
            self.fallback_reason = str(exc)
            event("policy.fallback", level=30, policy="ppo", fallback="rules", reason=str(exc))
        self.rules = RulesPolicy()
        self.version = f"ppo-{__version__}" if self.server else f"ppo-fallback-rules-{__version__}"
        forecaster: Any = None
        if forecast and self.server is not None:
            from autotune.policies.forecast import EnvForecast

            forecaster = EnvForecast()
        self.encoder = ObservationEncoder(slots, round_s=round_s, forecaster=forecaster)

    def _fallback(
        self, snapshot: ClusterSnapshot, job_ids: set[str] | None, why: str
    ) -> dict[str, PolicyChoice]:
        return {
            job_id: PolicyChoice(
                config=choice.config,
                reason=f"fallback to rules ({why}): {choice.reason}",
                features=choice.features,
                source="fallback",
            )
            for job_id, choice in self.rules.decide(snapshot).items()
            if job_ids is None or job_id in job_ids
        }

    def decide(self, snapshot: ClusterSnapshot) -> dict[str, PolicyChoice]:
        if self.server is None:
            return self._fallback(snapshot, None, self.fallback_reason or "no policy")
        obs = self.encoder.encode(snapshot)
        forecast = float(obs[5])
        try:
            action = self.server.act(obs)
        except Exception as exc:  # the module itself failed: every job falls back
            why = f"the policy failed: {type(exc).__name__}: {exc}"
            event("policy.error", level=40, policy=self.version, error=why)
            return self._fallback(snapshot, None, why)
        width = len(ACTION_DIMS)
        choices: dict[str, PolicyChoice] = {}
        failed: dict[str, str] = {}
        active = queue_order(snapshot)
        for slot, job in enumerate(active[: self.slots]):
            try:
                choice = decode_slot(action[slot * width : (slot + 1) * width], job, slot)
            except ValueError as exc:  # this job's entries make no config for it
                failed[job.spec.job_id] = f"{type(exc).__name__}: {exc}"
                continue
            if choice is not None:
                choices[job.spec.job_id] = PolicyChoice(
                    config=choice.config,
                    reason=choice.reason,
                    features={**choice.features, "forecast": forecast},
                )
        choices.update(wait_choices(active, self.slots))
        for job_id, why in failed.items():
            event("policy.error", level=30, policy=self.version, job=job_id, error=why)
            fallback = self._fallback(snapshot, {job_id}, why)
            choices.update(fallback)
        return choices
